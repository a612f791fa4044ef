"""The ``Model`` protocols the schedulers drive, and synthetic NumPy models behind them.

No weights are downloaded: every weight is drawn from a seeded generator, so two
workers with the same seed and sizes compute the same numbers. The compute is real
(dense matrix products, attention over a per-sequence key/value cache) and grows
with batch size the way an accelerator's does: the weights are read once per
batch, so a bigger batch costs more in total and less per request.

Plug in your own model by implementing ``EmbeddingModel`` or ``Generator``; the
schedulers call them from one dedicated device thread, never concurrently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]

# Token ids: 0..255 are bytes, then the specials.
BOS_TOKEN = 256
EOS_TOKEN = 257
_FIRST_FREE_ID = 258
# Generated ids decode to these characters (after the bytes, ids map round-robin).
_ALPHABET = "abcdefghijklmnopqrstuvwxyz     ,.etaoinshr"


@runtime_checkable
class EmbeddingModel(Protocol):
    """One forward pass per batch: token sequences in, one vector per sequence out."""

    @property
    def dimensions(self) -> int: ...

    def embed(self, batch: Sequence[Sequence[int]]) -> FloatArray:
        """Return ``[len(batch), dimensions]`` float32, on the host (synchronised)."""
        ...


@runtime_checkable
class Generator(Protocol):
    """A token generator stepped one iteration at a time over a changing set of sequences."""

    @property
    def max_context(self) -> int: ...

    def start(self, prompt: Sequence[int]) -> object:
        """Allocate the state (cache) of a new sequence; no compute yet."""
        ...

    def step(self, sequences: Sequence[object]) -> list[int]:
        """One iteration: prefill sequences not yet started, decode one token for the rest.

        Returns the next token of every sequence, on the host (synchronised).
        """
        ...


class ByteTokenizer:
    """Text to token ids (UTF-8 bytes) and generated ids back to text."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode_token(self, token: int) -> str:
        if token < 128:
            return chr(token) if 32 <= token < 127 else " "
        return _ALPHABET[token % len(_ALPHABET)]


def _weights(rng: np.random.Generator, rows: int, cols: int) -> FloatArray:
    scale = 1.0 / np.sqrt(rows)
    weights: FloatArray = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(scale)
    return weights


def _gelu(x: FloatArray) -> FloatArray:
    result: FloatArray = x / (1.0 + np.exp(-1.702 * x))
    return result


def _layer_norm(x: FloatArray) -> FloatArray:
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    result: FloatArray = (x - mean) / np.sqrt(var + 1e-5)
    return result


