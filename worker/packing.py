"""One iteration's new tokens, packed into one matrix and addressed through the paged
key/value cache: what both backends' generators compute from (no compute here).

A sequence contributes the tokens its cache lacks: its whole prompt on prefill (or,
after a preemption, its prompt and everything generated so far), its last token on
decode. Each token gets the storage slot its keys and values go to; each sequence
gets the slots of its history, read through its block table and padded to the
longest, for attention to gather its keys and values in one indexing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from gpuscope.worker.kv_cache import BlockPool, KvCacheFull, SequenceState


@dataclass(frozen=True)
class IterationPlan:
    tokens: list[int]
    positions: list[int]  # per token: its row of the position table (clamped)
    slots: list[int]  # per token: the cache slot its key and value go to
    newest: list[int]  # per sequence: the row of its newest token in the packed matrix
    lengths: list[int]  # per sequence: its length after this iteration
    prefills: list[tuple[int, int]]  # rows [begin, end) of each run of 2+ new tokens
    # [sequences, longest]: the slot of each position of each sequence's history
    # (past a sequence's length: slots attention masks)
    history: npt.NDArray[np.int64]


def pack_iteration(
    states: Sequence[SequenceState], pool: BlockPool, max_context: int
) -> IterationPlan:
    """The plan of one step over ``states``; reserves the blocks their new tokens need
    (a no-op where the scheduler already did), ``KvCacheFull`` if the pool is short."""
    plan = IterationPlan([], [], [], [], [], [], np.empty(0, dtype=np.int64))
    for state in states:
        if not pool.reserve(state):
            raise KvCacheFull(f"no free block for a sequence of {len(state.tokens)} tokens")
        new, begin, end = state.pending, state.length, len(state.tokens)
        if not new or (begin > 0 and len(new) > 1):
            raise ValueError(f"cannot step a sequence of {end} tokens with {begin} cached")
        first = len(plan.tokens)
        plan.tokens.extend(new)
        plan.positions.extend(min(p, max_context - 1) for p in range(begin, end))
        plan.slots.extend(pool.slots(state, begin, end))
        plan.newest.append(len(plan.tokens) - 1)
        plan.lengths.append(end)
        if len(new) > 1:
            plan.prefills.append((first, len(plan.tokens)))
    longest = max(plan.lengths, default=0)
    return replace(plan, history=history_slots(pool, states, longest))


def history_slots(
    pool: BlockPool, states: Sequence[SequenceState], positions: int
) -> npt.NDArray[np.int64]:
    """``[len(states), positions]``: the storage slot of each position of each state,
    through its block table (padded with block 0 where the table is shorter)."""
    tables = np.asarray(pool.tables(states, positions), dtype=np.int64)
    per_block = np.arange(pool.block_size, dtype=np.int64)
    slots = (tables[:, :, None] * pool.block_size + per_block).reshape(len(states), -1)
    return np.ascontiguousarray(slots[:, :positions])


def advance(states: Sequence[SequenceState], chosen: Sequence[int]) -> None:
    """After a step: every pending token is cached, and each chosen token is pending."""
    for state, token in zip(states, chosen, strict=True):
        state.length = len(state.tokens)
        state.tokens.append(token)
