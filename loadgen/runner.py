"""Run a ladder of load steps against one endpoint and summarise each step.

Closed loop: ``concurrency`` clients, each sending its next request when the last one
ends. Open loop: requests arrive at ``rate`` per second (constant gaps or Poisson); one
that cannot start on time (the client is more than ``late_ms`` behind its schedule, or
``max_in_flight`` requests are already open) is counted as missed and not sent, so an
overloaded server shows up as missed sends instead of a quietly lower rate.
A step ends after ``duration_s`` or ``requests`` requests, whichever comes first; open
requests then finish (bounded by the request timeout). Setting ``stop`` (Ctrl-C)
cancels what is open and returns the steps measured so far, the last one marked
interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gpuscope.loadgen.client import DEFAULT_MAX_BODY_BYTES, Outcome, discover_model, send
from gpuscope.loadgen.engine_metrics import BUILDERS
from gpuscope.loadgen.probe import DEFAULT_MAX_METRICS_BYTES, ExporterProbe, ProbeFailed
from gpuscope.loadgen.results import Load, StepResult, summarize
from gpuscope.loadgen.server_view import Snapshot, went_down
from gpuscope.loadgen.workload import RequestSpec

ARRIVALS = ("poisson", "constant")


@dataclass(frozen=True)
class Plan:
    loads: tuple[Load, ...]
    duration_s: float = 10.0
    requests: int = 0  # per step; 0: no count bound
    warmup_s: float = 1.0
    arrival: str = "poisson"
    seed: int = 0
    timeout_s: float = 30.0
    max_in_flight: int = 512
    late_ms: float = 10.0
    config: str = ""  # what the record calls this configuration
    max_response_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_metrics_bytes: int = DEFAULT_MAX_METRICS_BYTES


@dataclass(frozen=True)
class Target:
    url: str  # the OpenAI base URL, ending in /v1
    exporter_url: str | None = None  # whose /metrics give the server-side view
    model: str | None = None
    metrics_format: str = "exporter"  # a key of engine_metrics.BUILDERS
    # the engine's own /metrics, read around the same requests as exporter_url, and a
    # folder where the two scrapes that bound each step are kept
    engine_url: str | None = None
    engine_format: str = "vllm"  # a key of engine_metrics.BUILDERS
    engine_dump: Path | None = None


@dataclass
class Live:
    """What the progress line shows while a step runs."""

    index: int
    steps: int
    load: Load
    started_s: float
    outcomes: list[Outcome]
    missed_late: int = 0  # the client fell more than late_ms behind its schedule
    missed_full: int = 0  # max_in_flight requests were open

    @property
    def missed(self) -> int:
        return self.missed_late + self.missed_full


Tick = Callable[[Live], None]


class Runner:
    def __init__(
        self,
        plan: Plan,
        target: Target,
        specs: Iterator[RequestSpec],
        stop: asyncio.Event,
        *,
        tick: Tick | None = None,
        on_step: Callable[[StepResult], None] | None = None,
    ) -> None:
        self.plan, self.target, self.specs, self.stop = plan, target, specs, stop
        self.tick = tick
        self.on_step = on_step
        self.model = target.model or ""
        self.url = target.url.rstrip("/")
        self.probe_problem = ""  # why the last scrape of the exporter gave nothing

    async def run(self) -> list[StepResult]:
        timeout = aiohttp.ClientTimeout(total=self.plan.timeout_s)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        results: list[StepResult] = []
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as scrape,
        ):
            if not self.model:
                self.model = await discover_model(session, self.url)
            probe = (
                ExporterProbe(
                    scrape,
                    self.target.exporter_url,
                    self.plan.max_metrics_bytes,
                    BUILDERS[self.target.metrics_format],
                )
                if self.target.exporter_url
                else None
            )
            engine = (
                ExporterProbe(
                    scrape,
                    self.target.engine_url,
                    self.plan.max_metrics_bytes,
                    BUILDERS[self.target.engine_format],
                    keep_text=self.target.engine_dump is not None,
                )
                if self.target.engine_url
                else None
            )
            before = await self._scrape(probe.snapshot()) if probe else None
            engine_before = await self._scrape(engine.snapshot()) if engine else None
            if self.plan.warmup_s > 0 and self.plan.loads:
                warm = await self._step(session, -1, self.plan.loads[0], warmup=True)
                # both views start after the warm-up has been counted: its requests are
                # in neither the exporter's step nor the engine's
                if probe and before:
                    before = await self._scrape(probe.settle(before, _traced(warm.outcomes)))
                if engine and engine_before:
                    engine_before = await self._scrape(
                        engine.settle(engine_before, _traced(warm.outcomes))
                    )
            for index, load in enumerate(self.plan.loads):
                if self.stop.is_set():
                    break
                self._keep(engine, index, "before")
                result, before, answered = await self._measured(session, probe, before, index, load)
                if engine is not None and not self.stop.is_set():
                    result, engine_before = await self._engine_view(
                        engine, engine_before, result, index, answered
                    )
                results.append(result)
                if self.on_step is not None:
                    self.on_step(result)
        return results

    async def _measured(
        self,
        session: aiohttp.ClientSession,
        probe: ExporterProbe | None,
        before: Snapshot | None,
        index: int,
        load: Load,
    ) -> tuple[StepResult, Snapshot | None, int]:
        """The step's result, the scrape the next step starts from, and how many of its
        requests the server answered with a status it traces."""
        sampler = asyncio.create_task(probe.sample_gauges()) if probe else None
        live = await self._step(session, index, load)
        window = time.monotonic() - live.started_s
        server = None
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        started_unseen = probe is not None and before is None
        if probe is not None and not self.stop.is_set():
            if before is None:  # the scrape before failed: this one starts the next step
                before = await self._scrape(probe.snapshot())
            else:
                # The requests that timed out too: the server may still finish them, and
                # then they belong to this step's view, not to the next one's.
                settled = probe.settle(before, _traced(live.outcomes) + _timed_out(live.outcomes))
                after = await self._scrape(settled)
                if after is not None and went_down(before, after):
                    self.probe_problem = "its counters went down during the step (a restart)"
                else:
                    server = None if after is None else probe.view(before, after)
                before = after
        result = summarize(
            load,
            live.outcomes,
            window,
            missed=live.missed,
            config=self.plan.config,
            interrupted=self.stop.is_set(),
            server=server,
        )
        if live.missed:
            result.notes.append(
                f"{live.missed} sends missed: {live.missed_late} late by more than "
                f"{self.plan.late_ms:g} ms (the client fell behind its schedule), "
                f"{live.missed_full} with --max-in-flight requests open"
            )
        if probe is not None and server is None and not self.stop.is_set():
            problem = self.probe_problem
            if started_unseen:
                problem = f"the scrape before this step failed ({problem})"
            result.notes.append(f"no exporter view: {problem}")
        if server is not None and server.requests < _traced(live.outcomes):
            result.notes.append(
                f"the exporter counted {server.requests} of {_traced(live.outcomes)} requests"
            )
        return result, before, _traced(live.outcomes)

    async def _engine_view(
        self,
        engine: ExporterProbe,
        before: Snapshot | None,
        result: StepResult,
        index: int,
        answered: int,
    ) -> tuple[StepResult, Snapshot | None]:
        """The engine's own account of the step just measured, set on its result."""
        if before is None:
            result.notes.append(f"no engine view: {self.probe_problem}")
            return result, await self._scrape(engine.snapshot())
        after = await self._scrape(engine.settle(before, answered))
        if after is None:
            result.notes.append(f"no engine view: {self.probe_problem}")
            return result, None
        self._keep(engine, index, "after")
        if went_down(before, after):
            result.notes.append("no engine view: its counters went down during the step")
            return result, after
        view = engine.view(before, after)
        if view.requests < answered:
            result.notes.append(f"the engine counted {view.requests} of {answered} requests")
        return dataclasses.replace(result, engine=view), after

    def _keep(self, engine: ExporterProbe | None, index: int, when: str) -> None:
        """The engine's last scrape, as the text of the step's bound ``when``."""
        folder = self.target.engine_dump
        if engine is None or folder is None or not engine.last_text:
            return
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"step-{index + 1}-{when}.prom").write_text(engine.last_text)

    async def _scrape(self, scraping: Awaitable[Snapshot]) -> Snapshot | None:
        """What ``scraping`` gives, or None with the reason kept in ``probe_problem``."""
        try:
            return await scraping
        except ProbeFailed as exc:
            self.probe_problem = str(exc)
            return None

    async def _step(
        self, session: aiohttp.ClientSession, index: int, load: Load, *, warmup: bool = False
    ) -> Live:
        live = Live(index, len(self.plan.loads), load, time.monotonic(), [])
        seconds = self.plan.warmup_s if warmup else self.plan.duration_s
        count = 0 if warmup else self.plan.requests
        deadline = live.started_s + seconds
        if load.mode == "concurrency":
            work: Awaitable[None] = self._closed(session, live, deadline, count)
        else:
            work = self._open(session, live, deadline, count, random.Random(self.plan.seed + index))
        ticker = asyncio.create_task(self._ticks(live)) if self.tick and not warmup else None
        try:
            await _until_stopped(work, self.stop)
        finally:
            if ticker is not None:
                ticker.cancel()
        return live

    async def _ticks(self, live: Live) -> None:
        assert self.tick is not None
        while True:
            self.tick(live)
            await asyncio.sleep(0.5)

    async def _closed(
        self, session: aiohttp.ClientSession, live: Live, deadline: float, count: int
    ) -> None:
        issued = 0

        async def client() -> None:
            nonlocal issued
            while time.monotonic() < deadline and (not count or issued < count):
                issued += 1
                live.outcomes.append(await self._send(session, next(self.specs)))

        await asyncio.gather(*(client() for _ in range(int(live.load.value))))

    async def _open(
        self,
        session: aiohttp.ClientSession,
        live: Live,
        deadline: float,
        count: int,
        rng: random.Random,
    ) -> None:
        open_tasks: set[asyncio.Task[None]] = set()
        try:
            await self._arrivals(session, live, deadline, count, rng, open_tasks)
            if open_tasks:
                await asyncio.gather(*open_tasks)
        finally:  # on Ctrl-C, the open requests are cancelled, not left running
            for task in open_tasks:
                task.cancel()
            await asyncio.gather(*open_tasks, return_exceptions=True)

    async def _arrivals(
        self,
        session: aiohttp.ClientSession,
        live: Live,
        deadline: float,
        count: int,
        rng: random.Random,
        open_tasks: set[asyncio.Task[None]],
    ) -> None:
        rate = live.load.value
        late_s = self.plan.late_ms / 1000
        due = live.started_s
        scheduled = 0
        while due < deadline and (not count or scheduled < count):
            # Behind schedule the sends are counted missed without awaiting anything, so
            # yield anyway: answers, the progress line and Ctrl-C must still get through.
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            scheduled += 1
            spec = next(self.specs)  # drawn even when missed, so the sequence stays the same
            if len(open_tasks) >= self.plan.max_in_flight:
                live.missed_full += 1
            elif time.monotonic() - due > late_s:
                live.missed_late += 1
            else:
                task = asyncio.create_task(self._record(session, spec, live))
                open_tasks.add(task)
                task.add_done_callback(open_tasks.discard)
            if self.plan.arrival == "poisson":
                due += rng.expovariate(rate)
            else:  # by index: adding 1/rate up drifted, and 10/s for 10 s sent 101
                due = live.started_s + scheduled / rate

    async def _record(self, session: aiohttp.ClientSession, spec: RequestSpec, live: Live) -> None:
        live.outcomes.append(await self._send(session, spec))

    async def _send(self, session: aiohttp.ClientSession, spec: RequestSpec) -> Outcome:
        plan = self.plan
        return await send(
            session, self.url, self.model, spec,
            timeout_s=plan.timeout_s, max_body_bytes=plan.max_response_bytes,
        )  # fmt: skip


def _timed_out(outcomes: list[Outcome]) -> int:
    return sum(1 for o in outcomes if o.error == "timeout")


def _traced(outcomes: list[Outcome]) -> int:
    """Requests the server answered with a status it traces (a 404 route may not be)."""
    return sum(1 for o in outcomes if o.answered and o.error != "status 404")


async def _until_stopped(work: Awaitable[None], stop: asyncio.Event) -> None:
    """Run ``work``; if ``stop`` is set first, cancel it (open requests included)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, stopper):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    if task.done() and not task.cancelled():
        task.result()  # re-raise a failure of the load itself
