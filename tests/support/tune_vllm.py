"""The checks of a ``gpuscope tune`` sweep of vLLM's ``--max-num-seqs``, shared by the live
run (tests/engines/test_tune_vllm_live.py) and its replay from the captured fixtures
(tests/loadgen/test_tune_replay.py)."""

from __future__ import annotations

from gpuscope.loadgen.engine_metrics import agreement
from gpuscope.loadgen.results import StepResult

FEW, MANY = "max-num-seqs=2", "max-num-seqs=8"
# how far the tuner's phase means (from vLLM's spans, through the exporter) may be from
# vLLM's own histograms over the same requests
WITHIN = 0.05
# a step that gives a sequence no token (a chunked prefill's) or two (speculation)
BATCH_SLACK = 0.02


def engine_problems(step: StepResult) -> list[str]:
    """Where a step's phase means and vLLM's own (queue; compute = inference time, i.e.
    prefill + decode) disagree by more than WITHIN, or count other requests."""
    server, engine = step.server, step.engine
    if server is None or engine is None:
        return [f"{step.config}: no {'engine' if server else 'exporter'} view to compare"]
    problems = []
    if engine.requests != server.requests or engine.requests != step.ok:
        problems.append(
            f"{step.config}: {step.ok} ok, the exporter counted {server.requests}, "
            f"vLLM {engine.requests}"
        )
    compared = agreement(server, engine)
    if sorted(compared) != ["compute", "queue"]:
        problems.append(f"{step.config}: phases compared {sorted(compared)}")
    for phase, (ours, theirs, diff) in compared.items():
        if not diff <= WITHIN:
            problems.append(
                f"{step.config}: {phase} {ours:.2f} ms vs vLLM's {theirs:.2f} ms ({diff:.1%})"
            )
    return problems


def batch_problems(steps: list[StepResult]) -> list[str]:
    """vLLM's mean batch (generated tokens per engine step, from its own /metrics) against
    its --max-num-seqs: at most the cap, and larger with the larger cap. Under 16 clients
    two sequences are always running; eight mostly."""
    by_config = {step.config: step for step in steps}
    batches = {}
    for config, cap in ((FEW, 2), (MANY, 8)):
        engine = by_config[config].engine
        batch = engine.batch_size_mean if engine is not None else None
        if batch is None or not 1 <= batch <= cap * (1 + BATCH_SLACK):
            return [f"{config}: vLLM's mean batch {batch}, not between 1 and {cap}"]
        batches[config] = batch
    problems = []
    if batches[FEW] < 2 * (1 - BATCH_SLACK):
        problems.append(f"{FEW}: mean batch {batches[FEW]:.3f}, not full under 16 clients")
    if not batches[MANY] > batches[FEW] + 2:
        problems.append(f"the mean batch does not grow with the cap: {batches}")
    return problems


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
    for step in steps:
        problems += engine_problems(step)
    problems += batch_problems(steps)
    if "best under" not in verdict_text:
        problems.append("no winner named")
    return problems
