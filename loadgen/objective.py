"""Which configuration of a sweep is best under a stated objective, and why the others
lose, free of I/O.

Objectives: ``max throughput with p99 <= X ms`` (the highest throughput of any step
whose P99 is at most X ms and that had no errors) and ``min p99 at rate R`` (the lowest
P99 of the open-loop step at R requests per second). A losing configuration is
explained by its step at the winner's load: its P99 against the winner's and the
phase whose mean grew the most. ``Verdict.by_config`` says the same per configuration,
for the record's verdict and why columns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuscope.loadgen.results import StepResult

_MAX_THROUGHPUT = re.compile(r"max\s+throughput\s+with\s+p99\s*(?:<=|≤)\s*([0-9.]+)\s*ms", re.I)
_MIN_P99 = re.compile(r"min\s+p99\s+at\s+rate\s+([0-9.]+)(?:\s*/\s*s)?", re.I)


class ObjectiveError(ValueError):
    """An objective the tuner cannot read."""


@dataclass(frozen=True)
class Objective:
    kind: str  # "max-throughput" | "min-p99"
    bound: float  # the P99 bound (ms) or the rate (requests/s)

    @classmethod
    def parse(cls, text: str) -> Objective:
        if match := _MAX_THROUGHPUT.fullmatch(text.strip()):
            return cls("max-throughput", _number(match.group(1), text))
        if match := _MIN_P99.fullmatch(text.strip()):
            return cls("min-p99", _number(match.group(1), text))
        raise ObjectiveError(
            f"--objective: expected 'max throughput with p99 <= X ms' or 'min p99 at rate R', "
            f"got {text!r}"
        )

    def __str__(self) -> str:
        if self.kind == "max-throughput":
            return f"max throughput with p99 <= {self.bound:g} ms"
        return f"min p99 at rate {self.bound:g}/s"

    def candidate(self, steps: Sequence[StepResult]) -> StepResult | None:
        """The step that scores this configuration; None when none qualifies. Under
        either objective only a clean step qualifies: no errors and no missed sends. The
        P99 is the successes' and leaves out the arrivals never sent, so a value that
        fails its slow requests, or could not send them, would score a better P99 (a
        value answering every second request 500 was named best at a rate)."""
        clean = [s for s in steps if s.p99_ms is not None and s.ok and _clean(s)]
        if self.kind == "max-throughput":
            fitting = [s for s in clean if s.p99_ms is not None and s.p99_ms <= self.bound]
            return max(fitting, key=lambda s: s.throughput_rps, default=None)
        at_rate = [s for s in clean if s.load.mode == "rate" and s.load.value == self.bound]
        return at_rate[0] if at_rate else None

    def score(self, step: StepResult) -> float:
        """Higher is better."""
        if self.kind == "max-throughput":
            return step.throughput_rps
        return -(step.p99_ms or 0.0)

    def describe(self, step: StepResult) -> str:
        if self.kind == "max-throughput":
            return (
                f"{step.throughput_rps:.1f} req/s at {step.load.label} (p99 {step.p99_ms:.1f} ms)"
            )
        return f"p99 {step.p99_ms:.1f} ms at {step.load.label}"


def _clean(step: StepResult) -> bool:
    return not step.errors and not step.missed


def _number(text: str, whole: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ObjectiveError(f"--objective: cannot read a number in {whole!r}") from None
    if value <= 0:
        raise ObjectiveError(f"--objective: the bound must be greater than 0 in {whole!r}")
    return value


BEST, LOST, NOT_STARTED, NONE_MET = "best", "lost", "not started", "none met"


@dataclass(frozen=True)
class Verdict:
    objective: Objective
    best: str | None
    lines: list[str]
    # each configuration's (verdict, why): BEST with the objective and its score, LOST
    # or NOT_STARTED with its line's reason, NONE_MET when no configuration qualified
    by_config: dict[str, tuple[str, str]] = field(default_factory=dict)


def choose(objective: Objective, sweep: Mapping[str, Sequence[StepResult]]) -> Verdict:
    """The best configuration of ``sweep`` (configuration -> its steps) and one line each."""
    candidates = {config: objective.candidate(steps) for config, steps in sweep.items()}
    scored = {config: step for config, step in candidates.items() if step is not None}
    if not scored:
        none = f"no configuration meets '{objective}'"
        by_config = {
            config: _why_lost(objective, steps, None, None) for config, steps in sweep.items()
        }
        by_config = {
            config: (NOT_STARTED if kind == NOT_STARTED else NONE_MET, f"{none}; {why}")
            for config, (kind, why) in by_config.items()
        }
        return Verdict(objective, None, [none], by_config)
    best = max(scored, key=lambda config: objective.score(scored[config]))
    winner = scored[best]
    lines = [f"best under '{objective}': {best}: {objective.describe(winner)}"]
    by_config = {best: (BEST, f"under '{objective}': {objective.describe(winner)}")}
    for config, steps in sweep.items():
        if config != best:
            by_config[config] = _why_lost(objective, steps, candidates[config], winner)
            lines.append(f"  {config}: {by_config[config][1]}")
    return Verdict(objective, best, lines, by_config)


def _why_lost(
    objective: Objective,
    steps: Sequence[StepResult],
    own: StepResult | None,
    winner: StepResult | None,
) -> tuple[str, str]:
    """(LOST or NOT_STARTED, why); without a winner, only the configuration's own part."""
    if steps and all(step.not_started for step in steps):
        return NOT_STARTED, f"did not start: {steps[0].not_started}"
    if own is not None:
        head = objective.describe(own)
    elif objective.kind == "max-throughput":
        head = f"no error-free step with p99 <= {objective.bound:g} ms"
    else:
        at_rate = [s for s in steps if s.load.mode == "rate" and s.load.value == objective.bound]
        head = (
            f"its step at rate {objective.bound:g}/s had errors or missed sends"
            if at_rate
            else f"no step at rate {objective.bound:g}/s"
        )
    return LOST, head + (_against(steps, winner) if winner is not None else "")


