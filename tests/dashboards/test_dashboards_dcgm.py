"""The GPU board with dcgm-exporter alone: no gpuscope process, only the shipped rules.

A real Prometheus scrapes two loopback replays shaped as dcgm-exporter 4.5.3-4.8.2
writes them (tests/fixtures/dcgm-exporter-4.5.3-4.8.2): ``counters.prom``, a 2-GPU node
with the counters file that brings SM occupancy, the maximum clocks and the PCIe link;
and ``mig.prom``, one GPU in MIG mode whose two instances (a pod each) repeat the
GPU's own fields. The board's variables are resolved as Grafana resolves them and
every panel is queried with each variable on "All".
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from alerts.dcgm_rules import counters_lines
from support.dashboard_queries import TIME_VALUES, check_variable_chain
from support.dashboards_json import (
    load_dashboards,
    panels,
    panels_by_row,
    query_variables,
    substitute,
)
from support.prometheus_server import instant_query, run_prometheus, wait_for_result
from support.servers import serve_exposition

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "dcgm-exporter-4.5.3-4.8.2"
BOARD = "gpu.json"
MIB = 1024 * 1024
# counters.prom's two GPUs and mig.prom's one
GPUS = 3
# The panels the board must fill from dcgm-exporter's series.
MUST_HAVE_DATA = (
    "SM occupancy",
    "SM clock against its maximum",
    "Memory clock against its maximum",
    "PCIe TX against link capacity",
    "PCIe RX against link capacity",
    "Memory used against total",
)
# gpuscope's exporter's own health: dcgm-exporter serves none (no poll, no process join)
GPUSCOPE_ONLY = (
    "Collector success",
    "Collector duration",
    "Readings age",
    "Why a GPU is down",
    "Process join",
)
# NVML's process listing, affinities and NVLink fields, which the rules do not map from
# dcgm-exporter: the whole row is gpuscope's exporter only
GPUSCOPE_ONLY_ROW = "Sharing and topology"


def row_titles(board: dict[str, Any], row: str) -> list[str]:
    titles = [p["title"] for r, p in panels_by_row(board) if r is not None and r["title"] == row]
    assert titles, f"no panels under the row {row!r}"
    return titles


def board() -> dict[str, Any]:
    loaded: dict[str, Any] = load_dashboards()[BOARD]
    return loaded


def panel(title: str) -> dict[str, Any]:
    (found,) = [p for p in panels(board()) if p["title"] == title]
    return dict(found)


def everything() -> dict[str, str]:
    return {v["name"]: v["allValue"] for v in query_variables(board())}


async def results(
    session: aiohttp.ClientSession, base: str, title: str | dict[str, Any]
) -> list[list[dict[str, Any]]]:
    """Each of a panel's queries (the panel, or its title), every variable on "All":
    its series."""
    each = panel(title) if isinstance(title, str) else title
    return [
        await instant_query(session, base, substitute(t["expr"], everything(), TIME_VALUES))
        for t in each["targets"]
    ]


def values(result: list[dict[str, Any]]) -> list[float]:
    return sorted(float(s["value"][1]) for s in result)


async def test_the_gpu_board_fills_from_dcgm_exporter_and_the_rules(tmp_path: Path) -> None:
    build = [sys.executable, str(REPO / "alerts" / "build.py"), "--out", str(tmp_path / "rules")]
    await asyncio.to_thread(
        subprocess.run, [*build, "--interval", "1s"], check=True, capture_output=True
    )
    rules = sorted((tmp_path / "rules").glob("*.yml"))
    async with (
        serve_exposition((FIXTURES / "counters.prom").read_text(encoding="utf-8")) as node,
        serve_exposition((FIXTURES / "mig.prom").read_text(encoding="utf-8")) as mig,
        run_prometheus([node, mig], tmp_path, job="dcgm-exporter", rule_files=rules) as base,
        aiohttp.ClientSession() as session,
    ):
        # the PCIe counters are rebuilt at each evaluation (every 1 s): wait until they
        # cover the panels' rate window
        await wait_for_result(
            session,
            base,
            "count_over_time(gpuscope_gpu_pcie_transmit_bytes_total[1m]) > 16",
            timeout_s=60,
        )
        # job, instance and GPU list dcgm-exporter's targets and GPUs
        await check_variable_chain(session, base, BOARD, board(), {})
        no_data = []
        for each in panels(board()):
            for expr, got in zip(
                (t["expr"] for t in each["targets"]),
                await results(session, base, each),
                strict=True,
            ):
                if not got:
                    no_data.append((each["title"], expr))
        must = [(title, expr) for title, expr in no_data if title in MUST_HAVE_DATA]
        assert not must, must
        # with the counters file, only gpuscope's own collector health is empty
        gpuscope_only = {*GPUSCOPE_ONLY, *row_titles(board(), GPUSCOPE_ONLY_ROW)}
        assert {title for title, _ in no_data} <= gpuscope_only, no_data

        # one series per GPU: the MIG GPU's instances are one GPU for its clocks, link
        # and memory (each instance's own memory added up); mig.prom has no memory
        # clock, maximum clocks or PCIe traffic, so those are counters.prom's 2 GPUs
        for title in MUST_HAVE_DATA[1:]:
            for got in await results(session, base, title):
                keys = [(s["metric"]["instance"], s["metric"]["gpu"]) for s in got]
                assert len(keys) == len(set(keys)) >= GPUS - 1, (title, got)
        for title, index in (
            ("SM clock against its maximum", 0),
            ("PCIe TX against link capacity", 1),
            ("PCIe RX against link capacity", 1),
        ):
            assert len((await results(session, base, title))[index]) == GPUS, title
        used, _, total = await results(session, base, "Memory used against total")
        assert values(used) == pytest.approx(sorted(v * MIB for v in (68635, 635, 30464 + 2464)))
        assert values(total) == pytest.approx(
            sorted(v * MIB for v in (80635, 80635, 30464 + 10000 + 2464 + 38000))
        )
        # each MIG instance's SM occupancy is its own
        (occupancy,) = await results(session, base, "SM occupancy")
        assert len(occupancy) == GPUS + 1, occupancy
        assert {0.75, 0.125} <= set(values(occupancy)), occupancy
        # the fleet counts GPUs, not the instances (or pods) that repeat them
        up, known = await results(session, base, "GPUs up")
        assert values(up) == values(known) == [GPUS]
        drawn, limit = await results(session, base, "Total power")
        assert values(drawn) == pytest.approx([512.345 + 250.5 + 401.25])
        assert len(limit) == 1


def test_panels_over_fields_outside_the_default_counters_name_their_line() -> None:
    """A panel over a field dcgm-exporter's default counters leave out says, in its
    description, which counters-file line brings it."""
    needed = {line.split(",")[0] for line in counters_lines()}
    wanted = {
        "SM occupancy": {"DCGM_FI_PROF_SM_OCCUPANCY"},
        "SM, tensor and DRAM activity": {"DCGM_FI_PROF_SM_ACTIVE"},
        "SM clock against its maximum": {"DCGM_FI_DEV_MAX_SM_CLOCK"},
        "Memory clock against its maximum": {"DCGM_FI_DEV_MAX_MEM_CLOCK"},
        "Clock event reasons": {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS"},
        "PCIe TX against link capacity": {
            "DCGM_FI_DEV_PCIE_LINK_GEN",
            "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        },
        "PCIe RX against link capacity": {
            "DCGM_FI_DEV_PCIE_LINK_GEN",
            "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        },
        "Total power": {"DCGM_FI_DEV_ENFORCED_POWER_LIMIT"},
        "Power against limit": {"DCGM_FI_DEV_ENFORCED_POWER_LIMIT"},
        "ECC errors": {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"},
    }
    assert set().union(*wanted.values()) <= needed
    missing = []
    for each in panels(board()):
        for field in wanted.get(each["title"], set()):
            if field not in each["description"]:
                missing.append(f"{each['title']}: {field}")
    assert not missing, missing
