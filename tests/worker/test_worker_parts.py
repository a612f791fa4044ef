"""The worker's parts without HTTP: configuration, models, schedulers, shutdown."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import pytest

from gpuscope import flags
from gpuscope.middleware import BatchRecorder, RequestTimeline
from gpuscope.middleware.timeline import DISPATCHED
from gpuscope.worker import protocol, responses
from gpuscope.worker.backends import load_backend, numpy_models
from gpuscope.worker.config import BatchingMode, ConfigError, WorkerConfig
from gpuscope.worker.embedding import EmbeddingScheduler
from gpuscope.worker.generation import GenerationScheduler
from gpuscope.worker.kv_cache import SequenceState
from gpuscope.worker.model_api import EmbeddingModel, Generator
from gpuscope.worker.scheduler import (
    BatchPolicy,
    DeviceThread,
    QueueFull,
    ShuttingDown,
)
from support.span_recorder import SpanRecorder
from support.worker_servers import SMALL, Gate, GatedEmbeddingModel, attrs

T = TypeVar("T")


def parse_config(argv: list[str], environ: dict[str, str] | None = None) -> WorkerConfig:
    return flags.parse(WorkerConfig, argv, environ, exit_on_error=False)


def test_worker_config_flags_env_twins_and_errors_that_name_the_flag() -> None:
    env = {"GPUSCOPE_MAX_BATCH_SIZE": "32", "GPUSCOPE_BATCHING": "continuous"}
    config = parse_config(["--batching", "static", "--serve", "embeddings"], env)
    assert config.batching == "static"  # the flag wins over its twin
    assert config.max_batch_size == 32
    assert config.serve == ("embeddings",)
    assert parse_config([], {"GPUSCOPE_NO_TRACING": "true"}).no_tracing
    assert parse_config(["--no-tracing"], {}).no_tracing
    with pytest.raises(ConfigError, match="--max-queue-delay-ms"):
        parse_config([], {"GPUSCOPE_MAX_QUEUE_DELAY_MS": "soon"})
    with pytest.raises(ConfigError, match="--batching"):
        parse_config(["--batching", "greedy"], {})
    with pytest.raises(ConfigError, match="--gpu-uuid"):
        parse_config(["--gpu-uuid", "1234"], {})
    with pytest.raises(ConfigError, match="--max-batch-size"):
        WorkerConfig(max_batch_size=0)


def test_worker_cpu_backend_is_numpy_and_reports_the_simulated_uuid() -> None:
    backend = load_backend(replace(SMALL, device="cpu", gpu_uuid="GPU-sim-0"))
    assert backend.name == "numpy"
    assert backend.gpu_uuid == "GPU-sim-0"
    assert isinstance(backend.embedding, EmbeddingModel)
    assert isinstance(backend.generator, Generator)


def test_worker_models_are_seeded_and_batch_invariant() -> None:
    embedding, generator = numpy_models(SMALL)
    again, _ = numpy_models(SMALL)
    other, _ = numpy_models(replace(SMALL, seed=1))
    texts = [[1, 2, 3], [40, 50], [7]]
    batched = embedding.embed(texts)
    assert batched.shape == (3, SMALL.hidden_size)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, rtol=1e-5)
    for row, text in zip(batched, texts, strict=True):  # a row does not depend on its batch
        np.testing.assert_allclose(row, embedding.embed([text])[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(batched, again.embed(texts))
    assert not np.allclose(batched, other.embed(texts))
    alone = generator.start([5, 6, 7])
    together = [generator.start([5, 6, 7]), generator.start([9])]
    solo_tokens = [generator.step([alone])[0] for _ in range(6)]
    joint_tokens = [generator.step(together)[0] for _ in range(6)]
    assert solo_tokens == joint_tokens  # greedy decoding, unaffected by batch mates


def test_worker_generator_packs_prefill_with_decode_and_grows_its_cache() -> None:
    """Sequences that join a running batch (their prefill packed with the others'
    decode, as under continuous batching) change no one's tokens, past cache growth."""
    _, generator = numpy_models(SMALL)
    prompts = [[5, 6, 7], list(range(40, 70)), [9]]
    alone = []
    for prompt in prompts:
        state = generator.start(prompt)
        alone.append([generator.step([state])[0] for _ in range(40)])
    states: list[SequenceState] = []
    together: list[list[int]] = [[] for _ in prompts]
    for iteration in range(40 + 2 * 5):
        if iteration % 5 == 0 and len(states) < len(prompts):  # a newcomer every 5 steps
            states.append(generator.start(prompts[len(states)]))
        live = [i for i in range(len(states)) if len(together[i]) < 40]
        for i, token in zip(live, generator.step([states[i] for i in live]), strict=True):
            together[i].append(token)
    assert together == alone


