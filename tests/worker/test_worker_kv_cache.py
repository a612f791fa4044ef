"""The paged key/value cache: the block pool, attention through block tables, and the
generation scheduler's admission, preemption and block accounting on top of it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import replace

import httpx
import pytest

from gpuscope import flags
from gpuscope.middleware import BatchRecorder, RequestTimeline
from gpuscope.worker.backends import numpy_models
from gpuscope.worker.config import BatchingMode, ConfigError, WorkerConfig
from gpuscope.worker.generation import CacheTooSmall, GenerationScheduler, TokenStream
from gpuscope.worker.kv_cache import BlockPool, KvCacheFull, SequenceState
from gpuscope.worker.model_api import Generator
from gpuscope.worker.numpy_models import NumpyTokenGenerator
from gpuscope.worker.scheduler import BatchPolicy, DeviceThread
from support.span_recorder import SpanRecorder
from support.worker_servers import SMALL, Gate, GatedGenerator, serve_worker


def parse_config(argv: list[str], environ: dict[str, str] | None = None) -> WorkerConfig:
    return flags.parse(WorkerConfig, argv, environ, exit_on_error=False)


PROMPTS = [[5, 6, 7, 8, 9], list(range(40, 52)), [9], [70, 71, 72], list(range(100, 107))]
MAX_TOKENS = [24, 18, 30, 12, 20]


def _generator(blocks: int, block_size: int) -> NumpyTokenGenerator:
    _, generator = numpy_models(replace(SMALL, kv_cache_blocks=blocks, kv_block_size=block_size))
    return generator


class CheckedGenerator(GatedGenerator):
    """Checks at every step that the stepped sequences hold distinct blocks, enough for
    their tokens, and never more than the pool has; records the most blocks in use."""

    def __init__(self, inner: Generator) -> None:
        super().__init__(inner, Gate())
        self.most_used = 0
        self.steps = 0

    def step(self, sequences: Sequence[SequenceState]) -> list[int]:
        pool = self.kv_pool
        held = [block for state in sequences for block in state.blocks]
        assert len(held) == len(set(held)), "a block is in two block tables"
        assert len(held) <= pool.used <= pool.total
        for state in sequences:
            assert pool.blocks_for(len(state.tokens)) <= len(state.blocks), "not reserved"
        self.most_used = max(self.most_used, pool.used)
        self.steps += 1
        return super().step(sequences)


def _scheduler(
    model: Generator,
    spans: SpanRecorder,
    mode: BatchingMode = BatchingMode.CONTINUOUS,
    batch: int = 8,
) -> GenerationScheduler:
    policy = BatchPolicy(mode=mode, max_batch_size=batch, max_queue_delay_s=0.0, max_queue=64)
    recorder = BatchRecorder(max_size=batch, model="m", tracer_provider=spans.provider)
    return GenerationScheduler(model, policy, recorder, DeviceThread())


async def _collect(stream: TokenStream) -> list[int]:
    return [token async for token in stream]


async def _generate(scheduler: GenerationScheduler) -> list[list[int]]:
    """Every prompt at once, each with its ``max_tokens``; the tokens each got back."""
    scheduler.start()
    streams = [
        generate(scheduler, prompt, n, RequestTimeline(), timeout_s=60)
        for prompt, n in zip(PROMPTS, MAX_TOKENS, strict=True)
    ]
    try:
        return await asyncio.gather(*map(_collect, streams))
    finally:
        await scheduler.close(5.0)


def generate(
    scheduler: GenerationScheduler,
    prompt: list[int],
    max_tokens: int,
    timeline: RequestTimeline,
    *,
    timeout_s: float,
) -> TokenStream:
    """One sequence, queued as ``generate_all`` queues each of its prompts."""
    return scheduler.generate_all([prompt], max_tokens, timeline, timeout_s=timeout_s)[0]


def _assert_conserved(pool: BlockPool) -> None:
    assert pool.used == 0
    assert pool.allocated_total == pool.freed_total > 0


def test_worker_block_pool_reserves_all_or_nothing_and_maps_slots() -> None:
    pool = BlockPool(blocks=4, block_size=4)
    first, second = SequenceState(tokens=[1] * 6), SequenceState(tokens=[2] * 9)
    assert pool.reserve(first) and first.blocks == [0, 1]
    assert not pool.reserve(second)  # needs 3 blocks, 2 are free: takes none
    assert second.blocks == [] and pool.free == 2
    assert pool.reserve(second, positions=8) and second.blocks == [2, 3]
    assert pool.slots(first, 3, 6) == [3, 4, 5]  # across its block boundary
    assert pool.slots(second, 3, 6) == [11, 12, 13]
    assert pool.tables([first, second, SequenceState([3])], 12) == [
        [0, 1, 0],
        [2, 3, 0],
        [0, 0, 0],
    ]
    first.length = 6
    pool.release(first)
    assert first.blocks == [] and first.length == 0  # to be recomputed
    assert pool.reserve(SequenceState(tokens=[4] * 5)) and pool.free == 0
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(blocks=0, block_size=16)


def test_worker_paged_attention_does_not_depend_on_block_size_or_layout() -> None:
    """One-position blocks handed out interleaved between sequences (the most scattered
    layout) give the tokens of one block per sequence, and of each sequence alone."""
    contiguous, scattered = _generator(64, 64), _generator(600, 1)
    assert scattered.kv_pool.positions >= sum(
        len(p) + n for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)
    )
    alone = []
    for prompt in PROMPTS:
        state = contiguous.start(prompt)
        alone.append([contiguous.step([state])[0] for _ in range(20)])
        contiguous.kv_pool.release(state)
    states = [scattered.start(prompt) for prompt in PROMPTS]
    together: list[list[int]] = [[] for _ in PROMPTS]
    for _ in range(20):
        for i, token in enumerate(scattered.step(states)):
            together[i].append(token)
    blocks = states[0].blocks
    assert any(b != a + 1 for a, b in itertools.pairwise(blocks))  # interleaved with others'
    assert together == alone


def test_worker_generator_step_without_blocks_is_refused() -> None:
    generator = _generator(2, 4)
    state = generator.start(list(range(10, 20)))  # BOS + 10 tokens: 3 blocks
    with pytest.raises(KvCacheFull):
        generator.step([state])
    assert generator.kv_pool.used == 0 and state.length == 0


@pytest.mark.parametrize("mode", [BatchingMode.CONTINUOUS, BatchingMode.STATIC])
async def test_worker_small_pool_gives_the_same_tokens_and_conserves_blocks(
    mode: BatchingMode, span_recorder: SpanRecorder
) -> None:
    """A pool far smaller than the load preempts (continuous) or narrows the batches
    (static); every request gets the tokens it gets with a roomy pool, the steps never
    hold more blocks than the pool has, and every block comes back."""
    roomy = CheckedGenerator(_generator(256, 4))
    expected = await _generate(_scheduler(roomy, span_recorder, mode))
    small = CheckedGenerator(_generator(12, 4))  # 48 positions; the longest request needs 36
    scheduler = _scheduler(small, span_recorder, mode)
    assert await _generate(scheduler) == expected
    assert [len(tokens) for tokens in expected] == MAX_TOKENS
    stats = scheduler.kv_stats()
    assert small.most_used <= 12 and roomy.most_used > 12  # the small pool did constrain
    if mode == BatchingMode.CONTINUOUS:
        assert stats.preemptions_total > 0
    assert stats.iterations_total == small.steps
    assert (stats.running, stats.waiting, stats.blocks_used, stats.blocks_total) == (0, 0, 0, 12)
    _assert_conserved(small.kv_pool)
    _assert_conserved(roomy.kv_pool)


async def test_worker_kv_stats_and_blocks_of_cancelled_requests(
    span_recorder: SpanRecorder,
) -> None:
    """While the device holds a step, the stats show the running batch, the waiting
    queue and the blocks held; cancelled requests, running or waiting, free them all."""
    gated = CheckedGenerator(_generator(12, 4))
    scheduler = _scheduler(gated, span_recorder, batch=2)
    scheduler.start()
    gated.gate.close()
    streams = [
        generate(scheduler, prompt, 30, RequestTimeline(), timeout_s=60) for prompt in PROMPTS
    ]
    await asyncio.to_thread(gated.gate.entered.wait, 10)  # the first step holds the device
    stats = scheduler.kv_stats()
    assert (stats.running, stats.waiting) == (2, 3)
    assert stats.blocks_used == 2 + 4  # BOS + prompt of 5 and of 12, blocks of 4
    assert 0 < stats.usage_ratio < 1
    for stream in streams:
        stream.cancel()
    gated.gate.open()
    await scheduler.close(5.0)
    assert scheduler.counters.cancelled == len(PROMPTS)
    _assert_conserved(gated.kv_pool)


async def test_worker_request_too_big_for_the_whole_pool_is_refused(
    span_recorder: SpanRecorder,
) -> None:
    scheduler = _scheduler(_generator(4, 4), span_recorder)  # 16 positions in all
    scheduler.start()
    with pytest.raises(CacheTooSmall, match="needs 17 key/value cache positions") as refused:
        generate(scheduler, [1] * 5, 12, RequestTimeline(), timeout_s=5)  # BOS + 5 + 11
    assert refused.value.status == 400
    fits = generate(scheduler, [1] * 5, 11, RequestTimeline(), timeout_s=30)
    assert len(await _collect(fits)) == 11
    await scheduler.close(5.0)


async def test_worker_http_answers_400_for_a_request_the_cache_cannot_hold() -> None:
    with serve_worker(kv_cache_blocks=4, kv_block_size=4, batching="continuous") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"model": SMALL.model_name, "prompt": "hello", "max_tokens": 20}
            too_big = await client.post("/v1/completions", json=body)
            fits = await client.post("/v1/completions", json=body | {"max_tokens": 8})
    assert too_big.status_code == 400
    error = too_big.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "--kv-cache-blocks" in error["message"]
    assert fits.status_code == 200


async def test_worker_preempted_requests_cancelled_free_everything(
    span_recorder: SpanRecorder,
) -> None:
    """Cancelled while some sequences wait preempted and others run: every block
    comes back, and the scheduler goes idle."""
    checked = CheckedGenerator(_generator(16, 4))
    scheduler = _scheduler(checked, span_recorder)
    scheduler.start()
    streams = [generate(scheduler, p, 40, RequestTimeline(), timeout_s=60) for p in PROMPTS]
    seen = None
    async for _ in streams[0]:  # the oldest runs on: one token per iteration
        stats = scheduler.kv_stats()
        if stats.preemptions_total and stats.waiting:
            seen = stats
            break
    assert seen is not None, "never preempted"
    assert seen.running + seen.waiting == len(PROMPTS) and seen.blocks_used <= 16
    for stream in streams:
        stream.cancel()
    await scheduler.close(5.0)
    assert scheduler.counters.cancelled == len(PROMPTS)
    assert scheduler.kv_stats().waiting == 0
    _assert_conserved(checked.kv_pool)


async def test_worker_torch_paged_cache_preempts_to_numpy_tokens(
    span_recorder: SpanRecorder,
) -> None:
    """The torch generator reads the same block tables: under a pool that preempts, it
    gives the NumPy generator's tokens (skipped without torch)."""
    torch = pytest.importorskip("torch")
    from gpuscope.worker.torch_models import TorchTokenGenerator

    expected = await _generate(_scheduler(_generator(256, 4), span_recorder))
    on_torch = CheckedGenerator(TorchTokenGenerator(_generator(12, 4), torch.device("cpu")))
    scheduler = _scheduler(on_torch, span_recorder)
    assert await _generate(scheduler) == expected
    assert scheduler.kv_stats().preemptions_total > 0
    _assert_conserved(on_torch.kv_pool)


def test_worker_kv_flags_have_env_twins_and_name_themselves() -> None:
    config = parse_config(["--kv-block-size", "8"], {"GPUSCOPE_KV_CACHE_BLOCKS": "64"})
    assert (config.kv_cache_blocks, config.kv_block_size) == (64, 8)
    generator = numpy_models(config)[1]
    assert (generator.kv_pool.total, generator.kv_pool.block_size) == (64, 8)
    for flag in ("--kv-cache-blocks", "--kv-block-size"):
        with pytest.raises(ConfigError, match=flag):
            parse_config([flag, "0"], {})
