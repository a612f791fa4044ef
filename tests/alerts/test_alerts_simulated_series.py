"""``alerts/tests/simulated_gpus_test.yml`` feeds promtool the series the simulated GPUs
serve under ``exporter/gpu/scenarios/alerts.yaml``: here the scenario runs through the
simulated source, the poller and the GPU collector (what ``/metrics`` serves), and
every input series of that file must be served with the same labels and the same
value at each of its sample times, absent where the file has none. So the fast
promtool test of each GPU alert and the slow run against real Prometheus
(``test_alerts_shipped_rules.py``) see the same thing."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.registry import CollectorRegistry

from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.scenario import load_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.service import start_exporter
from support.exporter_fixtures import loopback_config, samples, scrape

REPO = Path(__file__).parents[2]
UNIT_TEST = REPO / "alerts" / "tests" / "simulated_gpus_test.yml"
SCENARIO = REPO / "exporter" / "gpu" / "scenarios" / "alerts.yaml"
GPUS = 5
# the instances of the file: the exporter of the simulated GPUs, and one whose
# --gpu-source auto found no GPU
SIMULATED, GPU_LESS = "gpu-node:9420", "cpu-node:9420"
TARGET_LABELS = ("job", "instance")  # Prometheus adds them; the exporter does not serve them
Key = tuple[str, frozenset[tuple[str, str]]]
NUMBER = r"[0-9.]+(?:e[-+]?[0-9]+)?"


def expand(values: str) -> list[float | None]:
    """promtool's expanding notation: ``a``, ``axN`` and ``a+bxN`` (N+1 values), ``_``
    and ``_xN`` (N missing samples), ``stale``; None for missing and stale."""
    out: list[float | None] = []
    for token in values.split():
        if token == "stale" or token == "_":
            out.append(None)
        elif found := re.fullmatch(r"_x(\d+)", token):
            out += [None] * int(found[1])
        elif found := re.fullmatch(rf"(-?{NUMBER})(?:([-+])({NUMBER}))?x(\d+)", token):
            start, sign, step, count = found.groups()
            delta = float(step or 0) * (-1 if sign == "-" else 1)
            out += [float(start) + delta * i for i in range(int(count) + 1)]
        else:
            out.append(float(token))
    return out


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    name, _, body = text.partition("{")
    return name, dict(re.findall(r'(\w+)="([^"]*)"', body))


def seconds(duration: str) -> int:
    return int(duration[:-1]) * {"s": 1, "m": 60}[duration[-1]]


def unit_tests() -> list[dict[str, Any]]:
    # every scalar as text, as promtool reads its values ("0x39" is not hex 57 there)
    tests: list[dict[str, Any]] = yaml.load(UNIT_TEST.read_text(), Loader=yaml.BaseLoader)["tests"]
    return tests


def gpu_series_at(times: list[int]) -> dict[int, dict[Key, float]]:
    """What the GPU collector serves at each scenario second of ``times``."""
    now = [1_700_000_000.0]
    source = SimulatedSource(GPUS, load_scenario(SCENARIO), clock=lambda: now[0])
    poller = GpuPoller(source, 1.0)
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    start, served = now[0], {}
    for t in sorted(times):
        now[0] = start + t
        poller.poll_once()
        served[t] = {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in registry.collect()
            for sample in family.samples
        }
    return served


async def source_info(session: aiohttp.ClientSession) -> dict[str, dict[Key, float]]:
    """``gpuscope_gpu_source_info`` of each instance's exporter, as its ``/metrics`` says."""
    served = {}
    for instance, requested, source in (
        (SIMULATED, "simulated", SimulatedSource(GPUS, load_scenario(SCENARIO))),
        (GPU_LESS, "auto", None),
    ):
        exporter = await start_exporter(loopback_config(gpu_source=requested), gpu_source=source)
        try:
            scraped = samples(await scrape(session, exporter))
        finally:
            await exporter.stop()
        served[instance] = {
            (s.name, frozenset(s.labels.items())): s.value
            for s in scraped
            if s.name == "gpuscope_gpu_source_info"
        }
    return served


