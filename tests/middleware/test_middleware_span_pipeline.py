"""setup_tracing()'s span pipeline: every span accounted for, shutdown within its deadline."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from gpuscope.middleware import setup_tracing, stats
from gpuscope.middleware.span_pipeline import SHUTDOWN_RETRY_S, BoundedTracerProvider
from support.closing_endpoint import ClosingEndpoint, closing_endpoint
from support.waiting import wait_until

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

FATES = (
    stats.SPANS_EXPORTED,
    stats.SPANS_EXPORT_FAILED,
    stats.SPANS_DROPPED_QUEUE_FULL,
    stats.SPANS_DROPPED_SHUTDOWN,
)


@pytest.fixture
def refusing_url() -> Iterator[str]:
    """A loopback port that is bound but never listens: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1/traces"


def wait_idle(provider: BoundedTracerProvider) -> None:
    deadline = time.monotonic() + 30
    while not provider.pipeline.idle():
        assert time.monotonic() < deadline, "the export thread did not finish"
        time.sleep(0.01)


def test_every_span_is_exported_failed_or_dropped_when_the_endpoint_is_down(
    refusing_url: str,
) -> None:
    stats.reset()
    provider = setup_tracing(
        refusing_url,
        "svc",
        timeout_s=0.3,
        max_queue_size=64,
        max_export_batch_size=16,
        schedule_delay_ms=20,
        set_global=False,
    )
    tracer = provider.get_tracer("t")
    created = 2000
    for i in range(created):
        tracer.start_span(f"span-{i}").end()
    provider.shutdown(timeout_s=1.0)
    wait_idle(provider)
    counts = stats.snapshot()
    assert sum(counts[fate] for fate in FATES) == created, counts
    assert counts[stats.SPANS_EXPORTED] == 0
    assert counts[stats.SPANS_EXPORT_FAILED] > 0
    assert counts[stats.SPANS_DROPPED_QUEUE_FULL] > 0
    # After shutdown a span is dropped and counted, never queued.
    tracer.start_span("late").end()
    assert (
        stats.snapshot()[stats.SPANS_DROPPED_SHUTDOWN] == counts[stats.SPANS_DROPPED_SHUTDOWN] + 1
    )


def test_shutdown_keeps_to_its_deadline_while_retries_would_take_longer(refusing_url: str) -> None:
    stats.reset()
    # The exporter alone would retry each batch for 30 s.
    provider = setup_tracing(refusing_url, "svc", timeout_s=30.0, set_global=False)
    tracer = provider.get_tracer("t")
    for i in range(10):
        tracer.start_span(f"span-{i}").end()
    started = time.monotonic()
    provider.shutdown(timeout_s=1.0)
    elapsed = time.monotonic() - started
    assert elapsed < 10.0, f"shutdown took {elapsed:.1f} s with a 1 s deadline"
    wait_idle(provider)
    counts = stats.snapshot()
    assert sum(counts[fate] for fate in FATES) == 10, counts


def test_retries_stop_soon_after_shutdown_begins_whatever_the_deadline() -> None:
    """Before, a receiver gone with the process (a SIGKILLed demo's exporter) held the
    shutdown for its whole deadline (one batch's backoff alone is 7.75 s; 10 s here).
    Now failed exports are retried for ``SHUTDOWN_RETRY_S`` after shutdown begins, then
    each batch left gets one attempt."""
    with closing_endpoint() as endpoint:
        counts, elapsed = _shut_down_while_retrying(endpoint)
    assert elapsed < SHUTDOWN_RETRY_S + 1.5, f"shutdown took {elapsed:.1f} s"
    assert counts[stats.SPANS_EXPORT_FAILED] == 44, counts  # every batch was tried


def _shut_down_while_retrying(endpoint: ClosingEndpoint) -> tuple[dict[str, int], float]:
    stats.reset()
    provider = setup_tracing(
        endpoint.url,
        "svc",
        timeout_s=30.0,
        max_export_batch_size=4,
        schedule_delay_ms=10,
        set_global=False,
    )
    tracer = provider.get_tracer("t")
    for i in range(4):  # one batch, being retried when shutdown begins
        tracer.start_span(f"span-{i}").end()
    wait_until(lambda: endpoint.attempts >= 2, "the first batch's export tried again")
    for i in range(40):  # ten batches queued behind it
        tracer.start_span(f"later-{i}").end()
    started = time.monotonic()
    provider.shutdown(timeout_s=10.0)
    elapsed = time.monotonic() - started
    wait_idle(provider)
    return stats.snapshot(), elapsed


def test_the_counters_are_stable_and_scrapeable() -> None:
    stats.reset()
    assert {key: stats.snapshot()[key] for key in stats.STABLE_KEYS} == dict.fromkeys(
        stats.STABLE_KEYS, 0
    )
    stats.count(stats.SPANS_DROPPED_QUEUE_FULL, 3)
    stats.count("marks_out_of_order")
    registry = CollectorRegistry()
    stats.register(registry)
    sample = registry.get_sample_value
    assert sample("gpuscope_middleware_spans_dropped_queue_full_total") == 3
    assert sample("gpuscope_middleware_spans_exported_total") == 0
    assert sample("gpuscope_middleware_marks_out_of_order_total") == 1
    stats.count(stats.SPANS_EXPORTED, 5)  # read at scrape time, not at registration
    assert sample("gpuscope_middleware_spans_exported_total") == 5


FORKED_CHILD = """
import os, sys
from gpuscope.middleware import setup_tracing, stats

provider = setup_tracing(sys.argv[1], "svc", timeout_s=0.2, set_global=False)
pid = os.fork()
if pid == 0:  # the child exports through a thread of its own
    stats.reset()
    for i in range(5):
        provider.get_tracer("t").start_span(f"span-{i}").end()
    provider.shutdown(timeout_s=10.0)
    counts = stats.snapshot()
    os._exit(0 if counts["spans_export_failed"] == 5 else 1)
_, status = os.waitpid(pid, 0)
provider.shutdown(timeout_s=1.0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_exports_through_its_own_thread(refusing_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", FORKED_CHILD, refusing_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Without a thread of its own, the child's spans would all be dropped at shutdown.
    assert result.returncode == 0, result.stderr