def test_worker_embeddings_base64_matches_float() -> None:
    request = protocol.EmbeddingsRequest(((1, 2),), base64=True, dimensions=None)
    vectors = np.asarray([[0.5, -0.25]], dtype=np.float32)
    body = responses.embeddings_body(request, vectors, "m")
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, vectors[0])


def _scheduler(
    model: EmbeddingModel, span_recorder: SpanRecorder, **policy: float | int | BatchingMode
) -> EmbeddingScheduler:
    settings: dict[str, Any] = {
        "mode": BatchingMode.DYNAMIC,
        "max_batch_size": 4,
        "max_queue_delay_s": 0.005,
        "max_queue": 8,
    } | policy
    recorder = BatchRecorder(max_size=4, model="m", tracer_provider=span_recorder.provider)
    return EmbeddingScheduler(model, BatchPolicy(**settings), recorder, DeviceThread())


async def test_worker_scheduler_marks_every_phase_and_fills_batches(
    span_recorder: SpanRecorder,
) -> None:
    embedding, _ = numpy_models(SMALL)
    scheduler = _scheduler(embedding, span_recorder)
    scheduler.start()
    timelines = [RequestTimeline() for _ in range(8)]
    results = await asyncio.gather(
        *(scheduler.embed([[i + 1]], tl, timeout_s=10) for i, tl in enumerate(timelines))
    )
    await scheduler.close(1.0)
    assert [r.shape for r in results] == [(1, SMALL.hidden_size)] * 8
    for timeline in timelines:
        phases = timeline.phase_seconds()
        assert {"preprocess", "queue", "batch_wait", "compute"} <= set(phases)
        assert all(seconds >= 0 for seconds in phases.values())
    sizes = sorted(attrs(s)["gpuscope.batch.size"] for s in span_recorder.batches())
    assert sum(sizes) == 8
    assert max(sizes) == 4  # submitted together: full batches
    assert {timeline.batch_size for timeline in timelines} == {4}


class WatchedDevice(DeviceThread):
    """A device thread that says when the second piece of work (the batch, after the
    work that keeps it busy) is handed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.batch_handed_over = asyncio.Event()

    async def run(self, fn: Callable[[], T]) -> T:
        self.calls += 1
        if self.calls == 2:
            self.batch_handed_over.set()
        return await super().run(fn)


async def test_worker_batch_wait_ends_when_the_batch_is_handed_to_a_busy_device(
    span_recorder: SpanRecorder,
) -> None:
    """Another model's work holds the device thread while an embeddings batch closes:
    the wait behind it is the batch's compute, not its window."""

    embedding, _ = numpy_models(SMALL)
    device = WatchedDevice()
    policy = BatchPolicy(BatchingMode.DYNAMIC, 4, 0.005, 8)
    recorder = BatchRecorder(max_size=4, model="m", tracer_provider=span_recorder.provider)
    scheduler = EmbeddingScheduler(embedding, policy, recorder, device)
    scheduler.start()
    release = threading.Event()
    held = asyncio.ensure_future(device.run(release.wait))
    timeline = RequestTimeline()
    request = asyncio.ensure_future(scheduler.embed([[1, 2]], timeline, timeout_s=10))
    await device.batch_handed_over.wait()  # the batch closed, its window over
    await asyncio.sleep(0.1)  # timed: the device stays busy with the other work meanwhile
    released_ns = time.perf_counter_ns()
    release.set()
    await asyncio.gather(held, request)
    await scheduler.close(1.0)
    dispatched_ns = timeline.mark_ns(DISPATCHED)
    assert dispatched_ns is not None and dispatched_ns < released_ns
    phases = timeline.phase_seconds()
    assert phases["compute"] >= 0.1
    assert phases["batch_wait"] < phases["compute"]


