"""The checks of a ``gpuscope tune`` sweep of Ray Serve's ``batch_wait_timeout_s``, shared
by the live run (tests/engines/test_tune_ray_live.py) and its replay from the captured
fixtures (tests/loadgen/test_tune_replay.py)."""

from __future__ import annotations

from gpuscope.loadgen.results import StepResult

WAITS_S = ("0.002", "0.05")  # batch_wait_timeout_s, one Ray Serve each
SHORT, LONG = (f"batch-wait-timeout-s={wait}" for wait in WAITS_S)


def check(steps: list[StepResult], verdict_text: str) -> list[str]:
    """A longer window waits longer in ``batch_wait`` and fills bigger batches."""
    by_config = {step.config: step for step in steps}
    if sorted(by_config) != sorted([SHORT, LONG]):
        return [f"expected one row per value, got {[s.config for s in steps]}"]
    short, long = by_config[SHORT].server, by_config[LONG].server
    if short is None or long is None:
        return ["a step has no exporter view (did the replica's spans reach the exporter?)"]
    problems = [
        f"{step.config}: errors {step.errors}, {step.ok} ok"
        for step in steps
        if step.errors or step.ok == 0
    ]
    waits = short.phase_mean_ms.get("batch_wait", 0.0), long.phase_mean_ms.get("batch_wait", 0.0)
    if not waits[1] > waits[0]:
        problems.append(f"batch wait does not grow with the window: {waits}")
    batches = short.batch_size_mean or 0.0, long.batch_size_mean or 0.0
    if not batches[1] > batches[0]:
        problems.append(f"the mean batch does not grow with the window: {batches}")
    if "best under" not in verdict_text:
        problems.append("no winner named")
    return problems
