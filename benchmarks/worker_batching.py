"""Batching strategies side by side on this machine's CPU, same offered load for each.

0. Model cost: one forward pass (embeddings) and one decode iteration (generator)
   against batch size, measured in-process on the worker's core; for the generator
   also its weight products alone (the same matrices, no attention).
1. Embeddings, ``--batching none`` against ``dynamic``: the same ladder of offered
   rates for both; per repeat, the highest rate whose p99 stays under
   ``--p99-bound-ms`` (median over the repeats) with nothing refused or failed:
   the max sustainable throughput.
2. Streamed completions, ``static`` against ``continuous`` at the same offered rates, for
   equal output lengths and for variable ones (p50/p99 end to end, TTFT p99).
3. The key/value cache under continuous batching: the paged cache of this tree (the
   default pool, and a pool small enough to preempt) against the previous worker's
   padded, doubling cache (``--padded-pythonpath``: a tree whose ``gpuscope`` package
   holds that worker), at the same offered loads, repeats interleaved across the
   three workers; throughput, p50/p99, TTFT p99, and the memory each worker held
   (resident set at ready and at its peak).

Fairness on a small machine: the worker (``gpuscope worker``, no tracing) is a
subprocess pinned to one core (``taskset``) with one BLAS/OpenMP thread, and this
process, the load generator, pins itself to another. Arrivals are open-loop Poisson
(seeded) from an aiohttp client; latency counts from the *scheduled* arrival, so a
late client shows up as latency, and the client's own lag (send time minus scheduled
time) is reported to show it kept up. Every run is bounded; each is repeated and
reported as median and (min–max).

    nice python benchmarks/worker_batching.py [--repeats 3] [--seconds 3] [--only ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp
import numpy as np
import numpy.typing as npt

from gpuscope.contract.http import METRICS_PATH, READYZ_PATH
from gpuscope.contract.worker import PREEMPTIONS
from gpuscope.worker.config import BatchingMode
from gpuscope.worker.numpy_models import NumpyTokenGenerator

MODEL = "gpuscope-synthetic"
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Setup:
    worker_core: int
    client_core: int
    embed_size: tuple[str, ...]
    gen_size: tuple[str, ...]


@dataclass(frozen=True)
class Run:
    offered: float
    throughput: float  # successful requests per second, first arrival to last answer
    p50: float
    p99: float
    ttft_p99: float | None
    lag_p99: float  # how late the client sent, against the arrival schedule
    ok: int
    refused: int
    failed: int


# -- the worker and the load --------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pinned(core: int, command: list[str]) -> list[str]:
    taskset = shutil.which("taskset")
    if taskset is None:
        raise SystemExit("taskset (util-linux) is needed to pin the worker to a core")
    return [taskset, "-c", str(core), *command]


@contextmanager
def worker(setup: Setup, flags: Sequence[str]) -> Iterator[str]:
    with worker_process(setup, flags) as (url, _):
        yield url


@contextmanager
def worker_process(
    setup: Setup, flags: Sequence[str], pythonpath: str | None = None
) -> Iterator[tuple[str, int]]:
    """A pinned worker (its ``gpuscope`` from ``pythonpath`` if given): URL and pid."""
    port = _free_port()
    command = [sys.executable, "-m", "gpuscope", "worker", "--port", str(port), "--no-tracing"]
    command += ["--log-level", "warning", *flags]
    env = os.environ | ONE_THREAD | ({"PYTHONPATH": pythonpath} if pythonpath else {})
    process = subprocess.Popen(_pinned(setup.worker_core, command), cwd="/", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(_wait_ready(url, process))
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


async def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{url}{READYZ_PATH}") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if process.poll() is not None:
                raise RuntimeError(f"worker exited with {process.returncode}")
            await asyncio.sleep(0.1)  # polling a process we do not control: no event to wait on
    raise RuntimeError("worker not ready within 120 s")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _one(
    session: aiohttp.ClientSession, url: str, body: dict[str, object], due: float
) -> tuple[int, float, float | None, float]:
    lag = time.perf_counter() - due
    first: float | None = None
    async with session.post(url, json=body) as response:
        if body.get("stream"):
            async for line in response.content:
                if first is None and line.startswith(b"data: "):
                    first = time.perf_counter() - due
        else:
            await response.read()
    return response.status, time.perf_counter() - due, first, lag


async def offer(url: str, bodies: list[dict[str, object]], rate: float, seed: int) -> Run:
    """Send ``bodies`` at Poisson arrivals of ``rate`` per second, whatever the answers."""
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        start = due = time.perf_counter()
        for body in bodies:
            due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))  # the arrival schedule
            tasks.append(asyncio.create_task(_one(session, url, body, due)))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - start
    done = [r for r in results if not isinstance(r, BaseException)]
    ok = [r for r in done if r[0] == 200]
    refused = sum(1 for r in done if r[0] == 429)
    latencies = [r[1] for r in ok]
    firsts = [r[2] for r in ok if r[2] is not None]
    nan = float("nan")
    return Run(
        offered=rate,
        throughput=len(ok) / elapsed,
        p50=_quantile(latencies, 0.5) if ok else nan,
        p99=_quantile(latencies, 0.99) if ok else nan,
        ttft_p99=_quantile(firsts, 0.99) if firsts else None,
        lag_p99=_quantile([r[3] for r in done], 0.99) if done else nan,
        ok=len(ok),
        refused=refused,
        failed=len(results) - len(ok) - refused,
    )


# -- 0. model cost --------------------------------------------------------------------


def model_cost(setup: Setup, batch_sizes: list[int]) -> None:
    """Time the models directly, in a child pinned to the worker's core."""
    command = [sys.executable, os.path.abspath(__file__), "--cost-child", *map(str, batch_sizes)]
    for size, kind in ((setup.embed_size, "embed"), (setup.gen_size, "generate")):
        env = os.environ | ONE_THREAD | {"BENCH_SIZE": " ".join(size), "BENCH_KIND": kind}
        subprocess.run(_pinned(setup.worker_core, command), check=True, cwd="/", env=env)


