"""The rules in a real Prometheus scraping the real exporter and the worker's own /metrics,
alerting to a real Alertmanager: a fast variant of the rules (1 s evaluation, 2 s ``for:``)
from alerts/build.py.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from alerts import pod_join
from gpuscope.contract.exporter import EXPORTER_METRICS
from gpuscope.worker.config import BatchingMode
from pack.engines import ROW_RULED
from support.pack_stack import WORKER_CONFIG, PackStack, run_pack_stack
from support.prometheus_server import instant_query

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REPO = Path(__file__).parents[2]
ALERTMANAGER_CONFIG = REPO / "alerts" / "alertmanager.yml"
# alerts about the GPU hardware alone; none may fire on healthy simulated GPUs
GPU_ALERTS = (
    "GpuscopeGpuClockThrottled",
    "GpuscopeGpuPcieSaturated",
    "GpuscopeGpuMemoryNearlyFull",
    "GpuscopeGpuXidErrors",
    "GpuscopeGpuEccUncorrectedErrors",
    "GpuscopeGpuLost",
    "GpuscopeGpuCollectorFailing",
)
# alerts about the serving engine; none may fire on a lightly loaded worker
WORKER_ALERTS = (
    "GpuscopeKvCacheExhausted",
    "GpuscopeRequestsWaitingOnKvCache",
    "GpuscopeWorkerMetricsDown",
)


QUEUE_DELAY = "model:gpuscope_worker_max_queue_delay_seconds:max"
# Served by the exporter only from engines' spans that report the parts of compute
# (vLLM's llm_request span); the pack's reference worker reports compute whole, so
# its rules get their data from the vLLM replay. The exporter must declare it.
ENGINE_SPANS_ONLY = {"gpuscope_request_compute_stage_seconds"}
# Served per process on a GPU, which the demo's simulated GPUs list none of (its promtool
# case and tests/exporter/gpu/test_gpu_cnvml_numa.py show it served)
PER_GPU_PROCESS = {"gpuscope_gpu_process_numa_locality"}
# Served for a GPU in MIG mode, which no simulated GPU is (GpuscopeGpuClockUnlocked reads
# it for a MIG instance's parent; its promtool case and tests/exporter/gpu/test_gpu_cnvml_mig.py)
MIG_ONLY = {"gpuscope_gpu_mig_info"}
PER_GPU_PROCESS_LABELS = {"locality"}
# The join by pod reads the pod's labels (a Kubernetes target's, dcgm-exporter's holder)
# and dcgm-exporter's MIG instance, none of which this stack serves
# (alerts/tests/pod_join_test.yml, tests/dashboards/test_dashboards_pod_join.py).
# Labels of the engines no real one serves here (their series are in promtool's cases;
# vLLM's capture is replayed).
ENGINE_LABELS = {
    label
    for engine in ROW_RULED
    for shape in engine.exposition.values()
    for label in (*shape.labels, *shape.optional)
}

# A KV cache of 32 blocks of 16 tokens under 8 clients whose completions grow to 216
# tokens: sequences outgrow the pool, so the oldest run while the youngest are preempted.
EXHAUSTED_WORKER = replace(
    WORKER_CONFIG,
    batching=BatchingMode.CONTINUOUS,
    kv_cache_blocks=32,
    kv_block_size=16,
    max_new_tokens=200,
)
FAST = ("--interval", "1s", "--for", "2s", "--window", "10s")
SOURCES = {"spans", "vllm"}  # the pack's sources of request timings


def fast_rules(out: Path) -> Path:
    subprocess.run(
        [sys.executable, str(REPO / "alerts" / "build.py"), "--out", str(out), *FAST],
        check=True,
        capture_output=True,
    )
    return out


def rules(path: Path, kind: str) -> list[dict[str, Any]]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if kind in rule]


async def wait_until(check: Any, what: str, seen: object = None, timeout_s: float = 40) -> Any:
    """Poll the coroutine function ``check`` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while not (result := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen within {timeout_s:.0f} s; seen: {seen}")
        await asyncio.sleep(0.25)
    return result


async def alertmanager_alerts(
    session: aiohttp.ClientSession, stack: PackStack
) -> set[tuple[str, str]]:
    """(alertname, gpu label or "") of every alert Alertmanager holds."""
    async with session.get(stack.alertmanager_url + "/api/v2/alerts") as response:
        listed = await response.json()
    return {(a["labels"]["alertname"], a["labels"].get("gpu", "")) for a in listed}


def served_metric_names(text: str) -> set[str]:
    """The sample names in a text-format scrape."""
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def gpuscope_rules(rules_dir: Path) -> list[Path]:
    """The rule files over what gpuscope's processes and vLLM serve: not the one over
    dcgm-exporter's series (and its own records), which test_alerts_dcgm_exporter.py
    checks against dcgm-exporter's exposition."""
    return [path for path in sorted(rules_dir.glob("*.yml")) if path.name != "dcgm-exporter.yml"]


def metrics_in_exprs(rules_dir: Path) -> set[str]:
    """Exporter, worker and vLLM metrics the rule expressions select (recorded names
    excluded)."""
    exprs = "\n".join(
        rule["expr"] for path in gpuscope_rules(rules_dir) for rule in rules(path, "expr")
    )
    found = set(re.findall(r"\bgpuscope_\w+", exprs)) | set(re.findall(r"\bvllm:\w+", exprs))
    return found - {name.split(":")[1] for name in recorded_names(rules_dir)}


def served_label_names(text: str) -> set[str]:
    """Every label name in a text-format scrape, plus the target labels Prometheus adds."""
    found = set(re.findall(r'[{,](\w+)="', text))
    return found | {"job", "instance"}


def labels_in_exprs(rules_dir: Path) -> set[str]:
    """Label names the rule expressions match, group or join on, minus those rules create."""
    text = "\n".join(
        rule["expr"] for path in gpuscope_rules(rules_dir) for rule in rules(path, "expr")
    )
    used = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", text))
    for group in re.findall(
        r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)", text
    ):
        used |= {name.strip() for name in group.split(",") if name.strip()}
    # label_replace(v, "dst", "replacement", "src", "regex"): dst is created
    created = set(re.findall(r'"(\w+)",\s*"[^"]*",\s*"[^"]*",\s*"[^"]*"\s*\)', text))
    # and so is every label a rule sets (source, a vLLM series' phase or stage)
    for path in rules_dir.glob("*.yml"):
        for rule in rules(path, "expr"):
            created |= set(rule.get("labels", {}))
    return used - created


