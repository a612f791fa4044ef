"""Several hosts, each with a GPU 0 (and, as simulated GPUs have, the same UUID): the
boards' GPU and verdict queries keep them apart. Evaluated by promtool over series
written as the exporters and the recording rules give them."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.dashboards_json import load_dashboards, query_variables, substitute, targets
from support.promtool_queries import STEP_VALUES, promtool_test

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

BOARDS = load_dashboards()
WHERE = "where-did-the-time-go.json"
UUID = "GPU-5f1e4c0e-sim-0"
HOSTS = {"node-a": "0.3", "node-b": "0.9"}  # host -> SM occupancy of its GPU 0


def expr(board: str, panel: str, **chosen: str) -> str:
    """The panel's one query with ``chosen`` variables and the rest on "All"."""
    (found,) = [t.expr for t in targets(board, BOARDS[board]) if t.panel == panel]
    values = {v["name"]: v.get("allValue") or ".*" for v in query_variables(BOARDS[board])}
    return substitute(found, {**values, **chosen}, STEP_VALUES)


def input_series() -> dict[str, str]:
    series = {}
    for host, occupancy in HOSTS.items():
        gpu = f'job="gpuscope", instance="{host}:9420", gpu="0", uuid="{UUID}"'
        series[f"gpuscope_gpu_sm_occupancy_ratio{{{gpu}}}"] = f"{occupancy}+0x30"
        series[f'instance_host_gpu:gpuscope_gpu_info:max{{{gpu}, host="{host}"}}'] = "1+0x30"
        series[
            "service_model_gpu:gpuscope_bottleneck:verdict{"
            f'source="spans", service="svc", model="m", host="{host}", gpu="0", '
            f'uuid="{UUID}", cause="compute"}}'
        ] = "1+0x30"
    return series


def test_each_host_row_shows_its_own_gpu_0(tmp_path: Path) -> None:
    checks = [
        {
            "expr": expr(WHERE, "SM occupancy", host="node-a", source="spans"),
            "eval_time": "10m",
            "exp_samples": [{"labels": '{instance="node-a:9420", gpu="0"}', "value": 0.3}],
        },
        {
            # every host, both GPU 0s: two verdicts, not one
            "expr": expr(WHERE, "Bottleneck now", host=".*", source="spans"),
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": f'{{host="{host}", service="svc", model="m", gpu="0", '
                    f'uuid="{UUID}", cause="compute"}}',
                    "value": 1,
                }
                for host in HOSTS
            ],
        },
        {
            "expr": expr("gpu.json", "SM occupancy"),
            "eval_time": "10m",
            "exp_samples": [
                {"labels": f'{{instance="{host}:9420", gpu="0"}}', "value": float(value)}
                for host, value in HOSTS.items()
            ],
        },
    ]
    result = promtool_test(tmp_path, input_series(), checks)
    assert result.returncode == 0, result.stdout + result.stderr
