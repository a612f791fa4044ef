"""The checks of a ``gpuscope tune`` sweep of vLLM's ``--max-num-seqs``, shared by the live
run (tests/engines/test_tune_vllm_live.py) and its replay from the captured fixtures
(tests/loadgen/test_tune_replay.py)."""

from __future__ import annotations

from gpuscope.loadgen.results import StepResult

FEW, MANY = "max-num-seqs=2", "max-num-seqs=8"


def check(steps: list[StepResult], verdict_text: str) -> list[str]:
    problems = []
    by_config = {step.config: step for step in steps}
    if sorted(by_config) != [FEW, MANY]:
        return [f"expected one row per value, got {[s.config for s in steps]}"]
    few, many = by_config[FEW].server, by_config[MANY].server
    if few is None or many is None:
        return ["a step has no exporter view (did vLLM's spans reach the exporter?)"]
    for step in steps:
        if step.errors or step.ok == 0:
            problems.append(f"{step.config}: errors {step.errors}, {step.ok} ok")
    queue = few.phase_mean_share.get("queue", 0.0), many.phase_mean_share.get("queue", 0.0)
    if not queue[1] < queue[0]:
        problems.append(f"the queue's share does not fall with more sequences: {queue}")
    compute = few.phase_mean_share.get("compute", 0.0), many.phase_mean_share.get("compute", 0.0)
    if not compute[1] > compute[0]:
        problems.append(f"compute's share does not rise with more sequences: {compute}")
    if "best under" not in verdict_text:
        problems.append("no winner named")
    return problems
