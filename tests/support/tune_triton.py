"""The checks of a ``gpuscope tune`` sweep of Triton's queue delay, shared by the live run
(tests/engines/test_tune_triton_live.py) and its replay from the captured fixtures
(tests/loadgen/test_tune_replay.py)."""

from __future__ import annotations

import itertools
from typing import Any

from gpuscope.loadgen.results import StepResult
from support.triton_engine import COMPUTE_OVERHEAD_S

DELAYS_US = ("0", "20000", "80000")  # max_queue_delay_microseconds, one Triton each
# Counters scraped after the step settles against executions logged inside the step's
# window: a batch or two at either edge of a step of some 100-200 executions.
BATCH_WITHIN = 0.05


def check(steps: list[StepResult], truth: dict[str, dict[str, Any]]) -> list[str]:
    """The rows against the model's log and against each other; the failures."""
    problems = []
    by_config = {step.config: step for step in steps}
    batches, queues = [], []
    for delay in DELAYS_US:
        config = f"max-queue-delay-us={delay}"
        step = by_config[config]
        server = step.server
        if server is None or step.ok == 0 or step.errors:
            problems.append(f"{config}: no clean server view: {step}")
            continue
        batch, queue = server.batch_size_mean, server.phase_mean_ms.get("queue")
        compute = server.phase_mean_ms.get("compute")
        expected = truth[config]["mean_batch"]
        if batch is None or abs(batch - expected) > BATCH_WITHIN * expected:
            problems.append(f"{config}: mean batch {batch} vs the model's {expected:.3f}")
        handler_ms = truth[config]["handler_ms"]
        if compute is None or not handler_ms <= compute <= handler_ms + 1000 * COMPUTE_OVERHEAD_S:
            problems.append(f"{config}: compute {compute} ms vs a handler of {handler_ms:.2f} ms")
        batches.append(batch or 0.0)
        queues.append(queue or 0.0)
    # across all three delays: the batch may reach the clients' cap (8) and stay there,
    # while Triton's queue, which holds the batcher's wait, must grow at each step
    if batches != sorted(batches) or batches[-1] < batches[0] + 2:
        problems.append(f"the mean batch does not rise with the delay: {batches}")
    if any(later <= earlier for earlier, later in itertools.pairwise(queues)):
        problems.append(f"Triton's queue does not rise at each delay: {queues}")
    return problems
