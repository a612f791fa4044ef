"""A real Triton Inference Server (``nvidia-pytriton`` in its own venv) for ``make triton-check``,
and the truth its models log, checked against the recorded ``source="triton"`` series.

``make triton-check`` creates the venv (``.venv-triton``) and points
``GPUSCOPE_TRITON_PYTHON`` at its interpreter, which runs
``scripts/engines/triton_models.py`` (three NumPy models, each logging every execution).
The same checks run in ``make test`` over the captured expositions
(``tests/fixtures/triton-2.51/``), replayed into a real Prometheus: ``check_recorded``
is shared by both.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from support.prometheus_server import instant_query

REPO = Path(__file__).resolve().parents[2]
PYTHON_VARIABLE = "GPUSCOPE_TRITON_PYTHON"
CAPTURE_VARIABLE = "GPUSCOPE_TRITON_CAPTURE"
FIXTURES = REPO / "tests" / "fixtures" / "triton-2.51"
SCRIPT = REPO / "scripts" / "engines" / "triton_models.py"
MODELS = ("steady", "failing", "cached")
READY_TIMEOUT_S = 180.0
# A recorded rate against a rate queried afterwards (the error ratio, one rule, is the
# exact check that failures count among the requests).
ACROSS_RULES = 0.1
# Compute holds the handler's sleep plus PyTriton's hand-over between Triton's Python
# backend and the process running the model (about 12 ms a request on the 2-core
# development machine under this load); more than this per request is not it.
COMPUTE_OVERHEAD_S = 0.05


def triton_python() -> Path | None:
    value = os.environ.get(PYTHON_VARIABLE)
    return Path(value).absolute() if value else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class TritonServer:
    http: str  # http://127.0.0.1:PORT, the KServe v2 frontend
    metrics_port: int
    log_dir: Path


def _ready(url: str) -> bool:
    import urllib.error
    import urllib.request

    # the server is ready before PyTriton has loaded every model: ask each one
    for model in MODELS:
        try:
            with urllib.request.urlopen(f"{url}/v2/models/{model}/ready", timeout=2) as response:
                if response.status != 200:
                    return False
        except (urllib.error.URLError, OSError):
            return False
    return True


@contextmanager
def launch_triton(python: Path, work: Path) -> Iterator[TritonServer]:
    """Start the three models under PyTriton's tritonserver; stop it on exit."""
    log_dir = work / "truth"
    log_dir.mkdir(parents=True, exist_ok=True)
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = (work / "triton.log").open("wb")
    process = subprocess.Popen(
        [
            str(python),
            str(SCRIPT),
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            f"--log-dir={log_dir}",
            f"--workspace={work / 'workspace'}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (work / "triton.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Triton did not become ready:\n{tail}")
            time.sleep(0.5)
        yield TritonServer(url, metrics, log_dir)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        log.close()


@dataclass
class Reply:
    model: str
    ok: bool
    latency_s: float  # the client's, over HTTP


async def drive(
    session: aiohttp.ClientSession, url: str, model: str, values: Sequence[float], concurrency: int
) -> list[Reply]:
    """One KServe v2 request per value (batch dimension 1), ``concurrency`` at a time."""
    replies: list[Reply] = []
    queue: asyncio.Queue[float] = asyncio.Queue()
    for value in values:
        queue.put_nowait(value)

    async def client() -> None:
        while not queue.empty():
            value = queue.get_nowait()
            body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
            started = time.perf_counter()
            async with session.post(f"{url}/v2/models/{model}/infer", json=body) as response:
                await response.read()
                ok = response.status == 200
            replies.append(Reply(model, ok, time.perf_counter() - started))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return replies


def model_truth(log_dir: Path, model: str, replies: Sequence[Reply]) -> dict[str, Any]:
    """What the model logged and the client saw, per model."""
    lines = (log_dir / f"{model}.jsonl").read_text().splitlines()
    executions = [json.loads(line) for line in lines if line.strip()]
    ok = [e for e in executions if not e["failed"]]
    mine = [r for r in replies if r.model == model]
    succeeded = sum(r.ok for r in mine)
    executed_ok = sum(e["requests"] for e in ok)
    return {
        "requests": len(mine),
        "succeeded": succeeded,
        "failed": len(mine) - succeeded,
        "executions": len(executions),
        "failed_executions": len(executions) - len(ok),
        "executed_requests": sum(e["requests"] for e in executions),
        "executed_inferences": sum(e["inferences"] for e in executions),
        # requests of successful executions; the rest of the successes were cache hits
        "cache_hits": succeeded - executed_ok,
        # each request of an execution spends the whole handler time in compute
        "handler_request_s": sum(e["handler_s"] * e["requests"] for e in ok),
        "client_latency_mean_s": sum(r.latency_s for r in mine if r.ok) / max(succeeded, 1),
    }


async def scalar(session: aiohttp.ClientSession, base: str, query: str) -> float | None:
    result = await instant_query(session, base, query)
    assert len(result) <= 1, f"{query}: {result}"
    return float(result[0]["value"][1]) if result else None


async def successes_when_recorded(
    session: aiohttp.ClientSession, base: str, model: str
) -> float | None:
    """Triton's successes per second at the instant the requests rate was recorded: the
    recorded sample's own timestamp (an instant query's is the query's, up to an
    evaluation interval later, when the 5m window may hold one more scrape: a few
    seconds into the replay that moved the ratio by 10%). Two rates of different
    instants are extrapolated differently; even at one instant a scrape may be stored
    between the rule's evaluation and this query, so the two are only close:
    ``ACROSS_RULES``."""
    result = await instant_query(
        session, base, f"timestamp(service_model:gpuscope_requests:rate5m{_on(model)})"
    )
    if not result:
        return None
    at = result[0]["value"][1]
    rate = f'sum(rate(nv_inference_request_success{{job="triton", model="{model}"}}[5m]))'
    async with session.get(
        base + "/api/v1/query", params={"query": rate, "time": str(at)}
    ) as response:
        body = await response.json()
    assert body["status"] == "success", body
    values = body["data"]["result"]
    return float(values[0]["value"][1]) if values else None


def _on(model: str) -> str:
    return f'{{source="triton", model="{model}"}}'


async def recorded(session: aiohttp.ClientSession, base: str, model: str) -> dict[str, Any]:
    """The recorded Triton series of ``model`` that the boards and the verdict read."""
    sel, w = _on(model), "5m"
    phase = "service_model_gpu:gpuscope_request_phase_seconds"
    return {
        "batch": await scalar(session, base, f"service_model_gpu:gpuscope_batch_size:mean{w}{sel}"),
        "requests_rate": await scalar(
            session, base, f"service_model:gpuscope_requests:rate{w}{sel}"
        ),
        "success_rate": await successes_when_recorded(session, base, model),
        "error_ratio": await scalar(
            session, base, f"service_model:gpuscope_request_errors:ratio_rate{w}{sel}"
        ),
        "queue": await scalar(
            session, base, f'{phase}:mean{w}{{source="triton", model="{model}", phase="queue"}}'
        ),
        "compute": await scalar(
            session, base, f'{phase}:mean{w}{{source="triton", model="{model}", phase="compute"}}'
        ),
        "queue_share": await scalar(
            session,
            base,
            f'{phase}:share_mean{w}{{source="triton", model="{model}", phase="queue"}}',
        ),
        "request": await scalar(
            session, base, f"service_model_gpu:gpuscope_request_duration_seconds:mean{w}{sel}"
        ),
        "ttft": await scalar(
            session,
            base,
            f"service_model_gpu:gpuscope_time_to_first_token_seconds_count:rate{w}{sel}",
        ),
        "verdict": await instant_query(
            session, base, f"service_model_gpu:gpuscope_bottleneck:verdict{sel}"
        ),
    }


def check_recorded(model: str, got: dict[str, Any], truth: dict[str, Any]) -> list[str]:
    """Each recorded series of ``model`` against the truth; the failures, as text."""
    problems = []

    def expect(name: str, ok: bool, detail: str) -> None:
        if not ok:
            problems.append(f"{model} {name}: {detail} (recorded {got})")

    def close(a: float | None, b: float, rel: float = 1e-9) -> bool:
        return a is not None and abs(a - b) <= rel * max(abs(b), 1e-12)

    # the requests of every execution, failed ones included, over the executions
    mean_batch = truth["executed_inferences"] / truth["executions"]
    expect("mean batch", close(got["batch"], mean_batch), f"truth {mean_batch}")
    # requests finished (failed included) against successes: the same window's ratio
    ratio = truth["requests"] / truth["succeeded"]
    rates = got["requests_rate"], got["success_rate"]
    expect(
        "request rate with failures",
        None not in rates and close(rates[0] / rates[1], ratio, ACROSS_RULES),
        f"truth {ratio}",
    )
    errors = truth["failed"] / truth["requests"]
    expect(
        "error ratio",
        close(got["error_ratio"], errors) or (errors == 0 and got["error_ratio"] == 0),
        f"truth {errors}",
    )
    # compute per successful request: at least the handler's time, cache hits at none
    handler = truth["handler_request_s"] / truth["succeeded"]
    expect(
        "compute mean",
        got["compute"] is not None and handler <= got["compute"] <= handler + COMPUTE_OVERHEAD_S,
        f"handler time per request {handler}",
    )
    queue, compute, request = got["queue"], got["compute"], got["request"]
    expect(
        "phases add up to at most the request",
        None not in (queue, compute, request) and queue + compute <= request * (1 + 1e-9),
        "queue + compute over the request's mean",
    )
    if None not in (queue, compute):
        share = queue / (queue + compute)
        expect("queue share of the mean", close(got["queue_share"], share), f"truth {share}")
    # the HTTP frontend is outside Triton's request duration
    frontend = truth["client_latency_mean_s"] - (request or 0)
    expect("frontend time", request is not None and 0 < frontend < 0.05, f"{frontend}")
    expect("no TTFT (2.51 has no first-response histogram)", got["ttft"] is None, "present")
    expect("one verdict", len(got["verdict"]) == 1, f"{got['verdict']}")
    return problems
