"""The where board's "Phase share of mean time" over a real Triton's ``/metrics``: the
expositions ``make triton-check`` captured (tests/fixtures/triton-2.51/, tritonserver
2.51.0 under PyTriton 0.7.0) replayed into a real Prometheus with the shipped rules, the
panel's query run as Grafana runs it for one model, against the verdict's recorded
``share_mean``. The cached model is the case that once split them: its queue covers
every success, its compute only the cache misses (issue 27, item 3)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from pack import engines
from pack.recorded import WINDOW
from support.dashboard_queries import TIME_VALUES
from support.dashboards_json import load_dashboards, panels, query_variables, substitute
from support.prometheus_server import (
    instant_query,
    run_prometheus,
    wait_for_evaluations,
    wait_for_scrapes,
)
from support.triton_engine import MODELS, REPO, scalar
from support.triton_replay import run_triton_replay, truth

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

WHERE = load_dashboards()["where-did-the-time-go.json"]
SHARE_MEAN = f"service_model_gpu:{engines.PHASE_HISTOGRAM}:share_mean{WINDOW}"


def panel_query(model: str) -> str:
    """The panel's query with ``$source`` on triton, ``$model`` on ``model`` and every
    other variable on "All"."""
    (panel,) = [p for p in panels(WHERE) if p["title"] == "Phase share of mean time"]
    (target,) = panel["targets"]
    values: dict[str, str] = {v["name"]: v.get("allValue") or ".*" for v in query_variables(WHERE)}
    chosen = {**values, "source": engines.TRITON, "model": model}
    return substitute(target["expr"], chosen, TIME_VALUES)


def by_phase(result: list[dict[str, object]]) -> dict[str, float]:
    shares: dict[str, float] = {}
    for sample in result:
        metric, value = sample["metric"], sample["value"]
        assert isinstance(metric, dict) and isinstance(value, list), sample
        shares[metric["phase"]] = float(value[1])
    return shares


async def test_the_phase_share_panel_reads_the_verdicts_share_for_each_triton_model(
    tmp_path: Path,
) -> None:
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
        got = {}
        for model in MODELS:
            panel = by_phase(await instant_query(session, base, panel_query(model)))
            recorded = by_phase(
                await instant_query(
                    session, base, f'{SHARE_MEAN}{{source="triton", model="{model}"}}'
                )
            )
            got[model] = (panel, recorded)
    for model, (panel, recorded) in got.items():
        assert set(recorded) == {"queue", "compute"}, (model, recorded)
        assert set(panel) == set(recorded), (model, panel, recorded)
        for phase, share in recorded.items():
            assert panel[phase] == pytest.approx(share, rel=1e-9), (model, phase, panel, recorded)
    # the response cache's model: half its successes were hits, with queue but no compute
    assert expected["cached"]["cache_hits"] > 0
