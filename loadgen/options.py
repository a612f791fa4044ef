"""The flags of ``gpuscope loadgen`` and ``gpuscope tune``, parsed once into frozen dataclasses.

``LoadOptions`` is what both commands share (the ladder, the mix, the outputs); each
command adds its own fields. Every flag has an environment twin under the command's
prefix (``GPUSCOPE_LOADGEN_CONCURRENCY``, ``GPUSCOPE_TUNE_SWEEP``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpuscope.contract.http import DEFAULT_URL, METRICS_PATH
from gpuscope.flags import (
    ConfigError,
    Settings,
    at_least,
    http_url,
    one_of,
    option,
    positive,
    spelling,
    writable_file,
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
# Where the exporter of a local stack listens, as the examples of --exporter-url say.
EXPORTER_URL_EXAMPLE: Final = DEFAULT_URL
LENGTHS: Final = "N, uniform:LO:HI, normal:MEAN:SD or exp:MEAN"


@dataclass(frozen=True)
class LoadOptions(Settings):
    concurrency: tuple[str, ...] = option(
        (),
        help="closed loop: comma-separated client counts, one step each (default 1,4,16)",
        metavar="N,...",
    )
    rate: tuple[str, ...] = option(
        (),
        help="open loop: comma-separated arrival rates per second, one step each",
        metavar="RATE,...",
    )
    arrival: str = option(
        "poisson", help="open-loop arrivals: " + " or ".join(ARRIVALS), check=one_of(ARRIVALS)
    )
    duration_s: float = option(10.0, help="how long each step lasts", check=positive)
    requests: int = option(
        0,
        help="requests per step (0: no bound; the step ends at whichever comes first)",
        check=at_least(0),
    )
    warmup_s: float = option(
        1.0,
        help="how long to load at the first step's level, unmeasured, before measuring",
        check=at_least(0),
    )
    seed: int = option(0, help="seed of the request stream and the arrival times")
    mix: tuple[str, ...] = option(
        ("embeddings=1", "completions-stream=1"),
        help="request kinds and weights: embeddings, completions, completions-stream, chat, "
        "chat-stream (e.g. embeddings=1,chat-stream=2)",
        metavar="KIND=WEIGHT,...",
    )
    prompt_words: str = option(
        "uniform:4:16", help="prompt length in words: " + LENGTHS, metavar="LENGTH"
    )
    output_tokens: str = option(
        "16", help="max_tokens of completions and chat: " + LENGTHS, metavar="LENGTH"
    )
    requests_file: Path | None = option(
        None,
        help="JSONL file of requests ({'endpoint': 'chat', 'stream': true, ...}), sent in "
        "order, instead of --mix",
    )
    model: str | None = option(
        None, help="model name to send (default: the first one /models lists)", metavar="NAME"
    )
    timeout_s: float = option(
        30.0, help="how long one request may take before it counts as a timeout", check=positive
    )
    max_in_flight: int = option(
        512,
        help="open loop: requests open at once beyond which a send counts as missed",
        unit="requests",
        check=at_least(1),
    )
    late_ms: float = option(
        10.0, help="open loop: a send this late on its schedule counts as missed", check=at_least(0)
    )
    max_response_bytes: int = option(
        DEFAULT_MAX_BODY_BYTES,
        help="largest non-streamed answer read; a larger one counts as a too_large error "
        "(every open request may hold this much)",
        check=at_least(1),
    )
    max_metrics_bytes: int = option(
        DEFAULT_MAX_METRICS_BYTES,
        help="largest /metrics read from the exporter; past it a step has no exporter view "
        "(about 1.9 MiB per 1,000 request series)",
        check=at_least(1),
    )
    record: Path | None = option(
        None, help="Markdown record file to append one row per step to", check=writable_file
    )
    json: str | None = option(
        None,
        help="write the results as JSON to this file ('-': standard output)",
        metavar="PATH",
        check=writable_file,
    )
    csv: str | None = option(
        None,
        help="write the results as CSV to this file ('-': standard output)",
        metavar="PATH",
        check=writable_file,
    )
    plot: Path | None = option(
        None,
        help="PNG of latency against load and the phase breakdown (needs matplotlib)",
        check=writable_file,
    )
    plot_record: bool = option(
        False,
        help="--plot draws every row of --record (each configuration of each run the file "
        "holds, this run's included), not only this run's steps",
    )

    def check(self) -> None:
        if self.plot_record and (self.plot is None or self.record is None):
            raise ConfigError(
                f"{_flag('plot_record')}: needs {_flag('plot')} and {_flag('record')}"
            )
        self.loads()  # raise on a bad ladder now, naming the flag
        try:
            self.request_stream()
        except WorkloadError as exc:
            raise ConfigError(str(exc)) from None

    def loads(self) -> tuple[Load, ...]:
        concurrency, rate = _flag("concurrency"), _flag("rate")
        if self.concurrency and self.rate:
            raise ConfigError(f"{concurrency} and {rate}: give one ladder, not both")
        if self.rate:
            return tuple(Load("rate", _number(rate, v, float)) for v in self.rate)
        levels = self.concurrency or DEFAULT_CONCURRENCY
        return tuple(Load("concurrency", _number(concurrency, v, int)) for v in levels)

    def request_stream(self) -> Iterator[RequestSpec]:
        if self.requests_file is not None:
            return cycle(read_request_file(self.requests_file))
        return synthetic_requests(
            parse_mix(self.mix),
            Lengths.parse(_flag("prompt_words"), self.prompt_words),
            Lengths.parse(_flag("output_tokens"), self.output_tokens),
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


def _flag(field: str) -> str:
    return spelling(LoadOptions, field)


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


@dataclass(frozen=True)
class LoadgenOptions(
    LoadOptions,
    prog="gpuscope loadgen",
    description="Put a ladder of load steps on an OpenAI-compatible endpoint and report "
    "latency percentiles, TTFT, throughput and errors per step; with --exporter-url, also "
    "where the time went.",
    env_prefix="GPUSCOPE_LOADGEN_",
):
    url: str = option(
        "http://127.0.0.1:8000/v1",
        help="OpenAI-compatible base URL",
        check=http_url("http://127.0.0.1:8000/v1"),
    )
    exporter_url: str | None = option(
        None,
        help=f"gpuscope exporter to read {METRICS_PATH} from around each step, e.g. "
        f"{EXPORTER_URL_EXAMPLE}",
        check=http_url(EXPORTER_URL_EXAMPLE),
    )
    label: str = option(
        "", help="what the record calls this configuration (e.g. 'max-queue-delay-ms=1')"
    )
