"""The checks of a ``gpuscope tune`` sweep of Ray Serve's ``batch_wait_timeout_s``, shared
by the live run (tests/engines/test_tune_ray_live.py) and its replay from the captured
fixtures (tests/loadgen/test_tune_replay.py)."""

from __future__ import annotations

from gpuscope.loadgen.results import StepResult

WAITS_S = ("0.002", "0.05")  # batch_wait_timeout_s, one Ray Serve each
SHORT, LONG = (f"batch-wait-timeout-s={wait}" for wait in WAITS_S)


def check(steps: list[StepResult], verdict_text: str) -> list[str]:
    """A longer window fills bigger batches and serves more; the short window's loss is
    named as batch wait (with 20 ms a batch and one batch at a time, requests that miss a
    batch wait in Ray's batcher for the next: measured at 122 ms against 4 ms)."""
    by_config = {step.config: step for step in steps}
    if sorted(by_config) != sorted([SHORT, LONG]):
        return [f"expected one row per value, got {[s.config for s in steps]}"]
    short, long = by_config[SHORT], by_config[LONG]
    if short.server is None or long.server is None:
        return ["a step has no exporter view (did the replica's spans reach the exporter?)"]
    problems = [
        f"{step.config}: errors {step.errors}, {step.ok} ok"
        for step in steps
        if step.errors or step.ok == 0
    ]
    batches = short.server.batch_size_mean or 0.0, long.server.batch_size_mean or 0.0
    if not batches[1] > batches[0]:
        problems.append(f"the mean batch does not grow with the window: {batches}")
    if not long.throughput_rps > short.throughput_rps:
        problems.append("bigger batches of a fixed cost did not serve more")
    loser = next((line for line in verdict_text.splitlines() if line.startswith(f"  {SHORT}")), "")
    if "batch_wait +" not in loser:
        problems.append(f"the short window's loss is not batch wait: {loser!r}")
    return problems
