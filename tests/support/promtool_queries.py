"""Panel queries evaluated by ``promtool test rules`` over input series written by hand.

Grafana's variables are set to their "All" value and its time variables to fixed
durations, so that each query is evaluated as the panel would run it at one step.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from support.binaries import require_binary
from support.dashboards_json import query_variables, substitute

# One-minute steps: the input series' interval and Grafana's interval alike.
STEP_VALUES = {"$__rate_interval": "2m", "$__range": "1h", "$__interval": "1m"}


def as_all(expr: str, board: dict[str, Any]) -> str:
    """``expr`` with every variable of ``board`` on "All" (one without "All": any value)."""
    values = {v["name"]: v["allValue"] if v["includeAll"] else ".*" for v in query_variables(board)}
    values.setdefault("datasource", "")
    return substitute(expr, values, STEP_VALUES)


def promtool_test(
    folder: Path,
    input_series: Mapping[str, str],
    checks: Sequence[dict[str, Any]],
    *,
    interval: str = "1m",
) -> subprocess.CompletedProcess[str]:
    """Run ``promtool test rules`` with one test of ``checks`` (``promql_expr_test``
    entries) over ``input_series`` (series -> promtool's value notation)."""
    promtool = require_binary("promtool")
    document = {
        "rule_files": [],
        "evaluation_interval": interval,
        "tests": [
            {
                "interval": interval,
                "input_series": [
                    {"series": name, "values": values} for name, values in input_series.items()
                ],
                "promql_expr_test": list(checks),
            }
        ],
    }
    path = folder / "queries_test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return subprocess.run(
        [promtool, "test", "rules", path.name],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