def _cost_child(batch_sizes: list[int]) -> None:
    from gpuscope import flags
    from gpuscope.worker.backends import numpy_models
    from gpuscope.worker.config import WorkerConfig

    size, kind = os.environ["BENCH_SIZE"].split(), os.environ["BENCH_KIND"]
    embedding, generator = numpy_models(flags.parse(WorkerConfig, size, {}, exit_on_error=False))

    def timed(fn: Callable[[], object], rounds: int) -> list[float]:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return times

    for n in batch_sizes:
        row: dict[str, object] = {"model": kind, "size": " ".join(size), "batch": n}
        if kind == "embed":
            texts = [list(f"request {i} ".encode()) * 8 for i in range(n)]
            times = timed(functools.partial(embedding.embed, texts), 11)[1:]
            row["ms"] = _spread(times, 1000)
            row["ms_per_request"] = round(statistics.median(times) * 1000 / n, 2)
        else:
            states = [generator.start(list(f"story {i}".encode())) for i in range(n)]
            prefill = timed(functools.partial(generator.step, states), 1)
            decode = timed(functools.partial(generator.step, states), 32)
            row["prefill_ms"] = round(prefill[0] * 1000, 2)
            row["decode_ms_at_context_10_to_42"] = _spread(decode, 1000, digits=2)
            row["decode_ms_per_sequence"] = round(statistics.median(decode) * 1000 / n, 3)
            # The dense part alone: the same weight products for n rows, no attention.
            rng = np.random.default_rng(n)
            hidden = rng.standard_normal((n, generator.hidden_size), dtype=np.float32)
            weights = timed(functools.partial(_weight_products, generator, hidden), 32)
            row["weight_products_ms"] = _spread(weights, 1000, digits=2)
        print(json.dumps(row, ensure_ascii=False), flush=True)


def _weight_products(generator: NumpyTokenGenerator, x: npt.NDArray[np.float32]) -> None:
    """Every weight matrix of one decode iteration times the rows of ``x``."""
    for qkv, out, up, down in generator.layers:
        _ = (x @ qkv, x @ out, (x @ up) @ down)
    _ = x @ generator.unembed


# -- 1. embeddings: none vs dynamic -----------------------------------------------------


def _spread(values: Sequence[float], scale: float = 1.0, digits: int = 1) -> str:
    med, low, high = (v * scale for v in (statistics.median(values), min(values), max(values)))
    return f"{med:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})"


def _passes(run: Run, bound_s: float) -> bool:
    return run.refused == 0 and run.failed == 0 and run.p99 <= bound_s


