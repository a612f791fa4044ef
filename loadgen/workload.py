"""What to send: a seeded stream of requests from a mix and length distributions, or a
JSONL file of requests, free of I/O apart from reading that file.

A mix is ``kind=weight`` pairs over ``embeddings``, ``completions``,
``completions-stream``, ``chat`` and ``chat-stream``. Lengths are in words (about a
token each for real tokenizers; the reference worker's byte tokenizer counts about six
tokens per word) and output lengths in tokens, drawn from ``N`` (fixed),
``uniform:LO:HI``, ``normal:MEAN:SD`` or ``exp:MEAN`` (never below 1).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

KINDS: Final = ("embeddings", "completions", "completions-stream", "chat", "chat-stream")
PATHS: Final = {
    "embeddings": "/embeddings",
    "completions": "/completions",
    "chat": "/chat/completions",
}
WORDS: Final = [
    "latency",
    "queue",
    "batch",
    "kernel",
    "token",
    "prompt",
    "cache",
    "memory",
    "clock",
    "tensor",
    "stream",
    "window",
    "throughput",
    "percentile",
    "device",
    "warp",
    "occupancy",
    "bandwidth",
    "request",
    "scheduler",
]


class WorkloadError(ValueError):
    """A mix, a length distribution or a request file the load generator cannot use."""


@dataclass(frozen=True)
class RequestSpec:
    """One request: its endpoint, whether it streams, and its JSON body less the model."""

    endpoint: str  # a key of PATHS
    stream: bool
    body: dict[str, Any]

    @property
    def label(self) -> str:
        return self.endpoint + ("-stream" if self.stream else "")

    def json_body(self, model: str) -> dict[str, Any]:
        body = {"model": model, **self.body}
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body


def parse_mix(items: Sequence[str]) -> dict[str, float]:
    mix: dict[str, float] = {}
    for item in items:
        kind, sep, weight_text = item.partition("=")
        kind = kind.strip()
        if kind not in KINDS:
            raise WorkloadError(f"--mix: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
        try:
            weight = float(weight_text) if sep else 1.0
        except ValueError:
            raise WorkloadError(
                f"--mix: weight of {kind} is not a number: {weight_text!r}"
            ) from None
        if weight < 0:
            raise WorkloadError(f"--mix: weight of {kind} must not be negative")
        mix[kind] = weight
    if not mix or sum(mix.values()) <= 0:
        raise WorkloadError("--mix: give at least one kind with a positive weight")
    return mix


@dataclass(frozen=True)
class Lengths:
    """A length distribution, e.g. ``uniform:16:64``."""

    shape: str
    params: tuple[float, ...]

    @classmethod
    def parse(cls, flag: str, text: str) -> Lengths:
        shape, *rest = text.strip().split(":")
        arity = {"uniform": 2, "normal": 2, "exp": 1}
        try:
            params = tuple(float(p) for p in rest) if rest else (float(shape),)
        except ValueError:
            raise WorkloadError(f"{flag}: cannot read {text!r}") from None
        if not rest:
            return cls("fixed", (_positive(flag, params[0]),))
        if arity.get(shape) != len(params):
            raise WorkloadError(
                f"{flag}: expected N, uniform:LO:HI, normal:MEAN:SD or exp:MEAN, got {text!r}"
            )
        if shape == "uniform" and not 1 <= params[0] <= params[1]:
            raise WorkloadError(f"{flag}: uniform needs 1 <= LO <= HI, got {text!r}")
        if shape != "uniform":
            _positive(flag, params[0])
        return cls(shape, params)

    def draw(self, rng: random.Random) -> int:
        if self.shape == "fixed":
            value = self.params[0]
        elif self.shape == "uniform":
            value = rng.uniform(self.params[0], self.params[1])
        elif self.shape == "normal":
            value = rng.gauss(self.params[0], self.params[1])
        else:
            value = rng.expovariate(1 / self.params[0])
        return max(1, round(value))


def _positive(flag: str, value: float) -> float:
    if value < 1:
        raise WorkloadError(f"{flag}: lengths must be at least 1, got {value:g}")
    return value


def synthetic_requests(
    mix: dict[str, float], prompt: Lengths, output: Lengths, seed: int
) -> Iterator[RequestSpec]:
    """An endless, repeatable stream of requests drawn from ``mix``."""
    rng = random.Random(seed)
    kinds = [k for k, w in mix.items() if w > 0]
    weights = [mix[k] for k in kinds]
    while True:
        kind = rng.choices(kinds, weights)[0]
        endpoint, _, stream = kind.partition("-")
        text = " ".join(rng.choice(WORDS) for _ in range(prompt.draw(rng)))
        yield RequestSpec(endpoint, bool(stream), _body(endpoint, text, output.draw(rng)))


def _body(endpoint: str, text: str, max_tokens: int) -> dict[str, Any]:
    if endpoint == "embeddings":
        return {"input": text}
    if endpoint == "chat":
        return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    return {"prompt": text, "max_tokens": max_tokens}


def read_request_file(path: Path) -> list[RequestSpec]:
    """Requests from a JSONL file: one object a line with ``endpoint`` (``embeddings``,
    ``completions`` or ``chat``), optional ``stream``, and the rest of the body."""
    specs: list[RequestSpec] = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise WorkloadError(f"--requests-file: cannot read {str(path)!r}: {exc}") from None
    for number, line in enumerate(lines, 1):
        if line.strip():
            specs.append(_spec_from_line(path, number, line))
    if not specs:
        raise WorkloadError(f"--requests-file: {str(path)!r} holds no requests")
    return specs


def _spec_from_line(path: Path, number: int, line: str) -> RequestSpec:
    where = f"--requests-file: {path}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where}: not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: expected a JSON object")
    endpoint = record.pop("endpoint", None)
    if endpoint not in PATHS:
        raise WorkloadError(f"{where}: 'endpoint' must be one of {', '.join(PATHS)}")
    stream = record.pop("stream", False)
    if not isinstance(stream, bool) or (stream and endpoint == "embeddings"):
        raise WorkloadError(f"{where}: 'stream' must be true or false (and false for embeddings)")
    record.pop("model", None)  # the run's model wins
    return RequestSpec(endpoint, stream, record)


def cycle(specs: Sequence[RequestSpec]) -> Iterator[RequestSpec]:
    while True:
        yield from specs
