"""Every dashboard query against the running pack: real exporter, worker, load, Prometheus.

Prometheus scrapes the exporter, the worker's own /metrics (the serving-engine
panels) and a replay of vLLM's /metrics as the real engine served it (the
metrics-only source), so every metric a panel names must be served by one of them.
The exporter also receives the spans vLLM's own tracing sent (prefill and decode
through spans) and another instrumentation's SERVER spans.

Triton's ``/metrics``, as a real server served them, are replayed too, so the panels
over an engine's recorded series (its mean batch size, queue, error ratio) have data.

The stack runs the ``faults`` scenario from just before its XID event on GPU 1, so
the error panels have series too. Grafana's variables are resolved the way Grafana
does (``label_values`` through Prometheus' label-values API, each filtered by the
ones before, set to their first value); panels are then queried in the dashboards'
default state, every variable on "All", once per value of a variable without "All"
(the source on "Where did the time go"): each query must return data for one of them
at least (a panel of prefill and decode has data for vLLM only).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.gpu.simulated import PCIE_GEN5_X16_BYTES_PER_S
from support.dashboard_queries import TIME_VALUES, failing_targets, label_values, sources
from support.dashboards_json import (
    PROMETHEUS_SERIES,
    REPO,
    TARGET_LABELS,
    Target,
    load_dashboards,
    parse_label_values,
    query_variables,
    selected_metrics,
    substitute,
    targets,
)
from support.pack_stack import PackStack, run_pack_stack
from support.prometheus_server import instant_query, wait_for_result
from support.triton_engine import MODELS as TRITON_MODELS

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

# The sharing row's per-process panels: the pack's simulated GPUs list no process
# (no scenario process event runs then); their series are checked on the C fake NVML
# (tests/exporter/gpu/test_gpu_cnvml_sharing.py, test_gpu_cnvml_numa.py). Nor is a simulated GPU
# in MIG mode (tests/exporter/gpu/test_gpu_cnvml_mig.py serves the instances), nor down while the
# demo runs (the down reason is served only then: tests/exporter/gpu/test_gpu_poller_hang.py and
# the faults scenario show it).
PER_PROCESS_PANELS = frozenset(
    {
        "SM use per process",
        "Memory per process",
        "NUMA locality per process",
        "MIG instances",
        "Why a GPU is down",
    }
)
RULES_DIR = REPO / "alerts" / "rules"
RULES_BUILD = REPO / "alerts" / "build.py"
VERDICT = "service_model_gpu:gpuscope_bottleneck:verdict"
BATCH_SIZE = "service_model_gpu:gpuscope_batch_size:mean5m"
FIRING = 'ALERTS{alertstate="firing"}'
XID_AT_S = 120  # faults.yaml: XID 48 on GPU 1; GPU 1 falls off the bus at 150 s
# Every gpuscope metric name in an expression, with or without a selector (not the
# middle part of a recording rule's name).
GPUSCOPE_NAME = re.compile(r"(?<![\w:])(gpuscope_\w+)(?![\w:])")


def recording_rules() -> set[str]:
    """Names the rules record; not dcgm-exporter.yml's, which records gpuscope's own GPU
    names from dcgm-exporter: the boards' GPU names must be served by the exporter."""
    names: set[str] = set()
    for path in sorted(RULES_DIR.glob("*.yml")) if RULES_DIR.is_dir() else []:
        if path.name == "dcgm-exporter.yml":
            continue
        for group in yaml.safe_load(path.read_text()).get("groups", []):
            names.update(rule["record"] for rule in group["rules"] if "record" in rule)
    return names


def served_labels(*metrics_texts: str) -> dict[str, set[str]]:
    """Sample name -> label names, from /metrics texts (the exporter's, the worker's,
    vLLM's)."""
    served: dict[str, set[str]] = {}
    for text in metrics_texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                served.setdefault(sample.name, set()).update(sample.labels)
    return served


async def scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as response:
        assert response.status == 200, url
        return await response.text()


async def wait_for_xid(session: aiohttp.ClientSession, stack: PackStack) -> None:
    if stack.clock.scenario_time() < XID_AT_S:
        stack.jump_scenario_to(XID_AT_S + 1)
    # Two samples in the panels' window, so that increase() has something to work on.
    window = TIME_VALUES["$__rate_interval"]
    await wait_for_result(
        session,
        stack.prometheus_url,
        f"count_over_time(gpuscope_gpu_xid_errors_total[{window}]) > 1",
        30,
    )


def unknown_names(target: Target, served: dict[str, set[str]], rules: set[str]) -> list[str]:
    problems = []
    for metric, labels in selected_metrics(target.expr):
        if metric in PROMETHEUS_SERIES:
            continue
        if ":" in metric and metric not in served:  # vLLM's names have colons too
            if metric not in rules:
                problems.append(f"{metric}: no recording rule of that name in {RULES_DIR}")
            continue
        if metric not in served:
            problems.append(f"{metric}: not in the exporter's or the worker's /metrics")
            continue
        missing = set(labels) - served[metric] - TARGET_LABELS
        if missing:
            problems.append(f"{metric}: no /metrics serves it with label {sorted(missing)}")
    braced = {metric for metric, _ in selected_metrics(target.expr)}
    for metric in sorted(set(GPUSCOPE_NAME.findall(target.expr)) - braced - set(served)):
        problems.append(f"{metric}: not in the exporter's or the worker's /metrics")
    return [f"{target.board} / {target.panel}: {problem}" for problem in problems]


