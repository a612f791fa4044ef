"""What to send: a seeded stream of requests from a mix and length distributions, or a
JSONL file of requests, free of I/O apart from reading that file.

A mix is ``kind=weight`` pairs over ``embeddings``, ``completions``,
``completions-stream``, ``chat`` and ``chat-stream``. Lengths are in words (about a
token each for real tokenizers; the reference worker's byte tokenizer counts about six
tokens per word) and output lengths in tokens, drawn from ``N`` (fixed),
``uniform:LO:HI``, ``normal:MEAN:SD`` or ``exp:MEAN`` (never below 1).
"""

from __future__ import annotations

import array
import itertools
import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, overload

KINDS: Final = ("embeddings", "completions", "completions-stream", "chat", "chat-stream")
PATHS: Final = {
    "embeddings": "/embeddings",
    "completions": "/completions",
    "chat": "/chat/completions",
    # KServe v2 (Triton): the body holds the model's own tensors, so it comes only from
    # --requests-file; the model's name is in the path, not the body
    "infer": "/v2/models/{model}/infer",
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


MIB: Final = 1024 * 1024
# Longest prompt in words and longest output in tokens a distribution may ask for: far
# beyond any context window, and a prompt of this many words is still built in
# milliseconds (at 1e9 words the load generator hung building the first one).
MAX_LENGTH: Final = 100_000
MAX_REQUEST_LINE_BYTES: Final = 16 * MIB
MAX_REQUEST_FILE_BYTES: Final = 64 * MIB


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
        if self.endpoint == "infer":
            return dict(self.body)
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
        if not math.isfinite(weight):  # NaN passes every comparison below
            raise WorkloadError(f"--mix: weight of {kind} must be a finite number, got {weight}")
        if weight < 0:
            raise WorkloadError(f"--mix: weight of {kind} must not be negative")
        mix[kind] = weight
    if not mix or sum(mix.values()) <= 0:
        raise WorkloadError("--mix: give at least one kind with a positive weight")
    return mix


@dataclass(frozen=True)
class Lengths:
    """A length distribution, e.g. ``uniform:16:64``; every draw is between 1 and
    ``MAX_LENGTH``."""

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
        if not all(math.isfinite(p) for p in params):  # NaN passes every check below
            raise WorkloadError(f"{flag}: every number must be finite, got {text!r}")
        if not rest:
            return cls("fixed", (_length(flag, params[0]),))
        if arity.get(shape) != len(params):
            raise WorkloadError(
                f"{flag}: expected N, uniform:LO:HI, normal:MEAN:SD or exp:MEAN, got {text!r}"
            )
        if shape == "uniform" and not 1 <= params[0] <= params[1]:
            raise WorkloadError(f"{flag}: uniform needs 1 <= LO <= HI, got {text!r}")
        _length(flag, params[-1] if shape == "uniform" else params[0])
        if shape == "normal" and not 0 <= params[1] <= MAX_LENGTH:
            raise WorkloadError(f"{flag}: SD must be between 0 and {MAX_LENGTH}, got {text!r}")
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
        return min(MAX_LENGTH, max(1, round(value)))


def _length(flag: str, value: float) -> float:
    if value < 1:
        raise WorkloadError(f"{flag}: lengths must be at least 1, got {value:g}")
    if value > MAX_LENGTH:
        raise WorkloadError(f"{flag}: lengths must be at most {MAX_LENGTH}, got {value:g}")
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


class RequestFile(Sequence[RequestSpec]):
    """The requests of a JSONL file, in order: one object a line with ``endpoint``
    (``embeddings``, ``completions`` or ``chat``), optional ``stream``, and the rest of
    the body.

    Read a line at a time, each at most ``MAX_REQUEST_LINE_BYTES`` and the whole at most
    ``MAX_REQUEST_FILE_BYTES`` (a file such as ``/dev/zero`` never ends). Every line is
    checked once, then kept as the file's bytes and parsed again when it is sent: a
    parsed request costs ten times its bytes, which for 64 MiB of short lines was over
    700 MB."""

    def __init__(self, path: Path) -> None:
        self.path = path
        kept = bytearray()
        self._starts = array.array("Q")
        self._numbers = array.array("Q")  # each request's line number, for errors
        total = 0
        try:
            with path.open("rb") as lines:
                for number in itertools.count(1):
                    raw = lines.readline(MAX_REQUEST_LINE_BYTES + 1)
                    if not raw:
                        break
                    total += len(raw)
                    _check_size(path, number, raw, total)
                    if raw.strip():
                        _spec_from_line(path, number, raw)  # refuse a bad line now
                        self._starts.append(len(kept))
                        self._numbers.append(number)
                        kept += raw
        except OSError as exc:
            raise WorkloadError(f"--requests-file: cannot read {str(path)!r}: {exc}") from None
        if not self._starts:
            raise WorkloadError(f"--requests-file: {str(path)!r} holds no requests")
        self._starts.append(len(kept))
        self._bytes = kept  # not copied into ``bytes``: that would hold the file twice

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, index: int) -> RequestSpec: ...

    @overload
    def __getitem__(self, index: slice) -> list[RequestSpec]: ...

    def __getitem__(self, index: int | slice) -> RequestSpec | list[RequestSpec]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        line = self._bytes[self._starts[index] : self._starts[index + 1]]
        return _spec_from_line(self.path, self._numbers[index], line)


def read_request_file(path: Path) -> RequestFile:
    """The requests of a JSONL file (see ``RequestFile``)."""
    return RequestFile(path)


def _check_size(path: Path, number: int, line: bytes, total: int) -> None:
    if len(line) > MAX_REQUEST_LINE_BYTES:
        limit = MAX_REQUEST_LINE_BYTES // MIB
        raise WorkloadError(f"--requests-file: {path}:{number}: longer than {limit} MiB")
    if total > MAX_REQUEST_FILE_BYTES:
        limit = MAX_REQUEST_FILE_BYTES // MIB
        raise WorkloadError(f"--requests-file: {str(path)!r} is larger than {limit} MiB")


def _spec_from_line(path: Path, number: int, line: bytes | bytearray) -> RequestSpec:
    where = f"--requests-file: {path}:{number}"
    try:
        record = json.loads(line)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, 4,300+ digit numbers
        raise WorkloadError(f"{where}: not JSON ({exc})") from None
    except RecursionError:
        raise WorkloadError(f"{where}: not JSON (nested too deeply)") from None
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