async def test_worker_continuous_iteration_handed_to_a_busy_device_is_compute(
    span_recorder: SpanRecorder,
) -> None:
    """The same under continuous batching: a sequence joins an iteration that waits for
    the device thread; that wait is the iteration's compute, not the sequence's window."""
    _, generator = numpy_models(SMALL)
    device = WatchedDevice()
    policy = BatchPolicy(BatchingMode.CONTINUOUS, 4, 0.0, 8)
    recorder = BatchRecorder(max_size=4, model="m", tracer_provider=span_recorder.provider)
    scheduler = GenerationScheduler(generator, policy, recorder, device)
    scheduler.start()
    loop, busy, release = asyncio.get_running_loop(), asyncio.Event(), threading.Event()

    def other_work() -> None:
        loop.call_soon_threadsafe(busy.set)
        release.wait()

    held = asyncio.ensure_future(device.run(other_work))
    await busy.wait()  # the device is taken before the sequence arrives
    timeline = RequestTimeline()
    (stream,) = scheduler.generate_all([[1, 2, 3]], 2, timeline, timeout_s=10)

    async def tokens() -> list[int]:
        return [token async for token in stream]

    request = asyncio.ensure_future(tokens())
    await device.batch_handed_over.wait()  # the first iteration is launched
    await asyncio.sleep(0.1)  # timed: behind the other work
    released_ns = time.perf_counter_ns()
    release.set()
    _, got = await asyncio.gather(held, request)
    await scheduler.close(1.0)
    assert len(got) == 2
    dispatched_ns = timeline.mark_ns(DISPATCHED)
    assert dispatched_ns is not None and dispatched_ns < released_ns
    phases = timeline.phase_seconds()
    assert phases["compute"] >= 0.1
    assert phases["batch_wait"] < phases["compute"]


@pytest.mark.parametrize("device_frees_in_time", [True, False])
async def test_worker_scheduler_shutdown_finishes_or_cancels(
    device_frees_in_time: bool, span_recorder: SpanRecorder
) -> None:
    gate = Gate()
    embedding, _ = numpy_models(SMALL)
    scheduler = _scheduler(
        GatedEmbeddingModel(embedding, gate), span_recorder, mode=BatchingMode.NONE, max_queue=2
    )
    scheduler.start()
    gate.close()
    running = asyncio.create_task(scheduler.embed([[1]], RequestTimeline(), timeout_s=30))
    await asyncio.to_thread(gate.entered.wait, 10)  # the first request holds the device
    queued = [scheduler.submit([[value]], RequestTimeline()) for value in (2, 3)]
    with pytest.raises(QueueFull):
        scheduler.submit([[4]], RequestTimeline())
    closing = asyncio.create_task(scheduler.close(5.0 if device_frees_in_time else 0.05))
    await asyncio.to_thread(lambda: None)  # one round trip: close() has begun
    with pytest.raises(ShuttingDown):  # no longer accepting
        scheduler.submit([[9]], RequestTimeline())
    if device_frees_in_time:
        gate.open()
    await closing
    gate.open()
    outcomes = await asyncio.gather(running, *(i.future for i in queued), return_exceptions=True)
    if device_frees_in_time:  # everything accepted was finished
        assert all(isinstance(o, np.ndarray) for o in outcomes)
    else:  # the deadline passed: what was left got 503
        assert all(isinstance(o, ShuttingDown) for o in outcomes)
    assert scheduler.counters.rejected_queue_full == 1


def test_worker_cli_rejects_bad_flags_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuscope.worker.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["--max-queue", "-1"])
    assert refused.value.code == 2
    assert "gpuscope worker: --max-queue: must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as shown:
        main(["--help"])
    assert shown.value.code == 0
    assert "GPUSCOPE_MAX_QUEUE_DELAY_MS" in capsys.readouterr().out
