"""OpenMetrics ``# UNIT`` lines: every family whose name ends in a base unit declares it."""

from __future__ import annotations

import re

import aiohttp

from gpuscope.exporter.service import start_exporter
from support.exporter_fixtures import (
    FakeGpuSource,
    SpanFactory,
    encode,
    loopback_config,
    post_spans,
    samples,
    scrape,
)

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


async def test_openmetrics_declares_the_unit_of_every_family_that_has_one(
    exporter_http: aiohttp.ClientSession,
) -> None:
    exporter = await start_exporter(
        loopback_config(gpu_interval_s=0.05), gpu_source=FakeGpuSource()
    )
    try:
        span = SpanFactory().server(0.01, phases={"queue": 0.001})
        await post_spans(exporter_http, exporter, encode([span]).SerializeToString())
        text = await scrape(exporter_http, exporter, accept=OPENMETRICS)
        plain = await scrape(exporter_http, exporter)
    finally:
        await exporter.stop()
    units = dict(re.findall(r"^# UNIT (\S+) (\S+)$", text, re.M))
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert units["gpuscope_request_duration_seconds"] == "seconds"
    assert units["gpuscope_request_phase_seconds"] == "seconds"
    assert units["gpuscope_gpu_sm_clock_hertz"] == "hertz"
    assert units["gpuscope_gpu_utilization_ratio"] == "ratio"
    for name in types:  # every family named after a unit, and only those
        suffix = name.rsplit("_", 1)[-1]
        if suffix in ("seconds", "bytes", "joules", "hertz", "watts", "celsius", "ratio"):
            assert units.get(name) == suffix, name
        else:
            assert name not in units, name
    # prometheus_client's OpenMetrics parser refuses a unit that is not the name's suffix.
    assert samples(text, openmetrics=True)
    assert "# UNIT" not in plain  # the 0.0.4 text format has no unit lines