def embeddings(setup: Setup, args: argparse.Namespace) -> None:
    rates = [float(r) for r in args.rates.split(",")]
    bound_s = args.p99_bound_ms / 1000
    for mode in (BatchingMode.NONE, BatchingMode.DYNAMIC):
        flags = ["--batching", mode, "--max-batch-size", str(args.max_batch_size)]
        flags += ["--max-queue-delay-ms", str(args.window_ms), "--max-queue", "256"]
        flags += ["--serve", "embeddings", *setup.embed_size]
        rows: list[list[Run]] = []
        with worker(setup, flags) as url:
            warm = _embedding_bodies(50, 0)
            asyncio.run(offer(f"{url}/v1/embeddings", warm, 50, 0))
            for rate in rates:  # the ladder, until no repeat of a rate meets the bound
                bodies = [
                    _embedding_bodies(int(rate * args.seconds), r) for r in range(args.repeats)
                ]
                runs = [
                    asyncio.run(offer(f"{url}/v1/embeddings", bodies[r], rate, r))
                    for r in range(args.repeats)
                ]
                rows.append(runs)
                _print_row(f"embeddings {mode}", runs, sum(_passes(r, bound_s) for r in runs))
                if not any(_passes(r, bound_s) for r in runs):
                    break
        # Max sustainable: the highest rate whose median p99 meets the bound, with
        # nothing refused or failed in any repeat.
        good = [
            runs
            for runs in rows
            if statistics.median(r.p99 for r in runs) <= bound_s
            and not any(r.refused or r.failed for r in runs)
        ]
        best = good[-1] if good else []
        summary = {
            "config": f"embeddings {mode}",
            "p99_bound_ms": args.p99_bound_ms,
            "max_sustainable_offered_rps": best[0].offered if best else None,
            "throughput_rps": _spread([r.throughput for r in best]) if best else None,
            "p99_ms": _spread([r.p99 for r in best], 1000) if best else None,
        }
        print(json.dumps(summary, ensure_ascii=False), flush=True)


def _embedding_bodies(count: int, repeat: int) -> list[dict[str, object]]:
    # base64, as OpenAI's own client asks by default: the worker does not spend its
    # core printing floats as JSON text.
    return [
        {"model": MODEL, "input": f"request {repeat} {i} " * 8, "encoding_format": "base64"}
        for i in range(count)
    ]


# -- 2. completions: static vs continuous ---------------------------------------------


def completions(setup: Setup, args: argparse.Namespace) -> None:
    for rate in [float(r) for r in args.completion_rates.split(",")]:
        _completions_at(setup, args, rate)


def _completions_at(setup: Setup, args: argparse.Namespace, rate: float) -> None:
    count = int(rate * args.completion_seconds)
    rng = random.Random(7)
    lengths = [int(n) for n in args.lengths.split(",")]
    workloads = {
        f"equal {args.equal_length}": [args.equal_length] * count,
        f"variable {args.lengths}": [rng.choice(lengths) for _ in range(count)],
    }
    for mode in (BatchingMode.STATIC, BatchingMode.CONTINUOUS):
        flags = ["--batching", mode, "--max-batch-size", str(args.gen_batch_size)]
        flags += ["--max-queue", "1024", "--serve", "completions", *setup.gen_size]
        with worker(setup, flags) as url:
            warm = _completion_bodies([16] * 20)
            asyncio.run(offer(f"{url}/v1/completions", warm, 20, 0))
            for name, max_tokens in workloads.items():
                bodies = _completion_bodies(max_tokens)
                runs = [
                    asyncio.run(offer(f"{url}/v1/completions", bodies, rate, seed))
                    for seed in range(args.repeats)
                ]
                _print_row(f"completions {mode}, {name}", runs)


def _completion_bodies(max_tokens: list[int]) -> list[dict[str, object]]:
    return [
        {"model": MODEL, "prompt": f"story {i}", "max_tokens": n, "stream": True}
        for i, n in enumerate(max_tokens)
    ]


# -- 3. paged vs padded key/value cache -------------------------------------------------


def kv_cache(setup: Setup, args: argparse.Namespace) -> None:
    """Continuous batching with each cache at the same offered loads; the three workers
    run side by side (idle ones cost nothing) so that their repeats interleave."""
    if not args.padded_pythonpath:
        raise SystemExit("--only kv needs --padded-pythonpath (see docs/benchmarks.md)")
    base = ["--batching", "continuous", "--max-batch-size", str(args.gen_batch_size)]
    base += ["--max-queue", "1024", "--serve", "completions", *setup.gen_size]
    small_pool = ["--kv-cache-blocks", str(args.small_pool_blocks)]
    configs = {
        "padded (previous worker)": (base, args.padded_pythonpath),
        "paged, default pool": (base, None),
        f"paged, {args.small_pool_blocks} blocks": (base + small_pool, None),
    }
    rng = random.Random(7)
    lengths = [int(n) for n in args.lengths.split(",")]
    with contextlib.ExitStack() as stack:
        workers = {
            name: stack.enter_context(worker_process(setup, flags, path))
            for name, (flags, path) in configs.items()
        }
        idle_rss = {name: _memory_kib(pid)[0] for name, (_, pid) in workers.items()}
        for url, _ in workers.values():
            asyncio.run(offer(f"{url}/v1/completions", _completion_bodies([16] * 20), 20, 0))
        for rate in [float(r) for r in args.completion_rates.split(",")]:
            count = int(rate * args.completion_seconds)
            bodies = _completion_bodies([rng.choice(lengths) for _ in range(count)])
            runs: dict[str, list[Run]] = {name: [] for name in workers}
            for seed in range(args.repeats):  # interleaved: one repeat of each in turn
                for name, (url, _) in workers.items():
                    runs[name].append(
                        asyncio.run(offer(f"{url}/v1/completions", bodies, rate, seed))
                    )
            for name, name_runs in runs.items():
                _print_row(f"kv {name}, variable {args.lengths}", name_runs)
        for name, (url, pid) in workers.items():
            rss, peak = _memory_kib(pid)
            memory = {"config": f"kv {name}", "rss_at_ready_mib": round(idle_rss[name] / 1024, 1)}
            memory |= {"rss_now_mib": round(rss / 1024, 1), "rss_peak_mib": round(peak / 1024, 1)}
            memory["preemptions_total"] = asyncio.run(_preemptions(url))
            print(json.dumps(memory, ensure_ascii=False), flush=True)


