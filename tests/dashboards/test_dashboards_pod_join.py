"""The metrics-only recipe in Kubernetes: dcgm-exporter, vLLM and the shipped rules, no
gpuscope process; each vLLM pod's verdict reads the GPU its pod holds (alerts/pod_join.py).

A real Prometheus scrapes a loopback replay of dcgm-exporter 4.5.3-4.8.2's exposition
(tests/fixtures/dcgm-exporter-4.5.3-4.8.2/counters.prom: one node, GPU 0 held by pod
``inference/vllm-llama-0``, GPU 1 by ``inference/vllm-mistral-0``) and two replays of
vLLM 0.32.0's ``/metrics`` (tests/fixtures/vllm-0.32.0, its counters growing; a queue
share of about 0.72), one per pod. The targets get their labels as the deploy's
monitors give them: the Kubernetes service discovery's pod, node and namespace, then
the relabelings of the vLLM PodMonitor and the dcgm-exporter ServiceMonitor
(deploy/kubernetes/components), read from the committed manifests. The rules are the
deploy's PrometheusRule (the Kubernetes host names), evaluated every second.

GPU 0's SM occupancy is set to 0.875 (the fixture's 0.5625 would make both GPUs, and so
the node, underfed): one pod's GPU is busy, the other's (0.0625) underfed, on one node,
and both pods serve the same model. Judged by their host, as before the join by pod,
the two pods were one series, and not underfed (the node's best-fed GPU is busy).

The same with tests/fixtures/dcgm-exporter-4.5.3-4.8.2/mig.prom: two pods on two MIG
instances of one GPU (SM occupancy 0.75 and 0.125), each judged by its own instance,
named ``<gpu>/<GPU_I_ID>`` with the parent's UUID.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from support.dashboard_queries import TIME_VALUES
from support.dashboards_json import load_dashboards, panels, query_variables, substitute
from support.prometheus_server import instant_query, run_daemon, wait_for_result
from support.servers import serve_exposition
from support.vllm_replay import run_vllm_replay

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "dcgm-exporter-4.5.3-4.8.2"
COMPONENTS = REPO / "deploy" / "kubernetes" / "components"
PROMETHEUS_RULE = REPO / "deploy" / "kubernetes" / "base" / "prometheusrule.yaml"
NODE = "gpu-node-1"
NAMESPACE = "inference"
# dcgm-exporter's own pod, which the Operator's target labels name
DCGM_POD = ("gpu-operator", "nvidia-dcgm-exporter-x7k2p", "nvidia-dcgm-exporter")
# pod -> (its GPU's index, UUID, the verdict's cause)
PODS = {
    "vllm-llama-0": ("0", "GPU-6f1c4e0a-2b7d-4c39-9a51-0d3e8b7f2a11", "queue"),
    "vllm-mistral-0": ("1", "GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5", "underfed"),
}
# mig.prom: one H100 in MIG mode, instance 1 (SM occupancy 0.75) held by vllm-small-0,
# instance 2 (0.125) by vllm-small-1; each instance is "<gpu>/<GPU_I_ID>" of its parent
MIG_UUID = "GPU-1d5a6f2e-93c4-4b8e-a0f7-5c2e9d4b1a30"
MIG_PODS = {
    "vllm-small-0": ("0/1", MIG_UUID, "queue"),
    "vllm-small-1": ("0/2", MIG_UUID, "underfed"),
}
BUSY_OCCUPANCY = "0.875000"
WHERE, GPU_BOARD = "where-did-the-time-go.json", "gpu.json"
VERDICT_PANEL = "Bottleneck now"
GPU_PANELS = (
    "SM occupancy",
    "SM clock against its maximum",
    "PCIe TX against link capacity",
    "PCIe RX against link capacity",
    "Memory used against total",
)
SNAKE = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def dcgm_exposition() -> str:
    """counters.prom with GPU 0's SM occupancy at ``BUSY_OCCUPANCY``."""
    text = (FIXTURES / "counters.prom").read_text(encoding="utf-8")
    lines = text.splitlines()
    found = [
        i
        for i, line in enumerate(lines)
        if line.startswith("DCGM_FI_PROF_SM_OCCUPANCY{") and 'gpu="0"' in line
    ]
    assert len(found) == 1, found
    name_labels, _ = lines[found[0]].rsplit(" ", 1)
    lines[found[0]] = f"{name_labels} {BUSY_OCCUPANCY}"
    return "\n".join(lines) + "\n"


