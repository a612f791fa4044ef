"""Synthetic NumPy models behind the ``EmbeddingModel`` and ``Generator`` protocols.

No weights are downloaded: every weight is drawn from a seeded generator, so two
workers with the same seed and sizes compute the same numbers. The compute is real
(dense matrix products, attention over a paged key/value cache) and grows
with batch size the way an accelerator's does: the weights are read once per
batch, so a bigger batch costs more in total and less per request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpuscope.worker.kv_cache import BlockPool, SequenceState
from gpuscope.worker.model_api import BOS_TOKEN, EOS_TOKEN, FloatArray
from gpuscope.worker.packing import advance, pack_iteration


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


class NumpyTokenGenerator:
    """A small decoder: single-head causal attention with a paged KV cache plus an MLP
    per layer.

    Every iteration is one pass through the weights for all its tokens: the prompt
    tokens of sequences that start (prefill) and the last token of running ones
    (decode) are stacked into one matrix, so each weight matrix is read once per
    iteration however many sequences run or join (what an accelerator's packed,
    "mixed" batches do). Keys and values live in ``kv_blocks`` blocks of
    ``kv_block_size`` positions (``kv[layer, slot]`` holds a key and a value); a
    sequence's block table says which. Attention is batched: every sequence's newest
    token attends to its history, gathered through its block table, in one masked,
    batched product; only a newcomer's earlier prompt tokens attend among themselves,
    once per sequence. Tokens are chosen greedily, so the output is deterministic; the
    end-of-sequence token is never chosen, so a request gets exactly ``max_tokens``
    tokens (what a benchmark wants).
    """

    def __init__(
        self,
        *,
        hidden_size: int,
        layers: int,
        vocab_size: int,
        max_context: int,
        seed: int,
        kv_blocks: int,
        kv_block_size: int,
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
        self._pool = BlockPool(kv_blocks, kv_block_size)
        # [layers, slots, 2 (key, value), width]: block b holds slots b*size..(b+1)*size-1;
        # a slot's key and value side by side, so one gather fetches both
        shape = (layers, kv_blocks * kv_block_size, 2, d)
        self.kv: FloatArray = np.zeros(shape, dtype=np.float32)

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def kv_pool(self) -> BlockPool:
        return self._pool

    def start(self, prompt: Sequence[int]) -> SequenceState:
        if not prompt or len(prompt) >= self._max_context:
            raise ValueError(f"prompt length must be 1..{self._max_context - 1}, got {len(prompt)}")
        return SequenceState(tokens=[BOS_TOKEN, *prompt][: self._max_context - 1])

    def step(self, sequences: Sequence[SequenceState]) -> list[int]:
        states = list(sequences)
        if not states:
            return []
        plan = pack_iteration(states, self._pool, self._max_context)
        x = self.table[np.asarray(plan.tokens) % self.vocab_size] + self.positions[plan.positions]
        lengths = np.asarray(plan.lengths)
        slots, history, newest = np.asarray(plan.slots), plan.history, plan.newest
        scale = np.float32(1.0 / np.sqrt(self.hidden_size))
        for layer, (qkv_w, out_w, up, down) in enumerate(self.layers):
            q, k, v = np.split(_layer_norm(x) @ qkv_w, 3, axis=1)
            self.kv[layer, slots, 0] = k
            self.kv[layer, slots, 1] = v
            mixed = np.empty_like(q)
            past = self.kv[layer][history]  # [sequences, positions, 2, width]
            mixed[newest] = _attend_newest(q[newest], past[:, :, 0], past[:, :, 1], lengths, scale)
            for begin, end in plan.prefills:  # a prompt's earlier tokens, among themselves
                early = slice(begin, end - 1)
                mixed[early] = _causal_attention(q[early], k[early], v[early], scale)
            x = x + mixed @ out_w
            x = x + _gelu(_layer_norm(x) @ up) @ down
        chosen = self._choose(x[newest])
        advance(states, chosen)
        return chosen

    def _choose(self, hidden: FloatArray) -> list[int]:
        logits = _layer_norm(hidden) @ self.unembed
        return [int(t) for t in np.argmax(logits, axis=1)]


def _attend_newest(
    queries: FloatArray,
    keys: FloatArray,
    values: FloatArray,
    lengths: npt.NDArray[np.int_],
    scale: np.float32,
) -> FloatArray:
    """Every sequence's newest token (``queries[i]``) over the first ``lengths[i]``
    positions of its row of ``keys`` and ``values`` (gathered through the block tables,
    ``[sequences, positions, width]``), all sequences in one batched product; whatever
    lies past a row's length (the rest of its last block, padding) is masked."""
    scores = np.matmul(keys, queries[:, :, None])[:, :, 0] * scale
    scores[np.arange(scores.shape[1]) >= lengths[:, None]] = -np.inf
    result: FloatArray = np.matmul(_softmax(scores)[:, None, :], values)[:, 0, :]
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
