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
    """One sequence's state: its prompt, its length so far and its key/value cache.

    The cache holds ``length`` rows per layer in arrays that grow by doubling, so
    appending a token copies nothing in the common case.
    """

    prompt: list[int]
    last_token: int = BOS_TOKEN
    length: int = 0
    keys: list[FloatArray] = field(default_factory=list)
    values: list[FloatArray] = field(default_factory=list)

    @property
    def started(self) -> bool:
        return self.length > 0

    def append(self, layer: int, keys: FloatArray, values: FloatArray) -> None:
        """Add ``len(keys)`` rows at position ``length`` of ``layer``'s cache."""
        end = self.length + len(keys)
        if layer == len(self.keys):
            capacity = max(16, 2 * end)
            self.keys.append(np.empty((capacity, keys.shape[1]), dtype=np.float32))
            self.values.append(np.empty((capacity, keys.shape[1]), dtype=np.float32))
        elif end > len(self.keys[layer]):
            self.keys[layer] = _grown(self.keys[layer], self.length, 2 * end)
            self.values[layer] = _grown(self.values[layer], self.length, 2 * end)
        self.keys[layer][self.length : end] = keys
        self.values[layer][self.length : end] = values


def _grown(cache: FloatArray, used: int, capacity: int) -> FloatArray:
    grown = np.empty((capacity, cache.shape[1]), dtype=np.float32)
    grown[:used] = cache[:used]
    return grown


class NumpyTokenGenerator:
    """A small decoder: single-head causal attention with a KV cache plus an MLP per layer.

    Every iteration is one pass through the weights for all its tokens: the prompt
    tokens of sequences that start (prefill) and the last token of running ones
    (decode) are stacked into one matrix, so each weight matrix is read once per
    iteration however many sequences run or join (what an accelerator's packed,
    "mixed" batches do); attention runs per sequence against its own cache. Tokens
    are chosen greedily, so the output is deterministic; the end-of-sequence token is
    never chosen, so a request gets exactly ``max_tokens`` tokens (what a benchmark
    wants).
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
        tokens: list[int] = []
        positions: list[int] = []
        spans: list[tuple[int, int]] = []  # each sequence's rows in the packed matrix
        for state in states:
            new = [state.last_token] if state.started else state.prompt
            first = min(state.length, self._max_context - 1)
            spans.append((len(tokens), len(tokens) + len(new)))
            tokens.extend(new)
            positions.extend(min(first + i, self._max_context - 1) for i in range(len(new)))
        x = self.table[np.asarray(tokens) % self.vocab_size] + self.positions[positions]
        scale = np.float32(1.0 / np.sqrt(self.hidden_size))
        for layer, (qkv_w, out_w, up, down) in enumerate(self.layers):
            q, k, v = np.split(_layer_norm(x) @ qkv_w, 3, axis=1)
            mixed = np.empty_like(q)
            for state, (begin, end) in zip(states, spans, strict=True):
                state.append(layer, k[begin:end], v[begin:end])
                mixed[begin:end] = _attend(state, layer, q[begin:end], scale)
            x = x + mixed @ out_w
            x = x + _gelu(_layer_norm(x) @ up) @ down
        last_rows = [end - 1 for _, end in spans]
        for state, (begin, end), token in zip(
            states, spans, self._choose(x[last_rows]), strict=True
        ):
            state.length += end - begin
            state.last_token = token
        return [s.last_token for s in states]

    def _choose(self, hidden: FloatArray) -> list[int]:
        logits = _layer_norm(hidden) @ self.unembed
        return [int(t) for t in np.argmax(logits, axis=1)]


def _attend(state: NumpySequence, layer: int, queries: FloatArray, scale: np.float32) -> FloatArray:
    """Causal attention of the ``len(queries)`` newest positions over the sequence's cache."""
    end = state.length + len(queries)
    keys, values = state.keys[layer][:end], state.values[layer][:end]
    scores = (queries @ keys.T) * scale
    if len(queries) > 1:  # prefill: no query sees a later position
        scores += np.triu(np.full(scores.shape, -1e9, dtype=np.float32), 1 + state.length)
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
