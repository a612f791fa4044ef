"""The engine rules over a real Triton's ``/metrics``: the expositions ``make
triton-check`` captured (tests/fixtures/triton-2.51/, tritonserver 2.51.0 under PyTriton
0.7.0) replayed into a real Prometheus with the shipped rules, every recorded
``source="triton"`` series checked against what the models logged in that run (the
same checks as the live run, ``support.triton_engine.check_recorded``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pack import engines
from support.triton_engine import MODELS, check_recorded, recorded
from support.triton_replay import captures, rules_over_the_replay, truth

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? \S+$")
LABEL = re.compile(r'(\w+)="')


def test_the_capture_holds_every_triton_series_the_rules_read_with_its_labels() -> None:
    """Names and label names as the engines table has them (read from Triton's source)."""
    # the text as written (prometheus_client's parser would add _total to counters)
    samples: dict[str, set[str]] = {}
    for line in captures()[-1].splitlines():
        if match := SAMPLE.match(line):
            name, labels = match.groups()
            samples.setdefault(name, set()).update(LABEL.findall(labels or ""))
    triton = engines.TRITON_ENGINE
    read = {
        engines.TRITON_SUCCESS,
        engines.TRITON_FAILURE,
        engines.TRITON_INFERENCES,
        engines.TRITON_EXECUTIONS,
        engines.TRITON_REQUEST_US,
        engines.TRITON_QUEUE_US,
        *engines.TRITON_COMPUTE_US,
        engines.TRITON_PENDING,
    }
    for name in read:
        assert name in samples, name
        assert set(triton.exposition[name].labels) <= samples[name], name
    # 2.51 has no first-response histogram (added in 24.12): no TTFT from it
    assert engines.TRITON_FIRST_RESPONSE_MS + "_bucket" not in samples
    reason = engines.TRITON_EXECUTED_FAILURES.split("=")[1].strip('"')
    assert f'reason="{reason}"' in captures()[-1]


async def test_every_recorded_triton_series_matches_the_live_runs_truth(tmp_path: Path) -> None:
    expected = truth()
    async with rules_over_the_replay(tmp_path) as (session, base):
        problems = []
        for model in MODELS:
            problems += check_recorded(model, await recorded(session, base, model), expected[model])
    assert problems == [], "\n".join(problems)
