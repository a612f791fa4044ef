"""The healthy demo against the shipped rules, under load and then idle, for as long as
their ``for:`` durations need (``make soak``, about 50 minutes; not part of ``make test``).

``gpuscope demo`` runs as a user runs it (exporter on a simulated GPU, worker with its
default batching, the demo's default load) for ``GPUSCOPE_SOAK_S`` seconds (1200 by
default), while a real Prometheus scrapes both every 15 s (as ``deploy/prometheus.yml``
does) with ``alerts/rules/*.yml`` as shipped (their group intervals, windows and
``for:``), alerting to a real Alertmanager with ``alerts/alertmanager.yml``. Then the
demo serves on with no load for ``GPUSCOPE_SOAK_IDLE_S`` seconds (by default as long as
an exporter's idle-spans window and its ``for:`` take, plus a margin): a quiet night,
when no request arrives and so no span either. A healthy service must page nobody in
either half: no alert may fire, and Alertmanager must have received nothing. The P99
batch wait, the verdicts Prometheus recorded and any alert that was pending for a
while are printed, per half.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuscope.children import free_port
from pack.settings import Settings, seconds_of
from support.prometheus_server import (
    instant_query,
    run_alertmanager,
    run_prometheus,
    wait_for_result,
)

REPO = Path(__file__).parents[2]
SOAK_S = int(os.environ.get("GPUSCOPE_SOAK_S", "1200"))
# The idle half lasts until an alert about spans no longer arriving would have fired:
# its window empties, then its ``for:`` runs, then a rule interval and a scrape pass.
_RULES = Settings()
IDLE_S = int(
    os.environ.get(
        "GPUSCOPE_SOAK_IDLE_S",
        seconds_of(_RULES.spans_idle_window) + seconds_of(_RULES.for_exporter_signals) + 180,
    )
)
# deploy/prometheus.yml's interval; the rule groups set their own evaluation intervals
SCRAPE_INTERVAL = "15s"
GPUSCOPE = Path(sys.executable).parent / "gpuscope"
VERDICT = "service_model_gpu:gpuscope_bottleneck:verdict"
BATCH_WAIT_P99 = 'service_model_gpu:gpuscope_request_phase_seconds:p99_5m{phase="batch_wait"}'

pytestmark = [pytest.mark.soak, pytest.mark.timeout(SOAK_S + IDLE_S + 900)]


async def _demo_until_serving(argv: list[str], timeout_s: float) -> tuple[Any, list[str]]:
    """Start the demo; return once its load step ended and it serves on (its report
    printed), with the lines it printed; fails when it exits instead."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert process.stdout is not None
    printed: list[str] = []
    async with asyncio.timeout(timeout_s):
        while line := (await process.stdout.readline()).decode():
            printed.append(line)
            if line.startswith("serving on"):
                return process, printed
    await process.wait()
    pytest.fail(f"the demo exited with {process.returncode}:\n{''.join(printed[-40:])}")


async def _stop(process: Any) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGINT)  # Ctrl-C: the demo stops its children
        await asyncio.wait_for(process.wait(), 60)


def _value(result: list[Any]) -> float | None:
    return float(result[0]["value"][1]) if result else None


async def _alerts(session: aiohttp.ClientSession, prometheus: str, span: str) -> list[Any]:
    """Every alert series of the last ``span``, with the evaluations each lasted."""
    return await instant_query(session, prometheus, f"count_over_time(ALERTS[{span}])")


def _report(half: str, ever: list[Any]) -> list[str]:
    """Print each alert series of a half; return the alerts that fired. Pending is
    reported, not failed: a condition that does not last its ``for:`` is what ``for:``
    is there to absorb. Firing, or reaching Alertmanager, is a page."""
    for alert in ever:
        labels = alert["metric"]
        print(
            f"{half}: {labels['alertname']} {labels['alertstate']}: {alert['value'][1]} evaluations"
        )
    states = sorted({(a["metric"]["alertname"], a["metric"]["alertstate"]) for a in ever})
    return [name for name, state in states if state == "firing"]


