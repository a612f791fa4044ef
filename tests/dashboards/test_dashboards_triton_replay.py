"""The where board's "Phase share of mean time" over a real Triton's ``/metrics``: the
expositions ``make triton-check`` captured (tests/fixtures/triton-2.51/, tritonserver
2.51.0 under PyTriton 0.7.0) replayed into a real Prometheus with the shipped rules, the
panel's query run as Grafana runs it for one model, against the verdict's recorded
``share_mean``. The cached model is the case that once split them: its queue covers
every success, its compute only the cache misses (issue 27, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pack import engines
from pack.recorded import WINDOW
from support.dashboard_queries import TIME_VALUES
from support.dashboards_json import load_dashboards, panels, query_variables, substitute
from support.prometheus_server import (
    instant_query,
)
from support.triton_engine import MODELS
from support.triton_replay import rules_over_the_replay, truth

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
    expected = truth()
    async with rules_over_the_replay(tmp_path) as (session, base):
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
