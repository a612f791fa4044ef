"""Every query of the committed dashboards against a running Prometheus, as Grafana runs them.

Grafana's variables are resolved the way Grafana does (``label_values`` through
Prometheus' label-values API, each filtered by the ones before, set to their first
value); panels are then queried under every variable on "All", and under each value of
the one variable without "All". Used by the pack's live dashboard test and the
real-vLLM check.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from support.dashboards_json import (
    load_dashboards,
    parse_label_values,
    query_variables,
    substitute,
    targets,
)
from support.prometheus_server import instant_query

# Scrapes every second: what Grafana would pick for $__rate_interval at a 1 s scrape
# and a short step, with room for a loaded machine.
TIME_VALUES = {"$__rate_interval": "15s", "$__range": "5m", "$__interval": "5s"}


async def label_values(
    session: aiohttp.ClientSession, base: str, series: str, label: str
) -> list[str]:
    url = f"{base}/api/v1/label/{label}/values"
    async with session.get(url, params={"match[]": series}) as response:
        body = await response.json()
    assert body["status"] == "success", f"{series}: {body}"
    return [value for value in body["data"] if value]


def promql_regex(value: str) -> str:
    """A label value as an anchored regex inside a PromQL string (Grafana escapes so)."""
    escaped = "".join("\\" + c if c in ".+*?()[]{}|^$\\" else c for c in value)
    return escaped.replace("\\", "\\\\")


async def check_variable_chain(
    session: aiohttp.ClientSession,
    base: str,
    name: str,
    board: dict[str, Any],
    chosen: dict[str, str],
    *,
    empty_is_all: bool = False,
) -> None:
    """Each variable not in ``chosen``, filtered by the earlier ones (set to their first
    value), has values; or, with ``empty_is_all``, none, which Grafana shows as "All"
    (vLLM's /metrics name no GPU: its requests match the "All" of ``gpu``)."""
    chosen = dict(chosen)
    for variable in query_variables(board):
        if variable["name"] in chosen:
            continue
        series, label = parse_label_values(substitute(variable["query"], chosen, {}))
        values = await label_values(session, base, series, label)
        if not values and empty_is_all and variable["includeAll"]:
            chosen[variable["name"]] = variable["allValue"]
            continue
        assert values, f"{name}: variable {variable['name']} has no values for {series}"
        chosen[variable["name"]] = promql_regex(sorted(values)[0])


async def settings(
    session: aiohttp.ClientSession, base: str, board: dict[str, Any]
) -> list[dict[str, str]]:
    """Variable values to query a board's panels under: every variable on "All", and
    each value of one without "All" in turn."""
    everything = {v["name"]: v["allValue"] for v in query_variables(board) if v["includeAll"]}
    single = [v for v in query_variables(board) if not v["includeAll"]]
    assert len(single) <= 1, "more than one variable without All"
    if not single:
        return [everything]
    series, label = parse_label_values(substitute(single[0]["query"], everything, {}))
    values = await label_values(session, base, series, label)
    return [{**everything, label: promql_regex(value)} for value in sorted(values)]


async def failing_targets(
    session: aiohttp.ClientSession, base: str, *, may_be_empty: frozenset[str] = frozenset()
) -> list[str]:
    """Targets without data; ``may_be_empty``: panel titles whose series need what the
    stack lacks (a process on a real GPU), checked elsewhere."""
    failures = []
    for name, board in load_dashboards().items():
        tried = await settings(session, base, board)
        for index, chosen in enumerate(tried):
            single = {k: v for k, v in chosen.items() if v != ".*"}
            await check_variable_chain(session, base, name, board, single, empty_is_all=index > 0)
        for target in targets(name, board):
            exprs = [substitute(target.expr, chosen, TIME_VALUES) for chosen in tried]
            with_data = [expr for expr in exprs if await instant_query(session, base, expr)]
            if not with_data and target.panel in may_be_empty:
                continue
            if not with_data:  # instant_query fails on a parse error
                failures.append(f"{target.board} / {target.panel}: no data for\n{exprs[0]}")
            elif (
                target.exemplar
                and "_bucket{" in with_data[0]
                and not await exemplars(session, base, with_data[0])
            ):
                failures.append(f"{target.board} / {target.panel}: no exemplars for\n{exprs[0]}")
    return failures


async def sources(session: aiohttp.ClientSession, base: str) -> list[str]:
    """The values of the source variable of "Where did the time go"."""
    board = load_dashboards()["where-did-the-time-go.json"]
    return [chosen["source"] for chosen in await settings(session, base, board)]


async def exemplars(session: aiohttp.ClientSession, base: str, expr: str) -> list[Any]:
    now = time.time()
    params = {"query": expr, "start": str(now - 300), "end": str(now)}
    async with session.get(base + "/api/v1/query_exemplars", params=params) as response:
        body = await response.json()
    assert body["status"] == "success", f"{expr}\n{body}"
    return [series for series in body["data"] if series["exemplars"]]