async def _idle(session: aiohttp.ClientSession, prometheus: str) -> tuple[list[Any], str]:
    """The idle half: no load for ``IDLE_S``, or until an alert fires (returned, with
    the span of Prometheus time the half lasted, for range queries over it alone)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    firing: list[Any] = []
    while (left := start + IDLE_S - loop.time()) > 0:
        firing = await instant_query(session, prometheus, 'ALERTS{alertstate="firing"}')
        if firing:
            break
        await asyncio.sleep(min(30.0, left))
    return firing, f"{max(1, int(loop.time() - start))}s"


async def test_the_healthy_demo_fires_nothing_under_the_shipped_rules(tmp_path: Path) -> None:
    exporter_port, worker_port = free_port(), free_port()
    rule_files = sorted((REPO / "alerts" / "rules").glob("*.yml"))
    async with (
        run_alertmanager(REPO / "alerts" / "alertmanager.yml", tmp_path) as alertmanager,
        run_prometheus(
            [f"127.0.0.1:{exporter_port}"],
            tmp_path,
            SCRAPE_INTERVAL,
            rule_files=rule_files,
            alertmanager=alertmanager,
            job="gpuscope",
            more_jobs={"gpuscope-worker": [f"127.0.0.1:{worker_port}"]},
        ) as prometheus,
        aiohttp.ClientSession() as session,
    ):
        argv = [str(GPUSCOPE), "demo", "--duration-s", str(SOAK_S)]
        argv += ["--exporter-port", str(exporter_port), "--worker-port", str(worker_port)]
        process, printed = await _demo_until_serving(argv, SOAK_S + 300)
        try:
            span = f"[{SOAK_S + 120}s]"
            # The rules had data throughout: the batch-wait P99 and the verdict were
            # recorded for most of the run (a 5-minute window fills first).
            evaluations = _value(
                await instant_query(session, prometheus, f"count_over_time({BATCH_WAIT_P99}{span})")
            )
            verdicts = await wait_for_result(
                session,
                prometheus,
                f"sum by (cause) (count_over_time({VERDICT}{span}))",
            )
            peak = _value(
                await instant_query(session, prometheus, f"max_over_time({BATCH_WAIT_P99}{span})")
            )
            loaded = await _alerts(session, prometheus, f"{SOAK_S + 120}s")
            async with session.get(alertmanager + "/api/v2/alerts") as response:
                received_loaded = await response.json()
            # the idle half: the demo serves on, nothing loads it
            fired_idle, idle_span = await _idle(session, prometheus)
            idle = await _alerts(session, prometheus, idle_span)
            # it was idle: no request reached the worker (and so no span the exporter)
            counted = []
            for counter in ("gpuscope_worker_requests_total", "gpuscope_spans_received_total"):
                query = f"sum(increase({counter}[{idle_span}]))"
                counted.append(_value(await instant_query(session, prometheus, query)))
            arrived, spans = counted
            async with session.get(alertmanager + "/api/v2/alerts") as response:
                received = await response.json()
        finally:
            await _stop(process)
    print("".join(printed[-6:]))
    print(f"batch-wait P99 recorded {evaluations} times, peak {peak}")
    print("verdict evaluations:", {v["metric"].get("cause"): v["value"][1] for v in verdicts})
    # a host short of CPU slows the demo into its objectives: say how busy it was
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"host load average (1, 5, 15 min) at the end: {load}")
    print(f"idle half: {idle_span}; requests that arrived in it: {arrived}, spans: {spans}")
    # at least half the evaluations of a run past the window's first 5 minutes
    assert evaluations is not None and evaluations >= (SOAK_S - 300) / 60, evaluations
    firing = _report("under load", loaded)
    assert firing == [], f"alerts fired on the healthy demo under load: {firing}"
    assert received_loaded == [], received_loaded
    firing = _report("idle", idle)
    fired_names = sorted({a["metric"]["alertname"] for a in fired_idle})
    assert firing == [] and fired_names == [], (
        f"alerts fired on the idle demo: {firing or fired_names}"
    )
    assert received == [], received
    assert arrived == 0, f"{arrived} requests arrived in the idle half"
