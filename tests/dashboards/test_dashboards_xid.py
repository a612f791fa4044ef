"""The XID panel: each XID shows, with its code, at the step it occurs, as a whole number.

A code's counter is served from its first XID on, already at its count, so
``increase()`` never saw the first rise; a GPU's series that come back after a gap
(the GPU was lost) carry the XIDs of the gap. Evaluated by promtool, one-minute steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.dashboards_json import load_dashboards
from support.promtool_queries import as_all, promtool_test

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

BOARD = load_dashboards()["gpu.json"]
GPU = 'job="gpuscope", instance="node-a:9420", gpu="0", uuid="GPU-0"'
WHERE = 'instance="node-a:9420", gpu="0"'
# minutes 0-5: no XID; 6: three XID 48; 12-31: the GPU's series are gone (lost);
# 32: back, with two XID 79 of the gap (promtool: ``_xN`` is N blanks, ``vxN`` N+1 values)
INPUT = {
    f"gpuscope_gpu_xid_events_total{{{GPU}}}": "0x5 3x5 _x20 5x10",
    f'gpuscope_gpu_xid_errors_total{{{GPU}, xid="48"}}': "_x6 3x5 _x20 3x10",
    f'gpuscope_gpu_xid_errors_total{{{GPU}, xid="79"}}': "_x32 2x10",
}


def xid_queries() -> tuple[str, str]:
    (panel,) = (p for p in BOARD["panels"] if p.get("title") == "XID errors")
    assert panel["fieldConfig"]["defaults"]["decimals"] == 0
    all_codes, by_code = (as_all(t["expr"], BOARD) for t in panel["targets"])
    assert "xid_events" in all_codes and "xid_errors" in by_code
    return all_codes, by_code


def test_every_xid_shows_with_its_code_when_it_occurs(tmp_path: Path) -> None:
    all_codes, by_code = xid_queries()

    def at(minute: int, total: float | None, codes: dict[str, float]) -> list[dict[str, object]]:
        every = [{"labels": f"{{{WHERE}}}", "value": total}] if total is not None else []
        per_code = [
            {"labels": f'{{{WHERE}, xid="{code}"}}', "value": value}
            for code, value in codes.items()
        ]
        return [
            {"expr": all_codes, "eval_time": f"{minute}m", "exp_samples": every},
            {"expr": by_code, "eval_time": f"{minute}m", "exp_samples": per_code},
        ]

    checks = [
        *at(5, 0, {}),
        *at(6, 3, {"48": 3}),  # the code's first XIDs, at once and whole
        *at(7, 0, {"48": 0}),
        *at(25, None, {}),  # the GPU's series are gone: nothing drawn
        *at(32, 2, {"48": 0, "79": 2}),  # the gap's XIDs, when the series return
        *at(33, 0, {"48": 0, "79": 0}),
    ]
    result = promtool_test(tmp_path, INPUT, checks)
    assert result.returncode == 0, result.stdout + result.stderr