def _against(steps: Sequence[StepResult], winner: StepResult) -> str:
    """A loser's step at the winner's load set beside the winner's ('' if it has none)."""
    same_load = next((s for s in steps if s.load == winner.load), None)
    if same_load is None or same_load.p99_ms is None or winner.p99_ms is None:
        return ""
    return f"; at {winner.load.label} " + phase_difference(same_load, winner)


def phase_difference(loser: StepResult, winner: StepResult) -> str:
    """P99s side by side and the phase whose mean grew the most, with its P99 share."""
    text = f"p99 {loser.p99_ms:.1f} ms vs {winner.p99_ms:.1f} ms"
    if loser.server is None or winner.server is None:
        return text
    growth = {
        phase: ms - winner.server.phase_mean_ms.get(phase, 0.0)
        for phase, ms in loser.server.phase_mean_ms.items()
    }
    if not growth:
        return text
    phase = max(growth, key=lambda name: growth[name])
    if growth[phase] <= 0:
        # every phase's mean is at most the winner's: the loss is in the tail, or in time
        # outside the server's phases (its HTTP frontend, the client)
        return text + "; no server phase's mean grew" + _batch_difference(loser, winner)
    text += f"; {phase} {growth[phase]:+.2f} ms mean"
    if not (loser.server.phase_p99_share and winner.server.phase_p99_share):
        # an engine's counters (Triton's) give means, not a P99 split: no share to show
        return text + _batch_difference(loser, winner)
    own_share = loser.server.phase_p99_share.get(phase, 0.0)
    best_share = winner.server.phase_p99_share.get(phase, 0.0)
    return (
        text
        + f" ({own_share:.0%} of the p99 vs {best_share:.0%})"
        + _batch_difference(loser, winner)
    )


def _batch_difference(loser: StepResult, winner: StepResult) -> str:
    """The mean batch of both, when the server says (or else the engine's own metrics,
    vLLM's): the knob's effect, often the cause."""
    own, best = _batch(loser), _batch(winner)
    if own is None or best is None or abs(own - best) < 0.05:
        return ""
    return f"; batch {own:.2f} vs {best:.2f}"


def _batch(step: StepResult) -> float | None:
    for view in (step.server, step.engine):
        if view is not None and view.batch_size_mean is not None:
            return view.batch_size_mean
    return None
