"""The synthetic models on PyTorch (CUDA; CPU in tests), imported only when ``--device`` picks it.

The weights are the NumPy models' (same seed, same numbers), moved to the device.
Every call ends with ``torch.cuda.synchronize()`` and a copy to the host, so the
scheduler's ``computed`` mark is taken after the work, never after the launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gpuscope.worker.models import (
    BOS_TOKEN,
    FloatArray,
    NumpyEmbeddingMLP,
    NumpyTokenGenerator,
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


@dataclass
class TorchSequence:
    prompt: list[int]
    last_token: int = BOS_TOKEN
    length: int = 0
    keys: list[Any] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)

    def append(self, layer: int, keys: Any, values: Any) -> None:
        """Add rows at position ``length`` of ``layer``'s cache (grown by doubling)."""
        end = self.length + len(keys)
        if layer == len(self.keys):
            shape = (max(16, 2 * end), keys.shape[1])
            self.keys.append(keys.new_empty(shape))
            self.values.append(values.new_empty(shape))
        elif end > len(self.keys[layer]):
            self.keys[layer] = _grown(self.keys[layer], self.length, 2 * end)
            self.values[layer] = _grown(self.values[layer], self.length, 2 * end)
        self.keys[layer][self.length : end] = keys
        self.values[layer][self.length : end] = values


def _grown(cache: Any, used: int, capacity: int) -> Any:
    grown = cache.new_empty((capacity, cache.shape[1]))
    grown[:used] = cache[:used]
    return grown


class TorchTokenGenerator:
    """``NumpyTokenGenerator``'s decoder on a torch device: one packed pass per iteration."""

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
        tokens: list[int] = []
        positions: list[int] = []
        spans: list[tuple[int, int]] = []  # each sequence's rows in the packed matrix
        for state in states:
            new = [state.last_token] if state.length > 0 else state.prompt
            first = min(state.length, self._max_context - 1)
            spans.append((len(tokens), len(tokens) + len(new)))
            tokens.extend(new)
            positions.extend(min(first + i, self._max_context - 1) for i in range(len(new)))
        token_ids = torch.as_tensor(tokens, device=self.device) % self.vocab_size
        x = self.table[token_ids] + self.positions[torch.as_tensor(positions, device=self.device)]
        scale = 1.0 / self.hidden_size**0.5
        for layer, (qkv_w, out_w, up, down) in enumerate(self.layers):
            q, k, v = (_layer_norm(x) @ qkv_w).chunk(3, dim=1)
            mixed = torch.empty_like(q)
            for state, (begin, end) in zip(states, spans, strict=True):
                state.append(layer, k[begin:end], v[begin:end])
                mixed[begin:end] = self._attend(state, layer, q[begin:end], scale)
            x = x + mixed @ out_w
            x = x + _gelu(_layer_norm(x) @ up) @ down
        last_rows = torch.as_tensor([end - 1 for _, end in spans], device=self.device)
        chosen = torch.argmax(_layer_norm(x[last_rows]) @ self.unembed, dim=1)
        _sync(self.device)
        for state, (begin, end), token in zip(states, spans, chosen.cpu().tolist(), strict=True):
            state.length += end - begin
            state.last_token = int(token)
        return [s.last_token for s in states]

    def _attend(self, state: TorchSequence, layer: int, queries: Any, scale: float) -> Any:
        end = state.length + len(queries)
        keys, values = state.keys[layer][:end], state.values[layer][:end]
        scores = (queries @ keys.T) * scale
        if len(queries) > 1:  # prefill: no query sees a later position
            mask = torch.full(scores.shape, -1e9, device=self.device)
            scores = scores + torch.triu(mask, 1 + state.length)
        return torch.softmax(scores, dim=-1) @ values
