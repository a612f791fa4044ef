"""Idle means nothing drawn, not NaN: every ratio and quantile panel query over series
that stopped moving (no requests in the window) returns no sample. Evaluated by
promtool with every variable on "All", one-minute steps.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.dashboards_json import SELECTED_METRIC, Target, load_dashboards, targets
from support.promtool_queries import as_all, promtool_test

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

BOARDS = load_dashboards()
# What a served request series carries (more labels than any selector names is fine).
LABELS = (
    'job="gpuscope", instance="node-a:9420", service="svc", model="m", route="/v1/x", '
    'gpu="0", uuid="GPU-0", source="spans", host="node-a", phase="batch_wait", '
    'stage="prefill", direction="output"'
)
BUCKETS = ("0.1", "1", "+Inf")


def ratio_targets() -> list[tuple[Target, str]]:
    """Request-side queries that divide or take a quantile, with variables on All."""
    found = []
    for name, board in BOARDS.items():
        for target in targets(name, board):
            divides = "/" in re.sub(r'"[^"]*"', '""', target.expr)  # not in label values
            if (divides or "histogram_quantile" in target.expr) and "gpuscope_gpu_" not in (
                target.expr
            ):
                found.append((target, as_all(target.expr, board)))
    return found


# Recorded ratios (SLO and error ratios) divide by the window's requests only where
# there were some: idle, the rules record nothing (alerts/tests/quantiles_test.yml),
# so an idle Prometheus has no such series.
GUARDED_RECORD = re.compile(r":ratio_rate\w*$")


def idle_series(exprs: list[str]) -> dict[str, str]:
    """A flat series (no requests for the whole hour) for every metric the queries read;
    recorded rates at 0, counters standing still, recorded ratios absent. Status 200
    and 500 both exist."""
    series: dict[str, str] = {}
    for expr in exprs:
        for metric, _ in (m.groups() for m in SELECTED_METRIC.finditer(expr)):
            if GUARDED_RECORD.search(metric):
                continue
            value = "0+0x60" if ":" in metric else "7+0x60"
            les = BUCKETS if metric.endswith("_bucket") or "_bucket:" in metric else (None,)
            for le in les:
                for code in ("200", "500"):
                    labels = LABELS + f', code="{code}"' + (f', le="{le}"' if le else "")
                    series[f"{metric}{{{labels}}}"] = value
    return series


def test_every_panel_ratio_draws_nothing_when_idle(tmp_path: Path) -> None:
    found = ratio_targets()
    panels = {(t.board, t.panel) for t, _ in found}
    # the error ratio, means, shares, the quantiles of both request boards
    assert len(found) >= 30 and len(panels) >= 12, sorted(panels)
    exprs = [expr for _, expr in found]
    checks = [{"expr": expr, "eval_time": "30m", "exp_samples": []} for expr in exprs]
    result = promtool_test(tmp_path, idle_series(exprs), checks)
    assert result.returncode == 0, result.stdout + result.stderr