def relabelings(path: Path, endpoints: str) -> list[dict[str, Any]]:
    """A monitor's relabelings as a Prometheus scrape config writes them."""
    monitor = yaml.safe_load(path.read_text())
    (endpoint,) = monitor["spec"][endpoints]
    return [{SNAKE.get(k, k): v for k, v in rule.items()} for rule in endpoint["relabelings"]]


def scrape_config(dcgm: str, vllm: dict[str, str]) -> dict[str, Any]:
    """Each target with the labels Kubernetes service discovery gives it (and, for
    dcgm-exporter's, the pod, namespace and container the Prometheus Operator adds),
    then its monitor's relabelings."""
    namespace, pod, container = DCGM_POD
    dcgm_target = {
        "targets": [dcgm],
        "labels": {
            "__meta_kubernetes_pod_node_name": NODE,
            "__meta_kubernetes_pod_name": pod,
            "__meta_kubernetes_namespace": namespace,
            "pod": pod,
            "namespace": namespace,
            "container": container,
        },
    }
    vllm_targets = [
        {
            "targets": [target],
            "labels": {
                "__meta_kubernetes_pod_node_name": NODE,
                "__meta_kubernetes_pod_name": pod,
                "__meta_kubernetes_namespace": NAMESPACE,
            },
        }
        for pod, target in vllm.items()
    ]
    return {
        "global": {"scrape_interval": "500ms", "scrape_timeout": "500ms"},
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "static_configs": [dcgm_target],
                "relabel_configs": relabelings(
                    COMPONENTS / "dcgm-exporter" / "dcgm-exporter-servicemonitor.yaml",
                    "endpoints",
                ),
            },
            {
                "job_name": "vllm",
                "static_configs": vllm_targets,
                "relabel_configs": relabelings(
                    COMPONENTS / "vllm" / "vllm-podmonitor.yaml", "podMetricsEndpoints"
                ),
            },
        ],
        "rule_files": ["rules.yml"],
    }


def shipped_rules() -> dict[str, Any]:
    """The deploy's PrometheusRule's groups, evaluated every second."""
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    groups = [{**group, "interval": "1s"} for group in rule["spec"]["groups"]]
    return {"groups": groups}


@asynccontextmanager
async def prometheus(workdir: Path, config: dict[str, Any]) -> AsyncIterator[str]:
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    (workdir / "rules.yml").write_text(yaml.safe_dump(shipped_rules()))

    def args(port: int) -> list[str]:
        return [
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]

    async with run_daemon("prometheus", args, workdir / "prometheus.log") as base:
        yield base


