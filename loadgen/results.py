"""One load step's results, summarised from its outcomes, free of I/O."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpuscope.loadgen.client import Outcome
from gpuscope.loadgen.server_view import ServerStep
from gpuscope.loadgen.stats import percentile
from gpuscope.loadgen.workload import PATHS


@dataclass(frozen=True)
class Load:
    """A step's offered load: ``concurrency`` clients (closed loop) or ``rate`` per second."""

    mode: str  # "concurrency" | "rate"
    value: float

    @property
    def label(self) -> str:
        return f"c={self.value:g}" if self.mode == "concurrency" else f"{self.value:g}/s"


@dataclass(frozen=True)
class StepResult:
    load: Load
    config: str
    duration_s: float
    sent: int
    ok: int
    missed: int
    errors: dict[str, int]
    throughput_rps: float
    tokens_per_s: float
    latency_ms: dict[str, float]  # p50, p95, p99, max
    ttft_ms: dict[str, float]  # p50, p99 (streams)
    tpot_ms: dict[str, float]  # p50, p99 (streams)
    by_kind: dict[str, int]
    interrupted: bool = False
    server: ServerStep | None = None
    # the engine's own /metrics over the same requests (--engine-metrics), to set beside
    # ``server``: the tuner's view checked against the engine's histograms
    engine: ServerStep | None = None
    notes: list[str] = field(default_factory=list)
    finished: datetime = field(default_factory=lambda: datetime.now(UTC))
    not_started: str = ""  # why the configuration's server never served (no load ran)

    @property
    def p99_ms(self) -> float | None:
        return self.latency_ms.get("p99")


def not_started(load: Load, config: str, reason: str, log_lines: Sequence[str]) -> StepResult:
    """The one row of a configuration whose server did not start: why, and its log's end."""
    notes = [f"its log ends: {' / '.join(log_lines)}"] if log_lines else []
    return StepResult(
        load=load,
        config=config,
        duration_s=0.0,
        sent=0,
        ok=0,
        missed=0,
        errors={},
        throughput_rps=0.0,
        tokens_per_s=0.0,
        latency_ms={},
        ttft_ms={},
        tpot_ms={},
        by_kind={},
        notes=notes,
        not_started=reason,
    )


def _cuts(values: Sequence[float], points: Sequence[str]) -> dict[str, float]:
    if not values:
        return {}
    cuts: dict[str, float] = {}
    for point in points:
        value = max(values) if point == "max" else percentile(values, float(point[1:]))
        cuts[point] = (value or 0.0) * 1000
    return cuts


def summarize(
    load: Load,
    outcomes: Sequence[Outcome],
    duration_s: float,
    *,
    missed: int = 0,
    config: str = "",
    interrupted: bool = False,
    server: ServerStep | None = None,
    engine: ServerStep | None = None,
) -> StepResult:
    good = [o for o in outcomes if o.ok]
    errors = Counter(o.error for o in outcomes if o.error is not None)
    streams = [o for o in good if o.ttft_s is not None]
    window = max(duration_s, 1e-9)
    notes = []
    if any(error == "status 404" for error in errors):
        missing = sorted({o.label for o in outcomes if o.error == "status 404"})
        paths = ", ".join(f"{label} ({PATHS[label.split('-')[0]]})" for label in missing)
        notes.append(f"404 from {paths}: the server does not serve that endpoint")
    return StepResult(
        load=load,
        config=config,
        duration_s=duration_s,
        sent=len(outcomes),
        ok=len(good),
        missed=missed,
        errors=dict(sorted(errors.items())),
        throughput_rps=len(good) / window,
        tokens_per_s=sum(o.output_tokens for o in good) / window,
        latency_ms=_cuts([o.latency_s for o in good], ("p50", "p95", "p99", "max")),
        ttft_ms=_cuts([o.ttft_s for o in streams if o.ttft_s is not None], ("p50", "p99")),
        tpot_ms=_cuts([o.tpot_s for o in streams if o.tpot_s is not None], ("p50", "p99")),
        by_kind=dict(sorted(Counter(o.label for o in outcomes).items())),
        interrupted=interrupted,
        server=server,
        engine=engine,
        notes=notes,
    )
