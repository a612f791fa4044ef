"""The engine rules over a real Triton's ``/metrics``: the expositions ``make
triton-check`` captured (tests/fixtures/triton-2.51/, tritonserver 2.51.0 under PyTriton
0.7.0) replayed into a real Prometheus with the shipped rules, every recorded
``source="triton"`` series checked against what the models logged in that run (the
same checks as the live run, ``support.triton_engine.check_recorded``)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from pack import engines
from support.prometheus_server import run_prometheus, wait_for_evaluations, wait_for_scrapes
from support.triton_engine import MODELS, REPO, check_recorded, recorded, scalar
from support.triton_replay import captures, run_triton_replay, truth

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
    build = [sys.executable, str(REPO / "alerts" / "build.py"), "--out", str(tmp_path / "rules")]
    await asyncio.to_thread(
        subprocess.run, [*build, "--interval", "1s"], check=True, capture_output=True
    )
    rules = sorted((tmp_path / "rules").glob("*.yml"))
    expected = truth()
    successes = sum(expected[model]["succeeded"] for model in MODELS)
    async with (
        run_triton_replay() as url,
        run_prometheus(
            [url.removeprefix("http://")], tmp_path, job="triton", rule_files=rules
        ) as base,
        aiohttp.ClientSession() as session,
    ):
        await wait_for_scrapes(session, base, 2)
        deadline = time.monotonic() + 30
        query = 'sum(nv_inference_request_success{job="triton"})'
        while (await scalar(session, base, query) or 0) < successes:
            assert time.monotonic() < deadline, "the replay never reached its last capture"
            await asyncio.sleep(0.2)
        await wait_for_evaluations(session, base, time.time())  # over the last capture
        problems = []
        for model in MODELS:
            problems += check_recorded(model, await recorded(session, base, model), expected[model])
    assert problems == [], "\n".join(problems)
