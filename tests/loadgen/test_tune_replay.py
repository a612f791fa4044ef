"""The rows, table and verdict of ``gpuscope tune`` from real engine sweeps, replayed from
the fixtures ``make tune-triton-check``, ``make tune-vllm-check`` and ``make
tune-ray-check`` captured (tests/fixtures/tune-*/): each run's
``--json`` steps, its record and table, for Triton the model's own log, per step, and for
vLLM its own ``/metrics`` before and after each row's measured requests."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuscope.loadgen import record
from gpuscope.loadgen.engine_metrics import VllmSnapshotBuilder, vllm_stages
from gpuscope.loadgen.objective import Objective, choose
from gpuscope.loadgen.output import table
from gpuscope.loadgen.results import StepResult
from gpuscope.loadgen.server_view import Snapshot, step_view
from support import tune_ray, tune_vllm
from support.tune_triton import DELAYS_US, check

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tune-triton-2.51"
VLLM_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tune-vllm-0.32.0"
RAY_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tune-ray-2.60.0"
OBJECTIVE = Objective.parse("max throughput with p99 <= 100 ms")
VLLM_OBJECTIVE = Objective.parse("max throughput with p99 <= 5000 ms")


def captured(folder: Path = FIXTURES) -> tuple[str, list[StepResult]]:
    return record.read_json((folder / "tune.json").read_text())


def rendered(folder: Path, objective: Objective) -> tuple[str, list[str]]:
    """The table and the verdict's lines as ``gpuscope tune`` prints them."""
    env, steps = captured(folder)
    by_config: dict[str, list[StepResult]] = {}
    for step in steps:
        by_config.setdefault(step.config, []).append(step)
    verdict = choose(objective, by_config)
    return table(steps, env) + "\n".join(verdict.lines) + "\n", verdict.lines


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


def test_triton_s_queue_must_rise_at_each_delay_not_only_end_to_end() -> None:
    _, steps = captured()
    truth = json.loads((FIXTURES / "truth.json").read_text())
    queues = [s.server.phase_mean_ms["queue"] for s in steps if s.server]
    assert queues == sorted(queues) and len(set(queues)) == 3  # the run's: 9, 15, 76 ms
    # the middle delay's queue above the last's: the first and last still rise
    middle = steps[1]
    assert middle.server is not None
    means = {**middle.server.phase_mean_ms, "queue": queues[-1] + 1}
    bent = dataclasses.replace(
        middle, server=dataclasses.replace(middle.server, phase_mean_ms=means)
    )
    problems = check([steps[0], bent, steps[2]], truth)
    assert problems == [
        f"Triton's queue does not rise at each delay: {[queues[0], queues[-1] + 1, queues[-1]]}"
    ]


def test_the_table_and_the_verdict_are_the_runs() -> None:
    text, lines = rendered(FIXTURES, OBJECTIVE)
    assert text == (FIXTURES / "table.txt").read_text()
    assert lines[0].startswith("best under 'max throughput with p99 <= 100 ms': ")
    assert lines[0].split(": ")[1] == "max-queue-delay-us=20000"
    # each loser's line: its P99 against the winner's, the phase that grew, the batch
    losers = {line.split(":")[0].strip(): line for line in lines[1:]}
    assert "queue +60.55 ms mean; batch 8.00 vs 7.19" in losers["max-queue-delay-us=80000"]
    assert "no server phase's mean grew; batch 3.49 vs 7.19" in losers["max-queue-delay-us=0"]


def rederived(steps: list[StepResult]) -> list[StepResult]:
    """The vLLM steps with the engine view this version reads from the scrapes that
    bounded them (the capture predates the mean batch from vLLM's counts)."""
    return [
        dataclasses.replace(
            step,
            engine=step_view(
                vllm_snapshot(vllm_scrape(step.config, "before")),
                vllm_snapshot(vllm_scrape(step.config, "after")),
            ),
        )
        for step in steps
    ]


def test_vllm_with_more_sequences_queues_less_and_the_loser_says_queue() -> None:
    env, steps = captured(VLLM_FIXTURES)
    text, lines = rendered(VLLM_FIXTURES, VLLM_OBJECTIVE)
    assert tune_vllm.check(rederived(steps), text) == []
    assert [record.step_row(s, env) for s in steps] == record.read_record(
        (VLLM_FIXTURES / "record.md").read_text()
    )
    assert text == (VLLM_FIXTURES / "table.txt").read_text()
    assert lines[0].split(": ")[1] == "max-num-seqs=8"
    # the loser's cause is the queue, which leads its P99
    assert "max-num-seqs=2" in lines[1] and "; queue +" in lines[1]
    assert record.step_row(steps[0], env)["p99 led by"].startswith("queue")


def vllm_scrape(config: str, when: str) -> str:
    value = config.partition("=")[2]
    return (VLLM_FIXTURES / "metrics" / f"max-num-seqs-{value}-{when}.prom").read_text()


def vllm_snapshot(text: str) -> Snapshot:
    builder = VllmSnapshotBuilder()
    for line in text.splitlines():
        builder.add(line)
    return builder.finish(0.0)