def _memory_kib(pid: int) -> tuple[int, int]:
    """Resident set now and at its peak (VmRSS, VmHWM), in KiB."""
    fields = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def _preemptions(url: str) -> float | None:
    """``gpuscope_worker_preemptions_total`` from the worker's /metrics, if it has one."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}{METRICS_PATH}") as response:
        if response.status != 200:
            return None
        for line in (await response.text()).splitlines():
            if line.startswith(PREEMPTIONS.sample_name):
                return float(line.split()[-1])
    return None


def _print_row(name: str, runs: list[Run], passed: int | None = None) -> None:
    row: dict[str, object] = {
        "config": name,
        "offered_rps": runs[0].offered,
        "throughput_rps": _spread([r.throughput for r in runs]),
        "p50_ms": _spread([r.p50 for r in runs], 1000),
        "p99_ms": _spread([r.p99 for r in runs], 1000),
    }
    if all(r.ttft_p99 is not None for r in runs):
        row["ttft_p99_ms"] = _spread([r.ttft_p99 or 0.0 for r in runs], 1000)
    row["client_lag_p99_ms"] = _spread([r.lag_p99 for r in runs], 1000)
    row.update(
        repeats=len(runs),
        ok=sum(r.ok for r in runs),
        refused_429=sum(r.refused for r in runs),
        failed=sum(r.failed for r in runs),
    )
    if passed is not None:
        row["within_bound"] = f"{passed}/{len(runs)}"
    print(json.dumps(row, ensure_ascii=False), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="embeddings: per rate")
    parser.add_argument("--rates", default="100,125,140,160,200,250,300,350,400,450,500,600")
    parser.add_argument("--p99-bound-ms", type=float, default=100.0)
    parser.add_argument("--max-batch-size", type=int, default=32, help="embeddings")
    parser.add_argument("--gen-batch-size", type=int, default=16, help="completions")
    parser.add_argument("--window-ms", type=float, default=5.0, help="dynamic batching window")
    parser.add_argument("--embed-size", default="--hidden-size 1024 --layers 4")
    parser.add_argument("--gen-size", default="--hidden-size 256 --layers 2")
    parser.add_argument("--completion-rates", default="30,60", help="completions: req/s")
    parser.add_argument("--completion-seconds", type=float, default=6.0)
    parser.add_argument("--equal-length", type=int, default=64)
    parser.add_argument("--lengths", default="8,16,32,64,128")
    parser.add_argument("--worker-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--padded-pythonpath", help="kv: a tree holding the previous worker")
    parser.add_argument("--small-pool-blocks", type=int, default=48, help="kv: blocks of 16")
    parser.add_argument("--only", choices=["cost", "embeddings", "completions", "kv"])
    args = parser.parse_args(argv)
    setup = Setup(
        args.worker_core,
        args.client_core,
        tuple(args.embed_size.split()),
        tuple(args.gen_size.split()),
    )
    os.sched_setaffinity(0, {setup.client_core})
    if args.only in (None, "cost"):
        model_cost(setup, [1, 2, 4, 8, 16, 32])
    if args.only in (None, "embeddings"):
        embeddings(setup, args)
    if args.only in (None, "completions"):
        completions(setup, args)
    if args.only == "kv" or (args.only is None and args.padded_pythonpath):
        kv_cache(setup, args)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cost-child"]:
        _cost_child([int(n) for n in sys.argv[2:]])
    else:
        raise SystemExit(main())
