"""``gpuscope loadgen`` against a hostile or broken server (a tiny aiohttp app on
127.0.0.1): every malformed answer is one error of one kind, every read is bounded,
and the run always ends with its report. Before, a malformed event was a traceback
that lost the whole run, and a 1 GiB answer or ``/metrics`` was read whole."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from gpuscope.loadgen.client import discover_model
from gpuscope.loadgen.results import Load, StepResult
from gpuscope.loadgen.runner import Plan, Runner, Target
from gpuscope.loadgen.workload import Lengths, synthetic_requests

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MIB = 1024 * 1024


@dataclass
class Hostile:
    """What the hostile server answers; tests set the handlers."""

    url: str = ""
    completions: Handler | None = None
    metrics: Handler | None = None
    served: int = 0
    stopped_writing: list[int] = field(default_factory=list)


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    server = Hostile()

    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        server.served += 1
        assert server.completions is not None
        return await server.completions(request)

    async def metrics(request: web.Request) -> web.StreamResponse:
        assert server.metrics is not None
        return await server.metrics(request)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.url = f"http://{host}:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


async def test_the_server_root_given_for_the_api_base_names_v1(hostile: Hostile) -> None:
    """A newcomer's ``--url http://host:8000``: /models is a 404 there, and the error
    says where the API most likely is, not only that a model could be passed."""
    async with aiohttp.ClientSession() as session:
        with pytest.raises(RuntimeError) as root:
            await discover_model(session, hostile.url)
        assert str(root.value) == (
            f"{hostile.url}/models answered 404; pass --model, or, if the API lives under"
            f" /v1, --url {hostile.url}/v1"
        )
        # under /v1 already, the hint would be wrong: only the model is suggested
        with pytest.raises(RuntimeError, match=r"/v1/v1/models answered 404; pass --model$"):
            await discover_model(session, hostile.url + "/v1/v1")
        assert await discover_model(session, hostile.url + "/v1") == "m"


def events(*lines: bytes, done: bool = True) -> Handler:
    """A 200 event stream of ``lines`` (each a whole line), then ``[DONE]`` if ``done``."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for line in lines:
            await response.write(line + b"\n\n")
        if done:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return answer


def body(data: bytes, status: int = 200) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=data, status=status, content_type="application/json")

    return answer