def test_vllm_own_histograms_over_each_row_give_its_engine_view_within_5_percent() -> None:
    _, steps = captured(VLLM_FIXTURES)
    assert [s.config for s in steps] == [tune_vllm.FEW, tune_vllm.MANY]
    for step in steps:
        before, after = vllm_scrape(step.config, "before"), vllm_scrape(step.config, "after")
        # the row's engine view is exactly the delta of vLLM's scrapes that bound it
        # (but the mean batch, which the capture's version did not read)
        view = step_view(vllm_snapshot(before), vllm_snapshot(after))
        assert dataclasses.replace(view, batch_size_mean=None) == step.engine
        assert step.server is not None
        # the warm-up's requests are counted before the first scrape, in neither view:
        # both count exactly the row's requests
        assert vllm_snapshot(before).requests > 0
        assert view.requests == step.server.requests == step.ok
        # compute is vLLM's inference time, which is its prefill and decode together
        stages = {
            name: vllm_stages(after.splitlines())[name].minus(h)
            for name, h in vllm_stages(before.splitlines()).items()
        }
        inference = stages["vllm:request_inference_time_seconds"].sum
        assert inference == pytest.approx(
            stages["vllm:request_prefill_time_seconds"].sum
            + stages["vllm:request_decode_time_seconds"].sum
        )
        assert view.phase_mean_ms["compute"] == pytest.approx(inference / view.requests * 1000)
        assert tune_vllm.engine_problems(step) == []


def vllm_count(text: str, sample: str) -> float:
    (value,) = (float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(sample + "{"))  # fmt: skip
    return value


def test_vllm_mean_batch_is_generated_tokens_per_engine_step_over_each_row() -> None:
    env, steps = captured(VLLM_FIXTURES)
    views = rederived(steps)
    batches = {}
    for view in views:
        before, after = vllm_scrape(view.config, "before"), vllm_scrape(view.config, "after")
        delta = {
            sample: vllm_count(after, sample) - vllm_count(before, sample)
            for sample in ("vllm:generation_tokens_total", "vllm:iteration_tokens_total_count")
        }
        assert view.engine is not None and view.engine.batch_size_mean is not None
        assert view.engine.batch_size_mean == pytest.approx(
            delta["vllm:generation_tokens_total"] / delta["vllm:iteration_tokens_total_count"]
        )
        batches[view.config] = view.engine.batch_size_mean
    # 1476 tokens in 739 steps at two sequences, 4870 in 755 at eight
    assert batches == {
        tune_vllm.FEW: pytest.approx(1476 / 739),
        tune_vllm.MANY: pytest.approx(4870 / 755),
    }
    assert tune_vllm.batch_problems(views) == []
    # the row's batch column and the loser's line then carry it, marked as the engine's
    assert [record.step_row(s, env)["batch"] for s in views] == ["2.00 (engine)", "6.45 (engine)"]
    engine_section = table(views, env).split("the engine's own /metrics")[1].splitlines()
    assert engine_section[1].split()[:4] == ["config", "load", "requests", "batch"]
    assert " - / 2.00 " in engine_section[2] and " - / 6.45 " in engine_section[3]
    verdict = choose(VLLM_OBJECTIVE, {s.config: [s] for s in views})
    assert verdict.lines[1].endswith("; batch 2.00 vs 6.45")
    # a cap the batch exceeds, or a batch that does not grow, is a problem
    few = views[0]
    assert few.engine is not None
    over = dataclasses.replace(few, engine=dataclasses.replace(few.engine, batch_size_mean=2.5))
    assert tune_vllm.batch_problems([over, views[1]]) == [
        "max-num-seqs=2: vLLM's mean batch 2.5, not between 1 and 2"
    ]


def test_a_tuner_mean_more_than_5_percent_off_vllms_is_a_problem() -> None:
    _, steps = captured(VLLM_FIXTURES)
    step = steps[0]
    assert step.engine is not None
    off = {p: m * 1.06 for p, m in step.engine.phase_mean_ms.items()}
    shifted = dataclasses.replace(step, server=dataclasses.replace(step.engine, phase_mean_ms=off))
    problems = tune_vllm.engine_problems(shifted)
    assert len(problems) == 2 and all("(6.0%)" in p for p in problems)
    assert tune_vllm.engine_problems(dataclasses.replace(step, engine=None)) != []


def test_ray_serve_with_a_longer_window_batches_more_and_the_loser_says_batch_wait() -> None:
    env, steps = captured(RAY_FIXTURES)
    text, lines = rendered(RAY_FIXTURES, Objective.parse("max throughput with p99 <= 1000 ms"))
    assert tune_ray.check(steps, text) == []
    assert [record.step_row(s, env) for s in steps] == record.read_record(
        (RAY_FIXTURES / "record.md").read_text()
    )
    assert text == (RAY_FIXTURES / "table.txt").read_text()
    assert lines[0].split(": ")[1] == tune_ray.LONG
    # every phase the wrapper marks is there, the batch included
    for step in steps:
        assert step.server is not None and step.server.batch_size_mean is not None
        assert set(step.server.phase_mean_ms) >= {"queue", "batch_wait", "compute"}
