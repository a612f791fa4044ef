"""The synthetic models on PyTorch (CUDA; CPU in tests), imported only when ``--device`` picks it.

The weights are the NumPy models' (same seed, same numbers), moved to the device.
Every call ends with ``torch.cuda.synchronize()`` and a copy to the host, so the
scheduler's ``computed`` mark is taken after the work, never after the launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gpuscope.worker.kv_cache import BlockPool, SequenceState
from gpuscope.worker.model_api import FloatArray
from gpuscope.worker.numpy_models import NumpyEmbeddingMLP, NumpyTokenGenerator
from gpuscope.worker.packing import advance, pack_iteration


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


class TorchTokenGenerator:
    """``NumpyTokenGenerator``'s decoder on a torch device: one packed pass per iteration,
    attention batched over the sequences' histories gathered through their block tables
    from a paged key/value cache of the same size as the reference's."""

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
        self._pool = BlockPool(reference.kv_pool.total, reference.kv_pool.block_size)
        self.kv = torch.zeros(reference.kv.shape, device=device)

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def kv_pool(self) -> BlockPool:
        return self._pool

    def start(self, prompt: Sequence[int]) -> SequenceState:
        return self._reference.start(prompt)  # the same validation, the same state

    @torch.inference_mode()  # type: ignore[untyped-decorator]
    def step(self, sequences: Sequence[SequenceState]) -> list[int]:
        states = list(sequences)
        if not states:
            return []
        plan = pack_iteration(states, self._pool, self._max_context)
        x = self.table[self._tensor(plan.tokens) % self.vocab_size]
        x = x + self.positions[self._tensor(plan.positions)]
        lengths = self._tensor(plan.lengths)
        slots, newest = self._tensor(plan.slots), self._tensor(plan.newest)
        history = torch.as_tensor(plan.history, device=self.device)
        scale = 1.0 / self.hidden_size**0.5
        for layer, (qkv_w, out_w, up, down) in enumerate(self.layers):
            q, k, v = (_layer_norm(x) @ qkv_w).chunk(3, dim=1)
            self.kv[layer, slots, 0] = k
            self.kv[layer, slots, 1] = v
            mixed = torch.empty_like(q)
            past = self.kv[layer][history]  # [sequences, positions, 2, width]
            mixed[newest] = _attend_newest(q[newest], past[:, :, 0], past[:, :, 1], lengths, scale)
            for begin, end in plan.prefills:  # a prompt's earlier tokens, among themselves
                early = slice(begin, end - 1)
                mixed[early] = _causal_attention(q[early], k[early], v[early], scale)
            x = x + mixed @ out_w
            x = x + _gelu(_layer_norm(x) @ up) @ down
        chosen = torch.argmax(_layer_norm(x[newest]) @ self.unembed, dim=1)
        _sync(self.device)
        tokens = [int(t) for t in chosen.cpu().tolist()]
        advance(states, tokens)
        return tokens

    def _tensor(self, values: Sequence[object]) -> Any:
        return torch.as_tensor(values, device=self.device)


def _attend_newest(queries: Any, keys: Any, values: Any, lengths: Any, scale: float) -> Any:
    """``models._attend_newest``: every sequence's newest token over its gathered history."""
    scores = torch.matmul(keys, queries.unsqueeze(2)).squeeze(2) * scale
    padding = torch.arange(scores.shape[1], device=scores.device) >= lengths.unsqueeze(1)
    probs = torch.softmax(scores.masked_fill(padding, float("-inf")), dim=-1)
    return torch.matmul(probs.unsqueeze(1), values).squeeze(1)


def _causal_attention(queries: Any, keys: Any, values: Any, scale: float) -> Any:
    """Self-attention over a run of positions: each sees itself and the earlier ones."""
    scores = (queries @ keys.T) * scale
    later = torch.ones(scores.shape, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1) @ values
