"""Reading the committed Grafana dashboards: panels, queries, variables, metric names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).parents[2]
DASHBOARD_DIR = REPO / "dashboards" / "json"

# ``name{`` in PromQL: every metric the dashboards read is written with a selector.
SELECTED_METRIC = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
LABEL_VALUES = re.compile(r"^label_values\((.+), *([a-zA-Z_][a-zA-Z0-9_]*)\)$")
# Series Prometheus writes itself: for every target, and for the alerts it evaluates.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped", "ALERTS"})
# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})


@dataclass(frozen=True)
class Target:
    board: str
    panel: str
    panel_type: str
    unit: str | None
    expr: str
    exemplar: bool


def load_dashboards() -> dict[str, dict[str, Any]]:
    """File name -> parsed dashboard, for every committed dashboard."""
    return {
        path.name: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))
    }


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that queries: not a row (rows here are never collapsed: no nested
    panels), not a text note."""
    for panel in board["panels"]:
        if panel["type"] not in {"row", "text"}:
            yield panel


def panels_by_row(board: dict[str, Any]) -> Iterator[tuple[dict[str, Any] | None, dict[str, Any]]]:
    """(the row a panel sits in, or None above the first row; the panel) for every
    panel that queries."""
    current = None
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = panel
        elif panel["type"] != "text":
            yield current, panel


def targets(name: str, board: dict[str, Any]) -> Iterator[Target]:
    """Every query of a board: its panels' targets, then its annotations' (Prometheus
    annotation queries are PromQL too)."""
    yield from _panel_targets(name, board)
    for annotation in board.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            yield Target(
                board=name,
                panel=f"annotation {annotation['name']}",
                panel_type="annotation",
                unit=None,
                expr=annotation["expr"],
                exemplar=False,
            )


def _panel_targets(name: str, board: dict[str, Any]) -> Iterator[Target]:
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield Target(
                board=name,
                panel=panel["title"],
                panel_type=panel["type"],
                unit=panel.get("fieldConfig", {}).get("defaults", {}).get("unit"),
                expr=target["expr"],
                exemplar=bool(target.get("exemplar")),
            )


def query_variables(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in board["templating"]["list"] if v["type"] == "query"]


def parse_label_values(query: str) -> tuple[str, str]:
    """``label_values(metric{...}, label)`` -> (series selector, label)."""
    match = LABEL_VALUES.match(query)
    assert match, f"not a label_values query: {query}"
    return match.group(1), match.group(2)


def selected_metrics(expr: str) -> Iterator[tuple[str, list[str]]]:
    """(metric name, label names in its matchers) for every ``name{...}`` in ``expr``."""
    for match in SELECTED_METRIC.finditer(expr):
        yield match.group(1), MATCHER_LABEL.findall(match.group(2))


def substitute(expr: str, values: dict[str, str], time_values: dict[str, str]) -> str:
    """``expr`` with ``$var`` / ``${var}`` and Grafana's ``$__*`` time variables replaced."""
    for name, value in time_values.items():
        expr = expr.replace(name, value)
    for name in sorted(values, key=len, reverse=True):  # $model before $mod...
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr
