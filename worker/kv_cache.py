"""The paged key/value cache's bookkeeping: a pool of fixed-size blocks, a block table
per sequence, and the live figures the worker's ``/metrics`` reads.

Backend-neutral and free of compute: the storage itself (``[layers, 2, blocks *
block_size, width]``, a NumPy array or a torch tensor) belongs to the model; this
module decides which block holds each position of each sequence. Position ``p`` of a
sequence lives in slot ``blocks[p // block_size] * block_size + p % block_size`` of
the storage, so a sequence grows one block at a time wherever a block is free, and
nothing is ever padded or copied to make room (PagedAttention's layout).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KvStats:
    """A snapshot of the generation scheduler and its key/value cache."""

    blocks_used: int
    blocks_total: int
    preemptions_total: int  # running sequences evicted to be recomputed later
    iterations_total: int  # model steps (one per iteration under continuous batching)
    running: int  # sequences in the running batch
    waiting: int  # sequences queued or preempted, waiting for a slot and blocks

    @property
    def usage_ratio(self) -> float:
        """Fraction of the pool's blocks in use, 0..1."""
        return self.blocks_used / self.blocks_total if self.blocks_total else 0.0


class KvCacheFull(RuntimeError):
    """A step needed more blocks than the pool had free (the scheduler reserves first,
    so this means a caller stepped sequences without reserving)."""


@dataclass(eq=False)
class SequenceState:
    """One sequence, whatever the backend: its tokens so far and where their keys and
    values live.

    ``tokens`` holds BOS, the prompt and every generated token; the first ``length``
    of them are in the cache, the rest are fed to the next step (the whole prompt on
    prefill, the last token on decode, everything again after a preemption).
    """

    tokens: list[int]
    length: int = 0
    blocks: list[int] = field(default_factory=list)  # the block table

    @property
    def pending(self) -> list[int]:
        """The tokens the next step writes to the cache."""
        return self.tokens[self.length :]


class BlockPool:
    """A fixed number of blocks of ``block_size`` positions, handed out and taken back.

    Reservations and releases come from the scheduler's event loop and the device
    thread; a lock keeps the free list and the counters consistent between them.
    ``allocated_total == freed_total`` whenever no sequence holds blocks.
    """

    def __init__(self, blocks: int, block_size: int) -> None:
        if blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of one position, got {blocks}×{block_size}")
        self.total = blocks
        self.block_size = block_size
        self._free = list(range(blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self._lock = threading.Lock()
        self.allocated_total = 0
        self.freed_total = 0

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    @property
    def positions(self) -> int:
        """How many positions the whole pool holds."""
        return self.total * self.block_size

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def reserve(self, state: SequenceState, positions: int | None = None) -> bool:
        """Give ``state`` blocks for its first ``positions`` positions (default: every
        token it has, the ones the next step writes included). All or nothing: False,
        with nothing taken, when too few blocks are free."""
        wanted = len(state.tokens) if positions is None else positions
        missing = self.blocks_for(wanted) - len(state.blocks)
        if missing <= 0:
            return True
        with self._lock:
            if missing > len(self._free):
                return False
            taken = self._free[-missing:]
            del self._free[-missing:]
            self.allocated_total += missing
        state.blocks.extend(reversed(taken))
        return True

    def release(self, state: SequenceState) -> None:
        """Take back every block of ``state``; its cache is gone, so a later step
        recomputes it from its tokens."""
        with self._lock:
            self._free.extend(reversed(state.blocks))
            self.freed_total += len(state.blocks)
        state.blocks = []
        state.length = 0

    def slots(self, state: SequenceState, begin: int, end: int) -> list[int]:
        """The storage slots of positions ``begin..end-1`` of ``state``."""
        size, table = self.block_size, state.blocks
        return [table[p // size] * size + p % size for p in range(begin, end)]

    def tables(self, states: Sequence[SequenceState], positions: int) -> list[list[int]]:
        """The block tables of ``states`` covering ``positions`` positions each, padded
        with block 0 (attention masks whatever lies past a sequence's length)."""
        width = self.blocks_for(positions)
        return [(s.blocks + [0] * width)[:width] for s in states]