def test_the_notation_expands_as_promtool_does() -> None:
    assert expand("1x2 0 _x2 3+1.5x1 stale 5-1x2 2e+09x1 0+1e3x1") == [
        1.0, 1.0, 1.0, 0.0, None, None, 3.0, 4.5, None, 5.0, 4.0, 3.0, 2e9, 2e9, 0.0, 1e3,
    ]  # fmt: skip


def test_every_shipped_gpu_alert_is_unit_tested_on_simulated_series() -> None:
    groups = yaml.safe_load((REPO / "alerts" / "rules" / "alerting.yml").read_text())["groups"]
    (gpu,) = (g for g in groups if g["name"] == "gpuscope-gpu-alerts")
    fired = {
        check["alertname"]
        for test in unit_tests()
        for check in test["alert_rule_test"]
        if check["exp_alerts"]
    }
    assert fired == {rule["alert"] for rule in gpu["rules"]}


async def test_every_input_series_is_what_the_simulator_serves(
    exporter_http: aiohttp.ClientSession,
) -> None:
    cases = []  # (test name, series key, instance, [(second, value)])
    for test in unit_tests():
        step = seconds(test["interval"])
        for entry in test["input_series"]:
            name, labels = parse_series(entry["series"])
            instance = labels["instance"]
            assert {labels.pop(k) for k in TARGET_LABELS} <= {"gpuscope", SIMULATED, GPU_LESS}
            key = (name, frozenset(labels.items()))
            timeline = [(i * step, v) for i, v in enumerate(expand(entry["values"]))]
            cases.append((test["name"], key, instance, timeline))
    gpu = gpu_series_at(sorted({t for *_, timeline in cases for t, _ in timeline}))
    info = await source_info(exporter_http)
    checked = 0
    for test_name, key, instance, timeline in cases:
        for t, expected in timeline:
            served = info[instance] if key[0] == "gpuscope_gpu_source_info" else gpu[t]
            if instance == GPU_LESS and key[0] != "gpuscope_gpu_source_info":
                served = {}  # an exporter without a GPU source serves no GPU series
            got = served.get(key)
            where = f"{test_name}: {key[0]}{dict(key[1])} at {t} s"
            if expected is None:
                assert got is None, f"{where}: served {got}, the file has none"
            else:
                assert got is not None, f"{where}: not served, the file has {expected}"
                assert math.isclose(got, expected, rel_tol=1e-9), f"{where}: {got} != {expected}"
            checked += 1
    assert checked > 500


@pytest.mark.parametrize("fault_free_gpu", [0, 1, 2, 3])
def test_the_faults_stay_on_their_gpus(fault_free_gpu: int) -> None:
    """Each GPU of the scenario shows only its own fault (the file tests each alone)."""
    served = gpu_series_at([120])[120]
    gpu = str(fault_free_gpu)
    values = {
        name: value
        for (name, labels), value in served.items()
        if dict(labels).get("gpu") == gpu and "reason" not in dict(labels)
    }
    assert values["gpuscope_gpu_up"] == 1.0
    throttled = served[
        ("gpuscope_gpu_clock_event_active", _labels(served, gpu, reason="hw_thermal_slowdown"))
    ]
    assert (throttled == 1.0) == (fault_free_gpu == 0)
    ratio = values["gpuscope_gpu_memory_used_bytes"] / values["gpuscope_gpu_memory_total_bytes"]
    assert (ratio > 0.95) == (fault_free_gpu == 2)
    assert (values["gpuscope_gpu_xid_events_total"] > 0) == (fault_free_gpu == 3)


def _labels(served: dict[Key, float], gpu: str, **extra: str) -> frozenset[tuple[str, str]]:
    (labels,) = (
        labels
        for name, labels in served
        if name == "gpuscope_gpu_up" and dict(labels).get("gpu") == gpu
    )
    return labels | frozenset(extra.items())