class NumpyEmbeddingMLP:
    """Mean-pooled token embeddings through a residual MLP stack, L2-normalised."""

    def __init__(self, *, hidden_size: int, layers: int, vocab_size: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.table = rng.standard_normal((vocab_size, hidden_size), dtype=np.float32)
        self.blocks = [
            (
                _weights(rng, hidden_size, 4 * hidden_size),
                _weights(rng, 4 * hidden_size, hidden_size),
            )
            for _ in range(layers)
        ]

    @property
    def dimensions(self) -> int:
        return self.hidden_size

    def embed(self, batch: Sequence[Sequence[int]]) -> FloatArray:
        pooled = np.stack(
            [self.table[np.asarray(tokens) % self.vocab_size].mean(0) for tokens in batch]
        )
        x = _layer_norm(pooled)
        for up, down in self.blocks:
            x = x + _gelu(x @ up) @ down
            x = _layer_norm(x)
        result: FloatArray = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
        return result


@dataclass(eq=False)
class NumpySequence:
    """One sequence's state: its prompt, its length so far, and where its keys and
    values live (row ``row`` of the cache of the batch it last ran in)."""

    prompt: list[int]
    last_token: int = BOS_TOKEN
    length: int = 0
    cache: NumpyBatchCache | None = None
    row: int = 0


class NumpyBatchCache:
    """The keys and values of one batch's sequences, padded: ``kv[layer, 0]`` holds the
    keys and ``kv[layer, 1]`` the values, ``[rows, capacity, width]`` each.

    Row ``i`` holds the first ``length`` positions of the batch's ``i``-th sequence;
    past that it is padding, masked in attention. A batch stepped again with the same
    sequences in the same order uses its cache in place; when a sequence joins or
    leaves, or the longest outgrows the capacity, ``for_batch`` builds a new cache with
    room for twice the longest and copies the members' rows over. Appending a token
    copies nothing in the common case, and the padding is bounded by the longest row.
    """

    def __init__(self, layers: int, rows: int, capacity: int, width: int) -> None:
        self.kv: FloatArray = np.zeros((layers, 2, rows, capacity, width), dtype=np.float32)

    @classmethod
    def for_batch(
        cls, states: Sequence[NumpySequence], longest: int, layers: int, width: int
    ) -> NumpyBatchCache:
        """The cache of ``states`` in this order, with room for ``longest`` positions."""
        return reuse_or_rebuild(
            states, longest, lambda rows, capacity: cls(layers, rows, capacity, width)
        )


class HasKvCache(Protocol):
    kv: Any  # [layers, 2, rows, capacity, width]: a NumPy array or a torch tensor


CacheT = TypeVar("CacheT", bound=HasKvCache)


def reuse_or_rebuild(
    states: Sequence[Any], longest: int, allocate: Callable[[int, int], CacheT]
) -> CacheT:
    """The batch cache ``states`` already share in this order, if it fits ``longest``
    positions; else ``allocate(rows, capacity)`` with room for twice the longest and
    each state's rows copied over (works for NumPy arrays and torch tensors alike)."""
    cache = states[0].cache
    if (
        cache is not None
        and cache.kv.shape[2] == len(states)
        and longest <= cache.kv.shape[3]
        and all(s.cache is cache and s.row == i for i, s in enumerate(states))
    ):
        reused: CacheT = cache
        return reused
    new = allocate(len(states), max(16, 2 * longest))
    for row, state in enumerate(states):
        if state.cache is not None:
            new.kv[:, :, row, : state.length] = state.cache.kv[:, :, state.row, : state.length]
        state.cache, state.row = new, row
    return new


class SequenceProgress(Protocol):
    """What packing an iteration reads from a sequence's state (either backend's)."""

    prompt: list[int]
    last_token: int
    length: int


@dataclass(frozen=True)
class IterationPlan:
    """One iteration's new tokens, packed into one matrix: a row per token.

    A sequence that has not started contributes its whole prompt (prefill), a running
    one its last token (decode).
    """

    tokens: list[int]
    positions: list[int]  # per token: its row of the position table (clamped)
    rows: list[int]  # per token: its sequence's row in the batch cache
    slots: list[int]  # per token: its position in that row
    newest: list[int]  # per sequence: the row of its newest token in the packed matrix
    lengths: list[int]  # per sequence: its length after this iteration
    prefills: list[tuple[int, int]]  # rows [begin, end) of each prompt of 2+ tokens


def pack_iteration(states: Sequence[SequenceProgress], max_context: int) -> IterationPlan:
    plan = IterationPlan([], [], [], [], [], [], [])
    for row, state in enumerate(states):
        new = [state.last_token] if state.length > 0 else state.prompt
        begin, slots = len(plan.tokens), range(state.length, state.length + len(new))
        plan.tokens.extend(new)
        plan.positions.extend(min(slot, max_context - 1) for slot in slots)
        plan.rows.extend([row] * len(new))
        plan.slots.extend(slots)
        plan.newest.append(len(plan.tokens) - 1)
        plan.lengths.append(slots.stop)
        if len(new) > 1:
            plan.prefills.append((begin, len(plan.tokens)))
    return plan


class NumpyTokenGenerator:
    """A small decoder: single-head causal attention with a KV cache plus an MLP per layer.

    Every iteration is one pass through the weights for all its tokens: the prompt
    tokens of sequences that start (prefill) and the last token of running ones
    (decode) are stacked into one matrix, so each weight matrix is read once per
    iteration however many sequences run or join (what an accelerator's packed,
    "mixed" batches do). Attention is batched too: every sequence's newest token
    attends to its row of the batch's padded key/value cache in one masked, batched
    product; only a newcomer's earlier prompt tokens attend among themselves, once per
    sequence. Tokens are chosen greedily, so the output is deterministic; the
    end-of-sequence token is never chosen, so a request gets exactly ``max_tokens``
    tokens (what a benchmark wants).
    """

    def __init__(
        self, *, hidden_size: int, layers: int, vocab_size: int, max_context: int, seed: int
    ) -> None:
        rng = np.random.default_rng(seed + 1)
        d = hidden_size
        self.hidden_size = d
        self.vocab_size = vocab_size
        self._max_context = max_context
        self.table = rng.standard_normal((vocab_size, d), dtype=np.float32)
        self.positions = rng.standard_normal((max_context, d), dtype=np.float32) * 0.1
        self.layers = [
            (
                _weights(rng, d, 3 * d),
                _weights(rng, d, d),
                _weights(rng, d, 4 * d),
                _weights(rng, 4 * d, d),
            )
            for _ in range(layers)
        ]
        self.unembed = _weights(rng, d, vocab_size)
        self.unembed[:, EOS_TOKEN] = 0.0
        self.unembed[:, BOS_TOKEN] = 0.0

    @property
    def max_context(self) -> int:
        return self._max_context

    def start(self, prompt: Sequence[int]) -> NumpySequence:
        if not prompt or len(prompt) >= self._max_context:
            raise ValueError(f"prompt length must be 1..{self._max_context - 1}, got {len(prompt)}")
        return NumpySequence(prompt=[BOS_TOKEN, *prompt][: self._max_context - 1])

    def step(self, sequences: Sequence[object]) -> list[int]:
        states = [_as_sequence(s) for s in sequences]
        if not states:
            return []
        plan = pack_iteration(states, self._max_context)
        x = self.table[np.asarray(plan.tokens) % self.vocab_size] + self.positions[plan.positions]
        lengths = np.asarray(plan.lengths)
        longest = int(lengths.max())
        cache = NumpyBatchCache.for_batch(states, longest, len(self.layers), self.hidden_size)
        rows, slots, newest = np.asarray(plan.rows), np.asarray(plan.slots), plan.newest
        scale = np.float32(1.0 / np.sqrt(self.hidden_size))
        for layer, (qkv_w, out_w, up, down) in enumerate(self.layers):
            q, k, v = np.split(_layer_norm(x) @ qkv_w, 3, axis=1)
            cache.kv[layer, 0, rows, slots] = k
            cache.kv[layer, 1, rows, slots] = v
            mixed = np.empty_like(q)
            history = cache.kv[layer, :, :, :longest]
            mixed[newest] = _attend_newest(q[newest], history, lengths, scale)
            for begin, end in plan.prefills:  # a prompt's earlier tokens, among themselves
                early = slice(begin, end - 1)
                mixed[early] = _causal_attention(q[early], k[early], v[early], scale)
            x = x + mixed @ out_w
            x = x + _gelu(_layer_norm(x) @ up) @ down
        chosen = self._choose(x[newest])
        for state, length, token in zip(states, plan.lengths, chosen, strict=True):
            state.length, state.last_token = length, token
        return chosen

    def _choose(self, hidden: FloatArray) -> list[int]:
        logits = _layer_norm(hidden) @ self.unembed
        return [int(t) for t in np.argmax(logits, axis=1)]


def _attend_newest(
    queries: FloatArray, kv: FloatArray, lengths: npt.NDArray[np.int_], scale: np.float32
) -> FloatArray:
    """Every sequence's newest token (``queries[i]``) over the first ``lengths[i]``
    positions of its row of ``kv`` (keys and values, ``[2, rows, positions, width]``),
    all sequences in one batched product; the padding past a row's length is masked."""
    scores = np.matmul(kv[0], queries[:, :, None])[:, :, 0] * scale
    scores[np.arange(scores.shape[1]) >= lengths[:, None]] = -np.inf
    result: FloatArray = np.matmul(_softmax(scores)[:, None, :], kv[1])[:, 0, :]
    return result


def _causal_attention(
    queries: FloatArray, keys: FloatArray, values: FloatArray, scale: np.float32
) -> FloatArray:
    """Self-attention over a run of positions: each sees itself and the earlier ones."""
    scores = (queries @ keys.T) * scale
    scores[np.triu_indices(len(scores), 1)] = -np.inf
    result: FloatArray = _softmax(scores) @ values
    return result


def _softmax(x: FloatArray) -> FloatArray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    result: FloatArray = (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
    return result


def _as_sequence(state: object) -> NumpySequence:
    if not isinstance(state, NumpySequence):
        raise TypeError(f"not a sequence of this model: {type(state).__qualname__}")
    return state
