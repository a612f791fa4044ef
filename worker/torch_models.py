"""The synthetic models on PyTorch (CUDA; CPU in tests), imported only when ``--device`` picks it.

The weights are the NumPy models' (same seed, same numbers), moved to the device.
Every call ends with ``torch.cuda.synchronize()`` and a copy to the host, so the
scheduler's ``computed`` mark is taken after the work, never after the launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gpuscope.worker.models import (
    BOS_TOKEN,
    FloatArray,
    NumpyEmbeddingMLP,
    NumpyTokenGenerator,
    pack_iteration,
    reuse_or_rebuild,
)


def _sync(device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _layer_norm(x: Any) -> Any:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5)


def _gelu(x: Any) -> Any:
    return x * torch.sigmoid(1.702 * x)


def gpu_uuid(device: Any) -> str | None:
    """``GPU-…`` UUID of a CUDA device, as NVML spells it, or None if torch cannot tell."""
    try:
        raw = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


class TorchEmbeddingMLP:
    def __init__(self, reference: NumpyEmbeddingMLP, device: Any) -> None:
        self.device = device
        self.hidden_size = reference.hidden_size
        self.vocab_size = reference.vocab_size
        self.table = torch.from_numpy(reference.table).to(device)
        self.blocks = [
            (torch.from_numpy(up).to(device), torch.from_numpy(down).to(device))
            for up, down in reference.blocks
        ]

    @property
    def dimensions(self) -> int:
        return self.hidden_size

    @torch.inference_mode()  # type: ignore[untyped-decorator]
    def embed(self, batch: Sequence[Sequence[int]]) -> FloatArray:
        pooled = torch.stack(
            [
                self.table[
                    torch.as_tensor(list(tokens), device=self.device) % self.vocab_size
                ].mean(0)
                for tokens in batch
            ]
        )
        x = _layer_norm(pooled)
        for up, down in self.blocks:
            x = _layer_norm(x + _gelu(x @ up) @ down)
        x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
        _sync(self.device)
        result: FloatArray = x.cpu().numpy().astype(np.float32)
        return result


@dataclass(eq=False)
class TorchSequence:
    """``NumpySequence`` on the device: its keys and values live in row ``row`` of the
    cache of the batch it last ran in."""

    prompt: list[int]
    last_token: int = BOS_TOKEN
    length: int = 0
    cache: TorchBatchCache | None = None
    row: int = 0


class TorchBatchCache:
    """``NumpyBatchCache`` on the device: ``kv`` is ``[layers, 2, rows, capacity, width]``."""

    def __init__(self, layers: int, rows: int, capacity: int, width: int, device: Any) -> None:
        self.kv = torch.zeros((layers, 2, rows, capacity, width), device=device)

    @classmethod
    def for_batch(
        cls, states: Sequence[TorchSequence], longest: int, layers: int, width: int, device: Any
    ) -> TorchBatchCache:
        """The cache of ``states`` in this order, with room for ``longest`` positions."""
        return reuse_or_rebuild(
            states, longest, lambda rows, capacity: cls(layers, rows, capacity, width, device)
        )


class TorchTokenGenerator:
    """``NumpyTokenGenerator``'s decoder on a torch device: one packed pass per iteration,
    attention batched over the sequences' padded key/value cache."""

    def __init__(self, reference: NumpyTokenGenerator, device: Any) -> None:
        self.device = device
        self.hidden_size = reference.hidden_size
        self.vocab_size = reference.vocab_size
        self._max_context = reference.max_context
        self.table = torch.from_numpy(reference.table).to(device)
        self.positions = torch.from_numpy(reference.positions).to(device)
        self.layers = [
            tuple(torch.from_numpy(w).to(device) for w in layer) for layer in reference.layers
        ]
        self.unembed = torch.from_numpy(reference.unembed).to(device)
        self._reference = reference

    @property
    def max_context(self) -> int:
        return self._max_context

    def start(self, prompt: Sequence[int]) -> TorchSequence:
        self._reference.start(prompt)  # the same validation
        return TorchSequence(prompt=[BOS_TOKEN, *prompt][: self._max_context - 1])

    @torch.inference_mode()  # type: ignore[untyped-decorator]
    def step(self, sequences: Sequence[object]) -> list[int]:
        states = [s for s in sequences if isinstance(s, TorchSequence)]
        if len(states) != len(sequences):
            raise TypeError("not a sequence of this model")
        if not states:
            return []
        plan = pack_iteration(states, self._max_context)
        x = self.table[self._tensor(plan.tokens) % self.vocab_size]
        x = x + self.positions[self._tensor(plan.positions)]
        lengths, longest = self._tensor(plan.lengths), max(plan.lengths)
        cache = TorchBatchCache.for_batch(
            states, longest, len(self.layers), self.hidden_size, self.device
        )
        rows, slots, newest = map(self._tensor, (plan.rows, plan.slots, plan.newest))
        scale = 1.0 / self.hidden_size**0.5
        for layer, (qkv_w, out_w, up, down) in enumerate(self.layers):
            q, k, v = (_layer_norm(x) @ qkv_w).chunk(3, dim=1)
            cache.kv[layer, 0, rows, slots] = k
            cache.kv[layer, 1, rows, slots] = v
            mixed = torch.empty_like(q)
            history = cache.kv[layer, :, :, :longest]
            mixed[newest] = _attend_newest(q[newest], history, lengths, scale)
            for begin, end in plan.prefills:  # a prompt's earlier tokens, among themselves
                early = slice(begin, end - 1)
                mixed[early] = _causal_attention(q[early], k[early], v[early], scale)
            x = x + mixed @ out_w
            x = x + _gelu(_layer_norm(x) @ up) @ down
        chosen = torch.argmax(_layer_norm(x[newest]) @ self.unembed, dim=1)
        _sync(self.device)
        tokens = [int(t) for t in chosen.cpu().tolist()]
        for state, length, token in zip(states, plan.lengths, tokens, strict=True):
            state.length, state.last_token = length, token
        return tokens

    def _tensor(self, values: list[int]) -> Any:
        return torch.as_tensor(values, device=self.device)


def _attend_newest(queries: Any, kv: Any, lengths: Any, scale: float) -> Any:
    """``models._attend_newest``: every sequence's newest token over its row of ``kv``."""
    scores = torch.matmul(kv[0], queries.unsqueeze(2)).squeeze(2) * scale
    padding = torch.arange(scores.shape[1], device=scores.device) >= lengths.unsqueeze(1)
    probs = torch.softmax(scores.masked_fill(padding, float("-inf")), dim=-1)
    return torch.matmul(probs.unsqueeze(1), kv[1]).squeeze(1)


def _causal_attention(queries: Any, keys: Any, values: Any, scale: float) -> Any:
    """Self-attention over a run of positions: each sees itself and the earlier ones."""
    scores = (queries @ keys.T) * scale
    later = torch.ones(scores.shape, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1) @ values