def board(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = load_dashboards()[name]
    return loaded


def panel(name: str, title: str) -> dict[str, Any]:
    (found,) = [p for p in panels(board(name)) if p["title"] == title]
    return dict(found)


async def results(
    session: aiohttp.ClientSession, base: str, name: str, title: str, **chosen: str
) -> list[list[dict[str, Any]]]:
    """Each of a panel's queries, its variables on "All" but those ``chosen`` (and the
    source, which has no "All": vLLM's)."""
    every = {v["name"]: v["allValue"] for v in query_variables(board(name)) if v["includeAll"]}
    values = every | {"source": "vllm"} | chosen
    return [
        await instant_query(session, base, substitute(t["expr"], values, TIME_VALUES))
        for t in panel(name, title)["targets"]
    ]


async def verdicts(
    session: aiohttp.ClientSession, base: str, **chosen: str
) -> dict[tuple[str, str], str]:
    """The verdict panel's causes by GPU (index and UUID)."""
    (found,) = await results(session, base, WHERE, VERDICT_PANEL, **chosen)
    return {(s["metric"]["gpu"], s["metric"].get("uuid", "")): s["metric"]["cause"] for s in found}


async def check_verdicts(
    session: aiohttp.ClientSession, base: str, pods: dict[str, tuple[str, str, str]]
) -> None:
    """Each pod's verdict on the board reads its own GPU: one series per pod's GPU,
    named by it, under "All" and under each choice of the gpu variable."""
    want = {(index, uuid): cause for index, uuid, cause in pods.values()}
    # once the rates and the GPU averages hold
    got: dict[tuple[str, str], str] = {}
    for _ in range(150):
        got = await verdicts(session, base)
        if got == want:
            break
        await asyncio.sleep(0.2)
    assert got == want
    # the targets as the monitors label them: the pod's own pod and namespace on
    # vLLM's, the holder's (dcgm-exporter's own dropped) on the GPUs'
    targets = await instant_query(session, base, "up")
    labels = {(s["metric"]["job"], s["metric"].get("pod", "")) for s in targets}
    assert labels == {("nvidia-dcgm-exporter", ""), *(("vllm", pod) for pod in pods)}
    holders = await wait_for_result(session, base, "pod_host_gpu:gpuscope_gpu_info:one")
    assert {(s["metric"]["pod"], s["metric"]["gpu"], s["metric"]["uuid"]) for s in holders} == {
        (pod, index, uuid) for pod, (index, uuid, _) in pods.items()
    }
    (now,) = await results(session, base, WHERE, VERDICT_PANEL)
    assert {s["metric"]["host"] for s in now} == {NODE}
    # no rule failed (a join matching many to many fails its whole rule)
    async with session.get(base + "/api/v1/rules") as response:
        groups = (await response.json())["data"]["groups"]
    failed = [
        (r["name"], r["lastError"]) for g in groups for r in g["rules"] if r["health"] == "err"
    ]
    assert failed == []
    for index, uuid, cause in pods.values():
        assert await verdicts(session, base, gpu=index) == {(index, uuid): cause}


@asynccontextmanager
async def recipe(
    workdir: Path, dcgm_text: str, pods: dict[str, tuple[str, str, str]]
) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """dcgm-exporter's replay, one vLLM replay per pod, Prometheus with the shipped
    rules; yields a session and Prometheus' base URL."""
    async with AsyncExitStack() as stack:
        dcgm = await stack.enter_async_context(serve_exposition(dcgm_text))
        vllm = {
            pod: (await stack.enter_async_context(run_vllm_replay())).removeprefix("http://")
            for pod in pods
        }
        base = await stack.enter_async_context(prometheus(workdir, scrape_config(dcgm, vllm)))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        yield session, base


async def test_each_vllm_pods_verdict_reads_the_gpu_its_pod_holds(tmp_path: Path) -> None:
    async with recipe(tmp_path, dcgm_exposition(), PODS) as (session, base):
        await check_verdicts(session, base, PODS)
        # the GPU board's panels fill from dcgm-exporter's series alone
        await wait_for_result(
            session,
            base,
            "count_over_time(gpuscope_gpu_pcie_transmit_bytes_total[1m]) > 4",
            timeout_s=60,
        )
        for title in GPU_PANELS:
            for expr, got_series in zip(
                (t["expr"] for t in panel(GPU_BOARD, title)["targets"]),
                await results(session, base, GPU_BOARD, title),
                strict=True,
            ):
                assert got_series, (title, expr)
        (occupancy,) = await results(session, base, GPU_BOARD, "SM occupancy")
        assert sorted(float(s["value"][1]) for s in occupancy) == [0.0625, 0.875]


async def test_each_mig_instances_pod_reads_its_own_instance(tmp_path: Path) -> None:
    """Two pods on two MIG instances of one GPU: each reads its own instance's SM
    occupancy (averaged into the GPU, 0.4375, both would read underfed)."""
    text = (FIXTURES / "mig.prom").read_text(encoding="utf-8")
    async with recipe(tmp_path, text, MIG_PODS) as (session, base):
        await check_verdicts(session, base, MIG_PODS)
