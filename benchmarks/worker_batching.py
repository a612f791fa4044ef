"""Batching strategies side by side on this machine's CPU, same offered load for each.

1. Embeddings: ``--batching none`` against ``dynamic`` at a ladder of offered rates
   (throughput, p50, p99).
2. Streamed completions: ``static`` against ``continuous`` (p50/p99 latency, TTFT).

Each configuration runs the worker as a subprocess (``gpuscope worker``, no tracing)
on 127.0.0.1 and drives it with an open-loop load of Poisson arrivals (seeded), so
a slow server does not slow the arrivals. Every run is bounded in requests and time;
each is repeated and reported as median and (min–max).

    nice python benchmarks/worker_batching.py [--repeats 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

MODEL = "gpuscope-synthetic"
SIZE_FLAGS = ["--hidden-size", "1024", "--layers", "4", "--max-context", "512"]


@dataclass(frozen=True)
class Run:
    throughput: float  # successful requests per second
    p50: float
    p99: float
    ttft_p99: float | None
    ok: int
    refused: int
    failed: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def worker(flags: Sequence[str]) -> Iterator[str]:
    port = _free_port()
    command = [sys.executable, "-m", "gpuscope", "worker", "--port", str(port), "--no-tracing"]
    command += ["--log-level", "warning", *SIZE_FLAGS, *flags]
    process = subprocess.Popen(command, cwd="/", env=os.environ | {"OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None:
                raise RuntimeError(f"worker exited with {process.returncode}")
            time.sleep(0.1)  # polling a process we do not control: no event to wait on
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _one(
    client: httpx.AsyncClient, path: str, body: dict[str, object], stream: bool
) -> tuple[int, float, float | None]:
    started = time.perf_counter()
    if not stream:
        response = await client.post(path, json=body)
        return response.status_code, time.perf_counter() - started, None
    first: float | None = None
    async with client.stream("POST", path, json=body) as response:
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - started
    return response.status_code, time.perf_counter() - started, first


async def offer(
    url: str, path: str, bodies: list[dict[str, object]], rate: float, seed: int, stream: bool
) -> Run:
    """Send ``bodies`` at Poisson arrivals of ``rate`` per second, whatever the answers."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        due = start
        for body in bodies:
            due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))  # the arrival schedule
            tasks.append(asyncio.create_task(_one(client, path, body, stream)))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - start
    done = [r for r in results if not isinstance(r, BaseException)]
    ok = [r for r in done if r[0] == 200]
    latencies = [r[1] for r in ok]
    firsts = [r[2] for r in ok if r[2] is not None]
    return Run(
        throughput=len(ok) / elapsed,
        p50=_quantile(latencies, 0.5) if ok else float("nan"),
        p99=_quantile(latencies, 0.99) if ok else float("nan"),
        ttft_p99=_quantile(firsts, 0.99) if firsts else None,
        ok=len(ok),
        refused=sum(1 for r in done if r[0] == 429),
        failed=len(results) - len(ok) - sum(1 for r in done if r[0] == 429),
    )


def _summary(runs: list[Run], field: str) -> str:
    values = [getattr(r, field) for r in runs]
    scale = 1000 if field != "throughput" else 1
    med = statistics.median(values) * scale
    return f"{med:.1f} ({min(values) * scale:.1f}–{max(values) * scale:.1f})"


def embeddings(repeats: int, seconds: float, rates: list[float]) -> list[dict[str, object]]:
    rows = []
    for mode in ("none", "dynamic"):
        flags = ["--batching", mode, "--max-batch-size", "16", "--max-queue-delay-ms", "5"]
        flags += ["--max-queue", "64", "--serve", "embeddings"]
        with worker(flags) as url:
            for rate in rates:
                count = int(rate * seconds)
                bodies: list[dict[str, object]] = [
                    {"model": MODEL, "input": f"request {i} " * 8} for i in range(count)
                ]
                runs = [
                    asyncio.run(offer(url, "/v1/embeddings", bodies, rate, seed, False))
                    for seed in range(repeats)
                ]
                rows.append(_row(f"embeddings {mode}", rate, runs))
    return rows


def completions(repeats: int, seconds: float, rate: float) -> list[dict[str, object]]:
    rows = []
    rng = random.Random(7)
    count = int(rate * seconds)
    # Mixed output lengths: the short ones are what static batching makes wait.
    bodies: list[dict[str, object]] = [
        {
            "model": MODEL,
            "prompt": f"story {i}",
            "max_tokens": rng.choice([8, 16, 32, 64, 128]),
            "stream": True,
        }
        for i in range(count)
    ]
    for mode in ("static", "continuous"):
        flags = ["--batching", mode, "--max-batch-size", "16", "--max-queue", "512"]
        flags += ["--serve", "completions", "--hidden-size", "256", "--layers", "2"]
        with worker(flags) as url:
            runs = [
                asyncio.run(offer(url, "/v1/completions", bodies, rate, seed, True))
                for seed in range(repeats)
            ]
        rows.append(_row(f"completions {mode}", rate, runs))
    return rows


def _row(name: str, rate: float, runs: list[Run]) -> dict[str, object]:
    row: dict[str, object] = {
        "config": name,
        "offered_rps": rate,
        "throughput_rps": _summary(runs, "throughput"),
        "p50_ms": _summary(runs, "p50"),
        "p99_ms": _summary(runs, "p99"),
        "ok": sum(r.ok for r in runs),
        "429": sum(r.refused for r in runs),
        "failed": sum(r.failed for r in runs),
    }
    if all(r.ttft_p99 is not None for r in runs):
        row["ttft_p99_ms"] = _summary(runs, "ttft_p99")
    print(json.dumps(row), flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rates", default="20,60,120", help="embeddings: offered req/s")
    parser.add_argument("--completion-rate", type=float, default=8.0)
    parser.add_argument("--only", choices=["embeddings", "completions"])
    args = parser.parse_args(argv)
    if args.only != "completions":
        rates = [float(r) for r in args.rates.split(",")]
        embeddings(args.repeats, args.seconds, rates)
    if args.only != "embeddings":
        completions(args.repeats, args.seconds, args.completion_rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