def endless(server: Hostile, status: int = 200, chunk: bytes = b" " * 65536) -> Handler:
    """A body that goes on until the client leaves (at most 1 GiB)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        written = 0
        try:
            while written < 1024 * MIB:
                await response.write(chunk)
                written += len(chunk)
        except ConnectionError:
            pass  # the client stopped reading and closed: what should happen
        server.stopped_writing.append(written)
        return response

    return answer


async def run_one_step(
    hostile: Hostile,
    kind: str,
    *,
    requests: int = 3,
    exporter: bool = False,
    timeout_s: float = 10.0,
    max_response_bytes: int = 16 * MIB,
    max_metrics_bytes: int = 64 * MIB,
) -> StepResult:
    plan = Plan(
        (Load("concurrency", 1),), duration_s=60, requests=requests, warmup_s=0,
        timeout_s=timeout_s, max_response_bytes=max_response_bytes,
        max_metrics_bytes=max_metrics_bytes,
    )  # fmt: skip
    specs = synthetic_requests({kind: 1.0}, Lengths("fixed", (1,)), Lengths("fixed", (2,)), 0)
    target = Target(f"{hostile.url}/v1", hostile.url if exporter else None)
    results = await Runner(plan, target, specs, asyncio.Event()).run()
    assert len(results) == 1
    return results[0]


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (b"data: 1", "malformed"),
        (b"data: null", "malformed"),
        (b'data: "x"', "malformed"),
        (b"data: [1, 2]", "malformed"),
        (b"data: {not json", "malformed"),
        (b'data: {"choices": [1]}', "malformed"),
        (b'data: {"choices": {"text": "a"}}', "malformed"),
        (b'data: {"choices": [{"delta": 5}]}', "malformed"),
        (b'data: {"choices": [{"text": 7}]}', "malformed"),
        (b'data: {"usage": 5}', "malformed"),
        (b'data: {"usage": {"completion_tokens": "many"}}', "malformed"),
        (b'data: {"usage": {"completion_tokens": -1}}', "malformed"),
        (b'data: {"usage": {"completion_tokens": true}}', "malformed"),
        (b'data: {"error": {"message": "boom"}}', "stream"),
        (b"data: " + b"x" * (2 * MIB), "too_large"),  # one line past the 1 MiB bound
    ],
)
async def test_a_malformed_event_is_one_error_of_its_kind(
    hostile: Hostile, line: bytes, kind: str
) -> None:
    hostile.completions = events(b'data: {"choices": [{"text": "a"}]}', line)
    result = await run_one_step(hostile, "completions-stream")
    assert result.errors == {kind: 3}
    assert result.ok == 0


async def test_a_stream_cut_before_done_is_a_stream_error(hostile: Hostile) -> None:
    hostile.completions = events(b'data: {"choices": [{"text": "a"}]}', done=False)
    assert (await run_one_step(hostile, "completions-stream")).errors == {"stream": 3}


async def test_a_well_formed_stream_still_counts_its_tokens(hostile: Hostile) -> None:
    hostile.completions = events(
        b'data: {"choices": [{"text": "a"}]}',
        b'data: {"choices": [{"delta": {"content": "b"}}], "usage": null}',
        b'data: {"choices": [], "usage": {"completion_tokens": 2}}',
    )
    result = await run_one_step(hostile, "completions-stream")
    assert result.errors == {} and result.ok == 3
    assert result.ttft_ms and result.tpot_ms


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"5", "malformed"),
        (b"not json", "malformed"),
        (b"[" * 100_000, "malformed"),
        (b'{"usage": 5}', "malformed"),
        (b'{"usage": {"completion_tokens": "x"}}', "malformed"),
        (b'{"usage": {"completion_tokens": 3}}', None),
    ],
)
async def test_a_malformed_body_is_one_error_of_its_kind(
    hostile: Hostile, data: bytes, kind: str | None
) -> None:
    hostile.completions = body(data)
    result = await run_one_step(hostile, "completions")
    assert result.errors == ({kind: 3} if kind else {})


async def test_a_body_past_the_bound_is_too_large_and_read_no_further(hostile: Hostile) -> None:
    hostile.completions = endless(hostile)
    result = await run_one_step(hostile, "completions", requests=2, max_response_bytes=MIB)
    assert result.errors == {"too_large": 2}
    assert len(hostile.stopped_writing) == 2
    # The client closed once past its bound; what the server got into the socket
    # before it noticed is the kernel's buffers, far from the 1 GiB it would send.
    assert max(hostile.stopped_writing) < 256 * MIB


async def test_a_declared_length_past_the_bound_is_too_large_at_once(hostile: Hostile) -> None:
    hostile.completions = body(b"{}" + b" " * (2 * MIB))
    result = await run_one_step(hostile, "completions", max_response_bytes=MIB)
    assert result.errors == {"too_large": 3}


async def test_a_huge_error_body_is_its_status_and_is_not_read(hostile: Hostile) -> None:
    hostile.completions = endless(hostile, status=500)
    result = await run_one_step(hostile, "completions", requests=2)
    assert result.errors == {"status 500": 2}
    assert max(hostile.stopped_writing) < 256 * MIB


async def test_the_timeout_covers_a_body_that_never_ends(hostile: Hostile) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for _ in range(600):  # a byte every 0.1 s: a minute for 600 bytes
            await response.write(b" ")
            await asyncio.sleep(0.1)
        return response

    hostile.completions = trickle
    result = await run_one_step(hostile, "completions", requests=1, timeout_s=0.5)
    assert result.errors == {"timeout": 1}


@pytest.mark.parametrize(
    ("metrics", "why"),
    [
        ("<html><body>not an exporter</body></html>\n", "not Prometheus text: line 1"),
        ('gpuscope_request_phase_seconds_bucket{phase="queue"} 1\n', "without a numeric 'le'"),
        ('gpuscope_request_phase_seconds_bucket{phase="queue",le="x"} 1\n', "numeric 'le'"),
        ('gpuscope_request_duration_seconds_count{route="/v1/c"} NaN\n', "not a count"),
        ("gpuscope_batch_size_count 1 2 3\n", "not Prometheus text: line 1"),
        (None, "larger than 1 MiB"),
    ],
)
async def test_a_broken_metrics_page_costs_the_step_its_exporter_view_only(
    hostile: Hostile, metrics: str | None, why: str
) -> None:
    hostile.completions = body(b'{"usage": {"completion_tokens": 2}}')
    if metrics is None:  # 1 GiB of one valid sample after another, read to the bound
        hostile.metrics = endless(hostile, chunk=b"gpuscope_gpu_up 1\n" * 4096)
    else:
        hostile.metrics = body(metrics.encode())
    # A bound of 1 MiB: the default's 64 MiB takes seconds to parse on a loaded machine.
    result = await run_one_step(hostile, "completions", exporter=True, max_metrics_bytes=MIB)
    assert result.ok == 3 and result.server is None
    assert len(result.notes) == 1 and why in result.notes[0], result.notes


async def test_a_poisoned_sum_leaves_that_phase_out_of_the_view(hostile: Hostile) -> None:
    scrapes = iter(["", "+Inf"])

    async def metrics(request: web.Request) -> web.StreamResponse:
        total = next(scrapes, "+Inf")
        lines = [
            f'gpuscope_request_phase_seconds_bucket{{phase="queue",le="+Inf"}} {3 if total else 0}',
            f'gpuscope_request_phase_seconds_sum{{phase="queue"}} {total or 0}',
            f'gpuscope_request_phase_seconds_count{{phase="queue"}} {3 if total else 0}',
            f'gpuscope_request_duration_seconds_count{{route="/v1/c"}} {3 if total else 0}',
        ]
        return web.Response(text="\n".join(lines) + "\n")

    hostile.completions = body(b"{}")
    hostile.metrics = metrics
    result = await run_one_step(hostile, "completions", exporter=True)
    assert result.server is not None and result.server.requests == 3
    assert result.server.phase_mean_ms == {}  # not inf, nor NaN shares


async def test_a_request_that_timed_out_stays_in_its_own_steps_view(hostile: Hostile) -> None:
    """The server finishes a request after the client gave up on it; the step waited
    only for the answered ones, and the late one landed in the next step's phases (a
    compute mean of 594 ms for a step whose requests took 50)."""
    finished = 0

    async def slow(request: web.Request) -> web.StreamResponse:
        nonlocal finished
        await asyncio.sleep(1.0)  # timed: past the client's 0.3 s timeout
        finished += 1
        return web.json_response({})

    async def metrics(request: web.Request) -> web.StreamResponse:
        lines = [
            f'gpuscope_request_phase_seconds_bucket{{phase="compute",le="+Inf"}} {finished}',
            f'gpuscope_request_phase_seconds_sum{{phase="compute"}} {finished * 1.0}',
            f'gpuscope_request_phase_seconds_count{{phase="compute"}} {finished}',
            f'gpuscope_request_duration_seconds_count{{route="/v1/c"}} {finished}',
        ]
        return web.Response(text="\n".join(lines) + "\n")

    hostile.completions = slow
    hostile.metrics = metrics
    result = await run_one_step(hostile, "completions", requests=1, exporter=True, timeout_s=0.3)
    assert result.errors == {"timeout": 1}
    assert result.server is not None and result.server.requests == 1


async def test_an_exporter_restarted_during_the_step_gives_no_view_not_a_negative_one(
    hostile: Hostile,
) -> None:
    """Its counters began again mid-step: the differences came out negative and were
    printed as the step's phases (``compute -35.50 ms``), with exit 0."""
    scrapes = iter([500, 3])  # before the step: 500 requests; after: 3 (restarted)

    async def metrics(request: web.Request) -> web.StreamResponse:
        count = next(scrapes, 3)
        lines = [
            f'gpuscope_request_phase_seconds_bucket{{phase="compute",le="+Inf"}} {count}',
            f'gpuscope_request_phase_seconds_sum{{phase="compute"}} {count * 0.05}',
            f'gpuscope_request_phase_seconds_count{{phase="compute"}} {count}',
            f'gpuscope_request_duration_seconds_count{{route="/v1/c"}} {count}',
        ]
        return web.Response(text="\n".join(lines) + "\n")

    hostile.completions = body(b"{}")
    hostile.metrics = metrics
    result = await run_one_step(hostile, "completions", exporter=True)
    assert result.ok == 3 and result.server is None
    assert any("counters went down" in note for note in result.notes), result.notes


