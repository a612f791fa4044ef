"""``/metrics`` negotiation shared by the exporter and the worker (``gpuscope.exposition``)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from gpuscope.exposition import choose_format, gzip_wanted


@pytest.mark.parametrize(
    ("accept_encoding", "wanted"),
    [
        ("gzip", True),
        ("GZIP", True),
        ("deflate, gzip;q=0.5", True),
        ("gzip ; q=1.0", True),
        ("gzip;q=0", False),  # prometheus_client's gzip_accepted says True
        ("gzip;q=0.000", False),
        ("gzip;q=oops", False),
        ("identity", False),
        ("", False),
        ("x-gzip", False),
    ],
)
def test_gzip_is_wanted_only_with_a_q_value_above_zero(accept_encoding: str, wanted: bool) -> None:
    assert gzip_wanted(accept_encoding) is wanted


@pytest.mark.parametrize(
    "accept",
    [
        "application/openmetrics-text; version=abc",  # prometheus_client raises on these
        "text/plain; version=x",
    ],
)
def test_an_unreadable_version_gets_the_text_format(accept: str) -> None:
    registry = CollectorRegistry()
    Counter("probe", "a counter", registry=registry).inc()
    encoder, content_type = choose_format(accept)
    assert content_type == CONTENT_TYPE_PLAIN_0_0_4
    assert b"probe_total 1.0" in encoder(registry)


def test_media_types_are_matched_without_regard_to_case() -> None:
    assert choose_format("Application/OpenMetrics-Text; Version=1.0.0")[1].startswith(
        "application/openmetrics-text"
    )
