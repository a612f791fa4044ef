"""The synthetic models on PyTorch (CUDA), imported only when ``--device`` picks torch.

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


class TorchTokenGenerator:
    """``NumpyTokenGenerator``'s decoder on a torch device."""

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
        fresh = [s for s in states if s.length == 0]
        running = [s for s in states if s.length > 0]
        for state in fresh:
            self._prefill(state)
        if running:
            self._decode(running)
        _sync(self.device)
        return [s.last_token for s in states]

    def _prefill(self, state: TorchSequence) -> None:
        tokens = torch.as_tensor(state.prompt, device=self.device) % self.vocab_size
        x = self.table[tokens] + self.positions[: len(state.prompt)]
        scale = self.hidden_size**0.5
        mask = torch.triu(torch.full((len(tokens), len(tokens)), -1e9, device=self.device), 1)
        for qkv_w, out_w, up, down in self.layers:
            q, k, v = (_layer_norm(x) @ qkv_w).chunk(3, dim=1)
            state.keys.append(k)
            state.values.append(v)
            x = x + torch.softmax(q @ k.T / scale + mask, dim=-1) @ v @ out_w
            x = x + _gelu(_layer_norm(x) @ up) @ down
        state.length = len(state.prompt)
        state.last_token = int(self._choose(x[-1:])[0])

    def _decode(self, states: list[TorchSequence]) -> None:
        tokens = torch.as_tensor([s.last_token for s in states], device=self.device)
        positions = torch.as_tensor(
            [min(s.length, self._max_context - 1) for s in states], device=self.device
        )
        x = self.table[tokens % self.vocab_size] + self.positions[positions]
        scale = self.hidden_size**0.5
        for layer, (qkv_w, out_w, up, down) in enumerate(self.layers):
            q, k, v = (_layer_norm(x) @ qkv_w).chunk(3, dim=1)
            mixed = []
            for row, state in enumerate(states):
                state.keys[layer] = torch.cat([state.keys[layer], k[row : row + 1]])
                state.values[layer] = torch.cat([state.values[layer], v[row : row + 1]])
                weights = torch.softmax(state.keys[layer] @ q[row] / scale, dim=-1)
                mixed.append(weights @ state.values[layer])
            x = x + torch.stack(mixed) @ out_w
            x = x + _gelu(_layer_norm(x) @ up) @ down
        for state, token in zip(states, self._choose(x).tolist(), strict=True):
            state.length += 1
            state.last_token = int(token)

    def _choose(self, hidden: Any) -> Any:
        return torch.argmax(_layer_norm(hidden) @ self.unembed, dim=1).cpu()
