"""The rows, table and verdict of ``gpuscope tune`` from a real Triton sweep, replayed
from the fixtures ``make tune-triton-check`` captured (tests/fixtures/tune-triton-2.51/):
the run's ``--json`` steps, its record and the model's own log, per step."""

from __future__ import annotations

import json
from pathlib import Path

from gpuscope.loadgen import record
from gpuscope.loadgen.objective import Objective, choose
from gpuscope.loadgen.output import table
from gpuscope.loadgen.results import StepResult
from support.tune_triton import DELAYS_US, check

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tune-triton-2.51"
OBJECTIVE = Objective.parse("max throughput with p99 <= 100 ms")


def captured() -> tuple[str, list[StepResult]]:
    return record.read_json((FIXTURES / "tune.json").read_text())


def test_the_record_rows_are_the_steps_of_the_json() -> None:
    env, steps = captured()
    rows = [record.step_row(step, env) for step in steps]
    assert rows == record.read_record((FIXTURES / "record.md").read_text())
    assert [r["config"] for r in rows] == [f"max-queue-delay-us={d}" for d in DELAYS_US]
    # Triton's counters give the phase means, the batch, no P99 split and no GPU state
    for row in rows:
        assert row["queue ms"] and row["compute ms"] and row["batch"]
        assert row["batch_wait ms"] == "" and row["p99 led by"] == "" and row["sm occ"] == ""


def test_the_counters_match_what_the_model_logged_and_move_with_the_delay() -> None:
    _, steps = captured()
    truth = json.loads((FIXTURES / "truth.json").read_text())
    assert check(steps, truth) == []


def test_the_table_and_the_verdict_are_the_runs() -> None:
    env, steps = captured()
    by_config: dict[str, list[StepResult]] = {}
    for step in steps:
        by_config.setdefault(step.config, []).append(step)
    verdict = choose(OBJECTIVE, by_config)
    text = table(steps, env) + "\n".join(verdict.lines) + "\n"
    assert text == (FIXTURES / "table.txt").read_text()
    assert verdict.best == "max-queue-delay-us=20000"
    # each loser's line: its P99 against the winner's, the phase that grew, the batch
    lines = {line.split(":")[0].strip(): line for line in verdict.lines[1:]}
    assert "queue +60.55 ms mean; batch 8.00 vs 7.19" in lines["max-queue-delay-us=80000"]
    assert "no server phase's mean grew; batch 3.49 vs 7.19" in lines["max-queue-delay-us=0"]
