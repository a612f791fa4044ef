"""The flags of ``gpuscope loadgen`` and ``gpuscope tune``, parsed once into frozen dataclasses.

``LoadOptions`` is what both commands share (the ladder, the mix, the outputs); each
command adds its own fields. Every flag has an environment twin under the command's
prefix (``GPUSCOPE_LOADGEN_CONCURRENCY``, ``GPUSCOPE_TUNE_SWEEP``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpuscope.flags import (
    ConfigError,
    check_choice,
    check_http_url,
    check_positive,
    check_range,
)
from gpuscope.loadgen.client import DEFAULT_MAX_BODY_BYTES
from gpuscope.loadgen.probe import DEFAULT_MAX_METRICS_BYTES
from gpuscope.loadgen.results import Load
from gpuscope.loadgen.runner import ARRIVALS, Plan
from gpuscope.loadgen.workload import (
    Lengths,
    RequestSpec,
    WorkloadError,
    cycle,
    parse_mix,
    read_request_file,
    synthetic_requests,
)

DEFAULT_CONCURRENCY: Final = ("1", "4", "16")


@dataclass(frozen=True)
class LoadOptions:
    concurrency: tuple[str, ...] = ()
    rate: tuple[str, ...] = ()
    arrival: str = "poisson"
    duration_s: float = 10.0
    requests: int = 0
    warmup_s: float = 1.0
    seed: int = 0
    mix: tuple[str, ...] = ("embeddings=1", "completions-stream=1")
    prompt_words: str = "uniform:4:16"
    output_tokens: str = "16"
    requests_file: Path | None = None
    model: str | None = None
    timeout_s: float = 30.0
    max_in_flight: int = 512
    late_ms: float = 10.0
    max_response_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_metrics_bytes: int = DEFAULT_MAX_METRICS_BYTES
    record: Path | None = None
    json: str | None = None
    csv: str | None = None
    plot: Path | None = None

    def __post_init__(self) -> None:
        check_choice("--arrival", self.arrival, ARRIVALS)
        for flag, seconds in (("--duration-s", self.duration_s), ("--timeout-s", self.timeout_s)):
            check_positive(flag, seconds)
        check_range("--requests", self.requests, 0)
        check_range("--warmup-s", self.warmup_s, 0)
        check_range("--max-in-flight", self.max_in_flight, 1)
        check_range("--late-ms", self.late_ms, 0)
        check_range("--max-response-bytes", self.max_response_bytes, 1)
        check_range("--max-metrics-bytes", self.max_metrics_bytes, 1)
        for flag, path in (
            ("--record", self.record),
            ("--json", self.json),
            ("--csv", self.csv),
            ("--plot", self.plot),
        ):
            check_writable(flag, path)
        self.loads()  # raise on a bad ladder now, naming the flag
        try:
            self.request_stream()
        except WorkloadError as exc:
            raise ConfigError(str(exc)) from None

    def loads(self) -> tuple[Load, ...]:
        if self.concurrency and self.rate:
            raise ConfigError("--concurrency and --rate: give one ladder, not both")
        if self.rate:
            return tuple(Load("rate", _number("--rate", v, float)) for v in self.rate)
        levels = self.concurrency or DEFAULT_CONCURRENCY
        return tuple(Load("concurrency", _number("--concurrency", v, int)) for v in levels)

    def request_stream(self) -> Iterator[RequestSpec]:
        if self.requests_file is not None:
            return cycle(read_request_file(self.requests_file))
        return synthetic_requests(
            parse_mix(self.mix),
            Lengths.parse("--prompt-words", self.prompt_words),
            Lengths.parse("--output-tokens", self.output_tokens),
            self.seed,
        )

    def plan(self, config: str = "") -> Plan:
        return Plan(
            loads=self.loads(),
            duration_s=self.duration_s,
            requests=self.requests,
            warmup_s=self.warmup_s,
            arrival=self.arrival,
            seed=self.seed,
            timeout_s=self.timeout_s,
            max_in_flight=self.max_in_flight,
            late_ms=self.late_ms,
            config=config,
            max_response_bytes=self.max_response_bytes,
            max_metrics_bytes=self.max_metrics_bytes,
        )


# Steps beyond what one Python client can drive: each client is a coroutine with its
# connection, each arrival a prompt drawn on the event loop.
MAX_STEP: Final = 100_000


def _number(flag: str, text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{flag}: cannot read {text!r} as a number") from None
    if not math.isfinite(value) or not 0 < value <= MAX_STEP:
        raise ConfigError(
            f"{flag}: every step must be greater than 0 and at most {MAX_STEP}, got {text}"
        )
    return float(value)


def check_writable(flag: str, path: str | Path | None) -> None:
    """Refuse an output file that cannot be written now, before minutes of load are
    spent and lost on it (``-`` is standard output)."""
    if path is None or str(path) == "-":
        return
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise ConfigError(f"{flag}: {str(path)!r} is a folder; name a file")
    if not folder.is_dir():
        raise ConfigError(f"{flag}: the folder {str(folder)!r} does not exist")
    writable = os.access(target, os.W_OK) if target.exists() else os.access(folder, os.W_OK)
    if not writable:
        raise ConfigError(f"{flag}: cannot write {str(path)!r}")


def check_url(flag: str, url: str | None, example: str) -> None:
    if url is not None:
        check_http_url(flag, url, example)


@dataclass(frozen=True)
class LoadgenOptions(LoadOptions):
    url: str = "http://127.0.0.1:8000/v1"
    exporter_url: str | None = None
    label: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_url("--url", self.url, "http://127.0.0.1:8000/v1")
        check_url("--exporter-url", self.exporter_url, "http://127.0.0.1:9420")


LOAD_HELP: Final = {
    "concurrency": "closed loop: comma-separated client counts, one step each (default 1,4,16)",
    "rate": "open loop: comma-separated arrival rates per second, one step each",
    "arrival": "open-loop arrivals: poisson or constant",
    "duration_s": "seconds of load per step",
    "requests": "requests per step (0: no bound; the step ends at whichever comes first)",
    "warmup_s": "seconds of unmeasured load at the first step's level before measuring",
    "seed": "seed of the request stream and the arrival times",
    "mix": "request kinds and weights: embeddings, completions, completions-stream, chat, "
    "chat-stream (e.g. embeddings=1,chat-stream=2)",
    "prompt_words": "prompt length in words: N, uniform:LO:HI, normal:MEAN:SD or exp:MEAN",
    "output_tokens": "max_tokens of completions and chat: N, uniform:LO:HI, normal:MEAN:SD "
    "or exp:MEAN",
    "requests_file": "JSONL file of requests ({'endpoint': 'chat', 'stream': true, ...}), "
    "sent in order, instead of --mix",
    "model": "model name to send (default: the first one /models lists)",
    "timeout_s": "seconds one request may take before it counts as a timeout",
    "max_in_flight": "open loop: requests open at once beyond which a send counts as missed",
    "late_ms": "open loop: a send this late on its schedule counts as missed",
    "max_response_bytes": "largest non-streamed answer read; a larger one counts as a "
    "too_large error (every open request may hold this much)",
    "max_metrics_bytes": "largest /metrics read from the exporter; past it a step has no "
    "exporter view (about 1.9 MiB per 1,000 request series)",
    "record": "Markdown record file to append one row per step to",
    "json": "write the results as JSON to this file ('-': standard output)",
    "csv": "write the results as CSV to this file ('-': standard output)",
    "plot": "PNG of latency against load and the phase breakdown (needs matplotlib)",
}

LOADGEN_HELP: Final = {
    **LOAD_HELP,
    "url": "OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1",
    "exporter_url": "gpuscope exporter to read /metrics from around each step, "
    "e.g. http://127.0.0.1:9420",
    "label": "what the record calls this configuration (e.g. 'max-queue-delay-ms=1')",
}
