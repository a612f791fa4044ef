"""The no-daemon overlay's scrape of dcgm-exporter in a real Prometheus: the
ServiceMonitor's relabelings, as the Prometheus Operator turns them into a scrape
config, over a target labelled as the Operator labels it (dcgm-exporter's own pod,
namespace and container), scraping the exposition of a 2-GPU node shaped as
dcgm-exporter 4.5.3-4.8.2 writes it, with the shipped rules evaluated over it."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from pack.settings import KubeSettings
from support.kubernetes_manifests import REPO, Obj, find, kustomize
from support.prometheus_server import instant_query, run_daemon, wait_for_result

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

FIXTURE = REPO / "tests" / "fixtures" / "dcgm-exporter-4.5.3-4.8.2" / "default.prom"
GPU0 = "GPU-6f1c4e0a-2b7d-4c39-9a51-0d3e8b7f2a11"
GPU1 = "GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5"
NODE = "gpu-node-1"
EXPORTER_POD = "nvidia-dcgm-exporter-7xk2p"


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _relabel_configs(relabelings: list[Obj]) -> list[dict[str, Any]]:
    """A monitor's relabelings as Prometheus's relabel_configs (the Operator's spelling)."""
    return [{_snake(k): v for k, v in rule.items()} for rule in relabelings]


async def _serve(text: str) -> tuple[asyncio.Server, int]:
    body = text.encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_dcgm_exporters_scrape_keeps_the_holder_pod_and_feeds_the_rules(
    tmp_path: Path,
) -> None:
    s = KubeSettings()
    monitor = find(kustomize("overlays/no-daemon"), "ServiceMonitor", s.dcgm_exporter_service)
    relabelings = monitor["spec"]["endpoints"][0]["relabelings"]
    # GPU 1 held by no pod: dcgm-exporter then writes no pod labels on its series
    text = FIXTURE.read_text(encoding="utf-8")
    held = ',container="vllm",namespace="inference",pod="vllm-mistral-0"'
    text = "\n".join(line.replace(held, "") if GPU1 in line else line for line in text.splitlines())
    server, port = await _serve(text + "\n")
    # what the Operator's own relabelling gives a ServiceMonitor's target before the
    # monitor's relabelings: the endpoint's pod meta labels and the target labels
    # namespace, pod, container (dcgm-exporter's), service, endpoint
    target = {
        "targets": [f"127.0.0.1:{port}"],
        "labels": {
            "__meta_kubernetes_pod_node_name": NODE,
            "__meta_kubernetes_pod_name": EXPORTER_POD,
            "namespace": s.dcgm_exporter_namespace,
            "pod": EXPORTER_POD,
            "container": "nvidia-dcgm-exporter",
            "service": s.dcgm_exporter_service,
            "endpoint": s.dcgm_exporter_port,
        },
    }
    without_drop = [r for r in relabelings if r.get("action") != "labeldrop"]
    assert len(without_drop) == len(relabelings) - 1
    rules_dir = tmp_path / "rules"
    build = [sys.executable, str(REPO / "alerts" / "build.py"), "--out", str(rules_dir)]
    await asyncio.to_thread(
        subprocess.run,
        [*build, "--interval", "1s"],
        check=True,
        capture_output=True,
    )
    config = {
        "global": {"scrape_interval": "500ms", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "serviceMonitor/gpuscope/nvidia-dcgm-exporter/0",
                "static_configs": [target],
                "relabel_configs": _relabel_configs(relabelings),
            },
            {
                # the same without the labeldrop, under a job the rules do not read
                "job_name": "kept",
                "static_configs": [target],
                "relabel_configs": [
                    {**c, "replacement": "kept"} if c.get("target_label") == "job" else c
                    for c in _relabel_configs(without_drop)
                ],
            },
        ],
        "rule_files": [str(p) for p in sorted(rules_dir.glob("*.yml"))],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")

    def args(listen: int) -> list[str]:
        return [
            f"--config.file={path}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{listen}",
        ]

    try:
        async with (
            run_daemon("prometheus", args, tmp_path / "prometheus.log") as base,
            aiohttp.ClientSession() as session,
        ):
            await wait_for_result(
                session, base, 'gpuscope_gpu_memory_used_bytes{source="dcgm-exporter"}'
            )
            # both jobs scraped: the rules can be evaluated before "kept"'s first scrape
            await wait_for_result(session, base, 'count(DCGM_FI_DEV_FB_USED{job="kept"}) == 2')
            used = await instant_query(session, base, "DCGM_FI_DEV_FB_USED")
            by = {(m["metric"]["job"], m["metric"]["UUID"]): m["metric"] for m in used}
            job = s.dcgm_exporter_service
            assert set(by) == {(job, GPU0), (job, GPU1), ("kept", GPU0), ("kept", GPU1)}
            instance = f"{NODE}/{EXPORTER_POD}:{port}"
            # the holder pod kept as dcgm-exporter writes it; a free GPU names none
            assert by[(job, GPU0)]["pod"] == "vllm-llama-0"
            assert by[(job, GPU0)]["namespace"] == "inference"
            assert by[(job, GPU0)]["container"] == "vllm"
            assert "exported_pod" not in by[(job, GPU0)]
            assert {"pod", "namespace", "container"}.isdisjoint(by[(job, GPU1)])
            assert by[(job, GPU0)]["instance"] == instance
            # without the drop: the holder renamed, dcgm-exporter's pod on a free GPU
            assert by[("kept", GPU0)]["exported_pod"] == "vllm-llama-0"
            assert by[("kept", GPU0)]["pod"] == EXPORTER_POD
            assert by[("kept", GPU1)]["pod"] == EXPORTER_POD
            # the shipped rules read the monitor's job: the GPUs recorded with the
            # holder pod, on the node as the host
            recorded = await instant_query(
                session, base, 'gpuscope_gpu_memory_used_bytes{source="dcgm-exporter"}'
            )
            pods = {m["metric"]["uuid"]: m["metric"].get("pod") for m in recorded}
            assert pods == {GPU0: "vllm-llama-0", GPU1: None}
            assert {m["metric"]["job"] for m in recorded} == {job}
            assert {m["metric"]["instance"] for m in recorded} == {instance}
    finally:
        server.close()
        await server.wait_closed()
