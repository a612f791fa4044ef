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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

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


@dataclass
class NumpySequence:
    """One sequence's state: its tokens so far and its key/value cache per layer."""

    prompt: list[int]
    last_token: int = BOS_TOKEN
    length: int = 0
    keys: list[FloatArray] = field(default_factory=list)
    values: list[FloatArray] = field(default_factory=list)

    @property
    def started(self) -> bool:
        return self.length > 0


class NumpyTokenGenerator:
    """A small decoder: single-head causal attention with a KV cache plus an MLP per layer.

    Decoding batches every running sequence into one matrix product per weight,
    so each weight matrix is read once per iteration however many sequences run;
    attention runs per sequence against its own cache. Tokens are chosen greedily,
    so the output is deterministic; the end-of-sequence token is never chosen, so
    a request gets exactly ``max_tokens`` tokens (what a benchmark wants).
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
        fresh = [s for s in states if not s.started]
        running = [s for s in states if s.started]
        if fresh:
            self._prefill(fresh)
        if running:
            self._decode(running)
        return [s.last_token for s in states]

    def _prefill(self, states: list[NumpySequence]) -> None:
        # Each prompt has its own length: one causal pass per sequence.
        for state in states:
            tokens = np.asarray(state.prompt) % self.vocab_size
            x = self.table[tokens] + self.positions[: len(tokens)]
            for qkv_w, out_w, up, down in self.layers:
                q, k, v = np.split(_layer_norm(x) @ qkv_w, 3, axis=1)
                state.keys.append(k)
                state.values.append(v)
                scores = (q @ k.T) / np.sqrt(self.hidden_size)
                scores += np.triu(np.full(scores.shape, -1e9, dtype=np.float32), 1)
                x = x + _softmax(scores) @ v @ out_w
                x = x + _gelu(_layer_norm(x) @ up) @ down
            state.length = len(tokens)
            state.last_token = self._choose(x[-1:])[0]

    def _decode(self, states: list[NumpySequence]) -> None:
        tokens = np.asarray([s.last_token for s in states]) % self.vocab_size
        positions = np.asarray([min(s.length, self._max_context - 1) for s in states])
        x = self.table[tokens] + self.positions[positions]
        for layer, (qkv_w, out_w, up, down) in enumerate(self.layers):
            q, k, v = np.split(_layer_norm(x) @ qkv_w, 3, axis=1)
            mixed = np.empty_like(q)
            for row, state in enumerate(states):
                keys = np.vstack([state.keys[layer], k[row : row + 1]])
                values = np.vstack([state.values[layer], v[row : row + 1]])
                state.keys[layer], state.values[layer] = keys, values
                weights = _softmax((keys @ q[row]) / np.sqrt(self.hidden_size))
                mixed[row] = weights @ values
            x = x + mixed @ out_w
            x = x + _gelu(_layer_norm(x) @ up) @ down
        for state, token in zip(states, self._choose(x), strict=True):
            state.length += 1
            state.last_token = token

    def _choose(self, hidden: FloatArray) -> list[int]:
        logits = _layer_norm(hidden) @ self.unembed
        return [int(t) for t in np.argmax(logits, axis=1)]


def _softmax(x: FloatArray) -> FloatArray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    result: FloatArray = (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
    return result


def _as_sequence(state: object) -> NumpySequence:
    if not isinstance(state, NumpySequence):
        raise TypeError(f"not a sequence of this model: {type(state).__qualname__}")
    return state