def test_the_command_reports_every_kind_and_the_note_then_exits_1(hostile_process: str) -> None:
    argv = [sys.executable, "-m", "gpuscope", "loadgen", "--url", f"{hostile_process}/v1"]
    argv += ["--exporter-url", hostile_process, "--concurrency", "1", "--requests", "6"]
    argv += ["--warmup-s", "0", "--mix", "completions-stream=1", "--json", "-"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr  # requests failed; the run still reported
    report = json.loads(done.stdout)
    (step,) = report["steps"]
    assert step["sent"] == 6
    assert step["errors"] == {"malformed": 2, "stream": 2, "too_large": 2}
    assert "Traceback" not in done.stderr
    assert "no exporter view" in done.stderr


HOSTILE_SERVER = """
import itertools
from aiohttp import web
answers = itertools.cycle([b"data: 1", b'data: {"error": {}}', b"data: " + b"x" * (2 << 20)])
async def models(request):
    return web.json_response({"data": [{"id": "m"}]})
async def completions(request):
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(next(answers) + b"\\n\\n")
    return response
async def metrics(request):
    return web.Response(text="<html>\\n")
app = web.Application()
app.router.add_get("/v1/models", models)
app.router.add_post("/v1/completions", completions)
app.router.add_get("/metrics", metrics)
web.run_app(app, host="127.0.0.1", port=int(__import__("sys").argv[1]), print=None)
"""


@pytest.fixture
def hostile_process() -> Iterator[str]:
    """The hostile server in a process of its own, for the command run as a process."""
    from gpuscope.children import free_port, wait_ready

    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", HOSTILE_SERVER, str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(wait_ready("hostile server", f"{url}/v1/models", process))
        yield url
    finally:
        process.kill()
        process.wait(10)
