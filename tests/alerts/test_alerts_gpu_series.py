"""Every GPU series the exporter serves (``gpuscope_gpu_*``) has a promtool case and a
panel: a case names it (as an input, or as what dcgm-exporter's rules record), and a
committed board draws it. The sharing and topology series (issue 30) are held to more:
a case feeds each one to promtool and evaluates something that reads it (a rule, an
alert's annotation or a board's query). The board queries no rule reads are promtool
cases of their own (``alerts/tests/gpu_panels_test.yml``), each still a query of the
GPU board."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscope.contract import gpu as gpu_rows
from pack.contract import series
from support.dashboards_json import load_dashboards, substitute, targets

REPO = Path(__file__).parents[2]
TESTS = sorted((REPO / "alerts" / "tests").glob("*_test.yml"))
RULES = sorted((REPO / "alerts" / "rules").glob("*.yml"))
PANEL_CASES = REPO / "alerts" / "tests" / "gpu_panels_test.yml"
# The GPU board's variables at All, as gpu_panels_test.yml writes its queries.
ALL = {"job": ".*", "instance": ".*", "gpu": ".*"}
TIME_VALUES = {"$__rate_interval": "1m", "$__range": "5m", "$__interval": "1m"}
SHARING = {
    series(row)
    for row in (
        gpu_rows.MIG_INFO,
        gpu_rows.SM_CLOCK_TARGET,
        gpu_rows.NVLINK_LINKS,
        gpu_rows.NVLINK_TRANSMIT,
        gpu_rows.NVLINK_RECEIVE,
        gpu_rows.SM_CLOCK_CHANGES,
        gpu_rows.COMPUTE_MODE,
        gpu_rows.COMPUTE_PROCESSES,
        gpu_rows.MPS_PROCESSES,
        gpu_rows.CONTENDED,
        gpu_rows.PROCESS_MEMORY_USED,
        gpu_rows.PROCESS_SM_UTILIZATION,
        gpu_rows.PROCESS_NUMA_LOCALITY,
    )
}
GPU_SERIES = sorted(
    series(row) for row in gpu_rows.GPU_METRICS if row.name.startswith("gpuscope_gpu_")
)


def _named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", text) is not None


@cache
def _cases() -> tuple[dict[str, Any], ...]:
    return tuple(test for path in TESTS for test in yaml.safe_load(path.read_text())["tests"])


@cache
def _named_by_a_case() -> list[str]:
    """Every series text a case gives promtool or expects from it."""
    found = []
    for test in _cases():
        found += [s["series"] for s in test.get("input_series", [])]
        for check in test.get("promql_expr_test", []):
            found += [check["expr"], *(s["labels"] for s in check.get("exp_samples", []))]
    return found


@cache
def _readers() -> list[str]:
    """What promtool evaluates: every rule's expression and annotations, and every
    promql_expr_test's expression."""
    found = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                found += [rule["expr"], *rule.get("annotations", {}).values()]
    for test in _cases():
        found += [check["expr"] for check in test.get("promql_expr_test", [])]
    return found


@cache
def _panel_queries() -> list[str]:
    return [
        t.expr
        for name, board in load_dashboards().items()
        for t in targets(name, board)
        if not t.panel.startswith("annotation ")
    ]


@pytest.mark.parametrize("name", GPU_SERIES)
def test_every_gpu_series_has_a_promtool_case_and_a_panel(name: str) -> None:
    assert any(_named(name, text) for text in _named_by_a_case()), f"no promtool case has {name}"
    assert any(_named(name, text) for text in _panel_queries()), f"no panel draws {name}"
    if name in SHARING:
        inputs = [s["series"] for test in _cases() for s in test.get("input_series", [])]
        assert any(_named(name, text) for text in inputs), f"no promtool case feeds {name}"
        assert any(_named(name, text) for text in _readers()), f"nothing promtool runs reads {name}"


def test_the_panel_cases_are_queries_of_the_gpu_board() -> None:
    board = load_dashboards()["gpu.json"]
    queries = {substitute(t.expr, ALL, TIME_VALUES) for t in targets("gpu.json", board)}
    checks = [
        check["expr"]
        for test in yaml.safe_load(PANEL_CASES.read_text())["tests"]
        for check in test["promql_expr_test"]
    ]
    assert checks
    assert [expr for expr in checks if expr not in queries] == []