def recorded_names(rules_dir: Path) -> list[str]:
    return sorted({rule["record"] for rule in rules(rules_dir / "recording.yml", "record")})


async def test_demo_every_recording_rule_has_data_and_no_gpu_alert_fires(
    tmp_path: Path,
) -> None:
    rules_dir = fast_rules(tmp_path / "rules")
    async with (
        run_pack_stack(
            tmp_path, rules_dir=rules_dir, alertmanager_config=ALERTMANAGER_CONFIG
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        scrape = ""
        for url in (stack.exporter_url, stack.worker_url, stack.vllm_url):
            async with session.get(url + "/metrics") as response:
                scrape += await response.text()
        missing = (
            metrics_in_exprs(rules_dir)
            - served_metric_names(scrape)
            - ENGINE_SPANS_ONLY
            - PER_GPU_PROCESS
            - MIG_ONLY
        )
        assert missing == set(), "rules use metrics no exporter, worker or vLLM serves"
        # Triton's, TGI's and SGLang's labels: their promtool cases (test_alerts_engines.py)
        missing = (
            labels_in_exprs(rules_dir)
            - served_label_names(scrape)
            - ENGINE_LABELS
            - PER_GPU_PROCESS_LABELS
            - set(pod_join.LABELS)
        )
        assert missing == set(), "rules use labels no exporter, worker or vLLM serves"
        for record in recorded_names(rules_dir):
            await wait_until(
                lambda record=record: instant_query(session, stack.prometheus_url, record),
                f"data for {record}",
            )

        # one verdict per source: the bottleneck group may have run last before the
        # second source's phase shares were in, so wait for an evaluation that has both
        async def verdicts_of_both_sources() -> list[Any]:
            verdicts: list[Any] = await instant_query(
                session, stack.prometheus_url, "service_model_gpu:gpuscope_bottleneck:verdict"
            )
            return verdicts if {v["metric"]["source"] for v in verdicts} >= SOURCES else []

        verdicts = await wait_until(verdicts_of_both_sources, "a verdict for spans and vllm")
        by_source = {v["metric"]["source"]: v["metric"] for v in verdicts}
        assert len(verdicts) == len(by_source) == 2, verdicts
        # the worker's spans name their GPU; vLLM's /metrics none: judged on its host
        assert by_source["spans"]["uuid"] == stack.gpu_uuids[0]
        assert "uuid" not in by_source["vllm"]
        assert by_source["vllm"]["host"] == stack.vllm_instance.rsplit(":", 1)[0]
        assert by_source["vllm"]["host"] == by_source["spans"]["host"]
        # the worker's configured window, joined to its model through gpuscope_worker_info
        windows = await instant_query(session, stack.prometheus_url, QUEUE_DELAY)
        assert [(w["metric"], float(w["value"][1])) for w in windows] == [
            (
                {"__name__": QUEUE_DELAY, "model": stack.model},
                WORKER_CONFIG.max_queue_delay_ms / 1000,
            )
        ]
        assert {v["metric"]["cause"] for v in verdicts} <= {
            "queue",
            "batch_wait",
            "compute",
            "underfed",
            "none",
        }
        # Let the rules evaluate for a while (for: is 2 s): then no GPU alert may be
        # pending, firing or sent.
        await wait_until(
            lambda: instant_query(
                session,
                stack.prometheus_url,
                "count_over_time(service_model_gpu:gpuscope_bottleneck:verdict[1m]) >= 6",
            ),
            "six rule evaluations",
        )
        quiet = (*GPU_ALERTS, *WORKER_ALERTS)
        firing = await instant_query(
            session, stack.prometheus_url, f'ALERTS{{alertname=~"{"|".join(quiet)}"}}'
        )
        assert firing == []
        sent = {name for name, _ in await alertmanager_alerts(session, stack)}
        assert sent & set(quiet) == set()


async def test_faults_reach_alertmanager(tmp_path: Path) -> None:
    """GPU 0 throttled and both links saturated from 61 s; GPU 1: XIDs at 120 s, lost at 150 s."""
    rules_dir = fast_rules(tmp_path / "rules")
    seen: set[tuple[str, str]] = set()

    async def arrived(*expected: tuple[str, str]) -> bool:
        seen.update(await alertmanager_alerts(session, stack))
        return set(expected) <= seen

    async with (
        run_pack_stack(
            tmp_path,
            scenario="faults",
            start_at_s=61,
            rules_dir=rules_dir,
            alertmanager_config=ALERTMANAGER_CONFIG,
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        await wait_until(
            lambda: arrived(
                ("GpuscopeGpuClockThrottled", "0"),
                ("GpuscopeGpuPcieSaturated", "0"),
                ("GpuscopeGpuPcieSaturated", "1"),
            ),
            "throttling and PCIe alerts",
            seen,
        )
        stack.jump_scenario_to(119)
        await wait_until(lambda: arrived(("GpuscopeGpuXidErrors", "1")), "the XID alert", seen)
        stack.jump_scenario_to(149)
        await wait_until(lambda: arrived(("GpuscopeGpuLost", "1")), "the GPU-lost alert", seen)
    # only the GPU the scenario throttles, only the GPU that had XIDs
    assert ("GpuscopeGpuClockThrottled", "1") not in seen
    assert ("GpuscopeGpuXidErrors", "0") not in seen


async def worker_alerts(session: aiohttp.ClientSession, stack: PackStack) -> set[tuple[str, str]]:
    """(alertname, instance) of every worker alert Alertmanager holds."""
    async with session.get(stack.alertmanager_url + "/api/v2/alerts") as response:
        listed = await response.json()
    return {
        (a["labels"]["alertname"], a["labels"].get("instance", ""))
        for a in listed
        if a["labels"]["alertname"] in WORKER_ALERTS
    }


async def test_kv_cache_exhaustion_reaches_alertmanager(tmp_path: Path) -> None:
    """A worker whose KV cache keeps running out: preemptions, then the alert, sent."""
    rules_dir = fast_rules(tmp_path / "rules")
    seen: set[tuple[str, str]] = set()

    async def arrived() -> bool:
        seen.update(await worker_alerts(session, stack))
        return ("GpuscopeKvCacheExhausted", stack.worker_instance) in seen

    async with (
        run_pack_stack(
            tmp_path,
            rules_dir=rules_dir,
            alertmanager_config=ALERTMANAGER_CONFIG,
            worker=EXHAUSTED_WORKER,
            concurrency=8,
            output_tokens="200",
            load_s=90,
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        await wait_until(arrived, "the KV-cache exhaustion alert", seen, timeout_s=60)
        preempting = await instant_query(
            session, stack.prometheus_url, "instance:gpuscope_worker_preemptions:rate10s > 0"
        )
    assert [p["metric"]["instance"] for p in preempting] == [stack.worker_instance]
    assert ("GpuscopeWorkerMetricsDown", stack.worker_instance) not in seen


def test_the_engine_only_metrics_are_the_exporters() -> None:
    declared = {metric.name for metric in EXPORTER_METRICS}
    assert ENGINE_SPANS_ONLY - declared == set()