def test_unknown_names_catches_bare_and_selected_names() -> None:
    served = {"gpuscope_worker_info": {"model", "batching"}, "gpuscope_worker_x": set()}
    expr = (
        "sum by (instance) (rate(gpuscope_worker_y[1m]) * on (job, instance)\n"
        'group_left (model) gpuscope_worker_info{model=~"m", nope="1"})\n'
        "* gpuscope_worker_x + gpu:gpuscope_gpu_sm_clock:ratio"
    )
    target = Target("b.json", "p", "timeseries", "s", expr, False)
    problems = unknown_names(target, served, {"gpu:gpuscope_gpu_sm_clock:ratio"})
    assert problems == [
        "b.json / p: gpuscope_worker_info: no /metrics serves it with label ['nope']",
        "b.json / p: gpuscope_worker_y: not in the exporter's or the worker's /metrics",
    ]


def names_not_served(served: dict[str, set[str]]) -> list[str]:
    """Metrics and matcher labels of panels and variables that nothing serves."""
    rules = recording_rules()
    problems = []
    for name, board in load_dashboards().items():
        for target in targets(name, board):
            if target.panel in PER_PROCESS_PANELS:
                continue  # no process, no sample to read label names from
            problems += unknown_names(target, served, rules)
        for variable in query_variables(board):
            series, label = parse_label_values(variable["query"])
            fake = Target(name, f"variable {variable['name']}", "variable", None, series, False)
            problems += unknown_names(fake, served, rules)
            metric = series.partition("{")[0]
            if metric in served and label not in served[metric] | TARGET_LABELS:
                problems.append(f"{name}: variable {variable['name']}: {metric} has no {label}")
    return problems


async def pcie_capacities(session: aiohttp.ClientSession, base: str) -> list[float]:
    """Per-GPU link capacity as the GPU dashboard's PCIe panel computes it."""
    board = load_dashboards()["gpu.json"]
    everything = {v["name"]: v["allValue"] for v in query_variables(board)}
    (expr,) = {
        t.expr
        for t in targets("gpu.json", board)
        if t.panel.startswith("PCIe") and "link_width" in t.expr
    }
    result = await instant_query(session, base, substitute(expr, everything, TIME_VALUES))
    return sorted(float(series["value"][1]) for series in result)


async def pcie_utilizations(session: aiohttp.ClientSession, base: str) -> list[float]:
    """Traffic over link capacity as the bottleneck dashboard's PCIe panel computes it."""
    board = load_dashboards()["where-did-the-time-go.json"]
    everything = {v["name"]: v["allValue"] for v in query_variables(board) if v["includeAll"]}
    values = []
    for target in targets("where-did-the-time-go.json", board):
        if target.panel.startswith("PCIe") and "link_width" in target.expr:
            expr = substitute(target.expr, everything, TIME_VALUES)
            values += [float(s["value"][1]) for s in await instant_query(session, base, expr)]
    return values


async def latency_models(session: aiohttp.ClientSession, base: str, source: str) -> list[str]:
    """The values the inference latency board's ``model`` variable lists for ``source``."""
    board = load_dashboards()["inference-latency.json"]
    everything = {v["name"]: v["allValue"] for v in query_variables(board)}
    (variable,) = [v for v in query_variables(board) if v["name"] == "model"]
    chosen = {**everything, "source": source}
    series, label = parse_label_values(substitute(variable["query"], chosen, {}))
    return sorted(await label_values(session, base, series, label))


def fast_rules(folder: Path) -> Path:
    """The pack's rules as alerts/build.py writes them, evaluated every second."""
    subprocess.run(
        [sys.executable, str(RULES_BUILD), "--out", str(folder), "--interval", "1s"],
        check=True,
        capture_output=True,
    )
    return folder


async def test_dashboards_against_the_running_pack(tmp_path: Path) -> None:
    """Every metric and label a dashboard names is served; every query returns data."""
    rules = fast_rules(tmp_path / "rules")
    async with (
        run_pack_stack(
            tmp_path,
            scenario="faults",
            start_at_s=95,
            rules_dir=rules,
            vllm_spans=True,
            triton=True,
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        await wait_for_xid(session, stack)
        await wait_for_result(session, stack.prometheus_url, VERDICT, 30)
        await wait_for_result(session, stack.prometheus_url, f'{VERDICT}{{source="vllm"}}', 30)
        # the replay's counters have moved through the rules (its last capture stays)
        await wait_for_result(session, stack.prometheus_url, f'{BATCH_SIZE}{{source="triton"}}', 30)
        # the boards' annotations: the XID alert fires as the XID is counted (for: 0m)
        await wait_for_result(session, stack.prometheus_url, FIRING, 30)
        served = served_labels(
            await scrape(session, stack.exporter_url),
            await scrape(session, stack.worker_url),
            await scrape(session, stack.vllm_url),
        )
        not_served = names_not_served(served)
        no_data = await failing_targets(
            session, stack.prometheus_url, may_be_empty=PER_PROCESS_PANELS
        )
        where_sources = await sources(session, stack.prometheus_url)
        triton_models = await latency_models(session, stack.prometheus_url, "triton")
        capacity = await pcie_capacities(session, stack.prometheus_url)
        utilization = await pcie_utilizations(session, stack.prometheus_url)
    assert not no_data, "\n\n".join(no_data)
    # the pack's worker through spans, vLLM's and Triton's /metrics through the rules
    assert where_sources == ["spans", "triton", "vllm"]
    # the latency board picks an engine's models from the rules' series
    assert triton_models == sorted(TRITON_MODELS)
    # a share of the link: divided by the capacity, not by the lanes and times the rate
    assert utilization and all(0 <= value <= 1 for value in utilization), utilization
    # The simulated GPUs have gen 5 x16 links: 32 GT/s x 128/130 / 8 x 16 lanes.
    assert capacity == pytest.approx([PCIE_GEN5_X16_BYTES_PER_S] * 2, rel=1e-3)
    assert not not_served, "\n".join(not_served)
