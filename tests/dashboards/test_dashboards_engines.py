"""The boards over the serving engines' own /metrics: what the engine rules record is
drawn, a panel an engine can never fill says so, the latency board picks an engine's
models, and every query of a scraped series follows the board's ``$job`` and
``$instance``."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pack import contract, engines
from pack.recorded import SOURCE_SERIES, WINDOW
from pack.settings import Settings
from support.binaries import require_binary
from support.dashboards_json import (
    REPO,
    load_dashboards,
    panels,
    panels_by_row,
    parse_label_values,
    query_variables,
    substitute,
)
from support.promtool_queries import STEP_VALUES

BOARDS = load_dashboards()
RULES = REPO / "alerts" / "rules"
LATENCY = "inference-latency.json"
WHERE = "where-did-the-time-go.json"

# --- reading PromQL -------------------------------------------------------------------

_SELECTOR = re.compile(r"\{[^{}]*\}")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_NAME = re.compile(r"(?<![\w:.§$])([a-zA-Z_:][\w:]*)(?![\w:])\s*(\(|§(\d+)§)?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def reads(expr: str) -> Iterator[tuple[str, str]]:
    """(metric name, its selector or "") for every series ``expr`` reads, with or
    without a selector: not functions, operators, grouping labels or strings."""
    selectors: list[str] = []

    def hold(match: re.Match[str]) -> str:
        selectors.append(match.group(0))
        return f"§{len(selectors) - 1}§"

    text = _SELECTOR.sub(hold, expr)
    text = _RANGE.sub("", _GROUPING.sub("", _STRING.sub('""', text)))
    for match in _NAME.finditer(text):
        name, follows, index = match.groups()
        if follows == "(" or name.lower() in _KEYWORDS:
            continue
        yield name, selectors[int(index)] if index else ""


def test_reads_finds_bare_and_selected_series_only() -> None:
    expr = (
        'sum by (instance, endpoint) (\nrate(gpuscope_worker_x{job=~"$job"}[$__rate_interval])\n'
        '* on (job, instance) group_left (model)\ngpuscope_worker_info{model=~"$m"}\n)\n'
        'or label_replace(vector(0), "le", "0.5", "", "") > 1e6 and bare_one\n'
        "/ ignoring (phase) group_left () (rec:x:rate5m > 0)"
    )
    assert list(reads(expr)) == [
        ("gpuscope_worker_x", '{job=~"$job"}'),
        ("gpuscope_worker_info", '{model=~"$m"}'),
        ("bare_one", ""),
        ("rec:x:rate5m", ""),
    ]


def recorded() -> dict[str, list[dict[str, Any]]]:
    """Recording-rule name -> its rules, over every rule file."""
    rules: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    rules.setdefault(rule["record"], []).append(rule)
    return rules


RECORDED = recorded()


def keeps_target(metric: str) -> bool:
    """Whether ``metric``'s series carry a scrape target's job and instance: every
    scraped series does; a recorded one where its level (``instance_endpoint:...``,
    the rules' naming) keeps the instance."""
    if metric not in RECORDED:
        return True
    return "instance" in metric.split(":")[0].split("_")


# --- $job and $instance ---------------------------------------------------------------


def unfiltered(board: dict[str, Any]) -> list[str]:
    """Queries of ``board`` reading a series with job and instance labels without the
    board's own ``$job`` and ``$instance``."""
    problems = []
    for panel in panels(board):
        for target in panel["targets"]:
            for metric, sel in reads(target["expr"]):
                if not keeps_target(metric):
                    continue
                missing = [
                    label for label in ("job", "instance") if f'{label}=~"${label}"' not in sel
                ]
                if missing:
                    problems.append(f"{panel['title']}: {metric}{sel or ''} lacks {missing}")
    return problems


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_scraped_series_follows_the_boards_job_and_instance(name: str) -> None:
    """A shared Prometheus scrapes every environment's exporters and engines: a query
    that ignores ``$job`` or ``$instance`` adds another environment's workers in."""
    board = BOARDS[name]
    variables = {variable["name"] for variable in query_variables(board)}
    if not {"job", "instance"} <= variables:
        # the where board picks hosts through the rules' series instead
        assert name == WHERE
        return
    problems = unfiltered(board)
    assert not problems, "\n".join(problems)


def test_the_job_and_instance_of_the_latency_board_list_every_engines_targets() -> None:
    """``$job`` and ``$instance`` list the engines' scrape targets too, so that
    filtering by them keeps the serving-engine panels."""
    chosen = {v["name"]: v for v in query_variables(BOARDS[LATENCY])}
    for name in ("job", "instance"):
        series, _ = parse_label_values(chosen[name]["query"])
        listed = re.search(r'__name__=~"([^"]*)"', series)
        assert listed, series
        names = set(listed.group(1).split("|"))
        for engine in engines.ENGINES:
            assert engine.scraped and set(engine.scraped) <= names, (name, engine.source)
        assert {contract.WORKER_INFO, engines.VLLM_RUNNING} <= names


# --- drawn ----------------------------------------------------------------------------


def _engine_records() -> set[str]:
    made = yaml.safe_load((RULES / "engines.yml").read_text())
    return {rule["record"] for group in made["groups"] for rule in group["rules"]}


def test_every_series_the_engine_rules_record_is_drawn() -> None:
    """Each series recorded from an engine's own /metrics (requests with failures, error
    ratio, mean batch size, running and waiting requests, KV usage, the objectives) is
    read by a panel of the latency board that can show an engine's source."""
    drawn: set[str] = set()
    for row, panel in panels_by_row(BOARDS[LATENCY]):
        per_source = row is not None and row.get("repeat") == "source"
        for target in panel["targets"]:
            for metric, sel in reads(target["expr"]):
                if ('source=~"$source"' in sel and per_source) or 'source!=""' in sel:
                    drawn.add(metric)
    # the windows the boards read; the longer ones feed the burn alerts
    current = {record for record in _engine_records() if record.endswith(WINDOW)}
    assert len(current) >= 6
    assert current - drawn == set()


def test_the_boards_note_gives_the_engines_mean_batch_size() -> None:
    """Triton's and TGI's mean batch size is recorded and drawn: the note does not call
    it not reported."""
    (note,) = [p["options"]["content"] for p in BOARDS[LATENCY]["panels"] if p["type"] == "text"]
    lines = {line.split("`")[1]: line for line in note.splitlines() if line.startswith("- `")}
    batching = [e.source for e in engines.ENGINES if e.capability.reports("batch_size")]
    assert batching
    for source in batching:
        given, _, lacking = lines[source].partition("not reported:")
        assert "mean batch size" in given and "mean batch size" not in lacking, lines[source]


def _panel(board: str, title: str) -> dict[str, Any]:
    found: dict[str, Any]
    (found,) = [
        panel
        for row, panel in panels_by_row(BOARDS[board])
        if panel["title"] == title and (board != LATENCY or (row or {}).get("repeat") == "source")
    ]
    return found


TRITON = 'job="triton", instance="gpu-host-1:8002", model="resnet", version="1", gpu_uuid="GPU-10"'


def _triton_input() -> dict[str, str]:
    """A minute's worth each minute: 90 successes, 30 BACKEND failures (1.5 and 0.5 a
    second), 90 inferences in 120 executions (the failed ones counted back: a batch of
    1), 3 requests pending."""
    return {
        f"{engines.TRITON_SUCCESS}{{{TRITON}}}": "0+90x30",
        f'{engines.TRITON_FAILURE}{{{TRITON}, reason="BACKEND"}}': "0+30x30",
        f"{engines.TRITON_INFERENCES}{{{TRITON}}}": "0+90x30",
        f"{engines.TRITON_EXECUTIONS}{{{TRITON}}}": "0+120x30",
        f"{engines.TRITON_PENDING}{{{TRITON}}}": "3+0x30",
        **{
            f"{name}{{{TRITON}}}": "0+600000x30"
            for name in (engines.TRITON_REQUEST_US, engines.TRITON_QUEUE_US)
        },
    }


def _as_triton(expr: str) -> str:
    values: dict[str, str] = {
        v["name"]: v.get("allValue") or ".*" for v in query_variables(BOARDS[LATENCY])
    }
    return substitute(expr, {**values, "source": "triton"}, STEP_VALUES)


@pytest.mark.processes  # promtool
def test_the_engine_panels_draw_what_triton_counts(tmp_path: Path) -> None:
    """Through the shipped rules (promtool), the per-source panels with source triton:
    requests finished counting failures, the failed ones, the error ratio, the mean
    batch size; and Triton's pending requests in the serving-engine row."""
    promtool = require_binary("promtool")
    expected = {
        ("Request rate", 0): ("{}", 2.0),
        ("Request rate", 1): ("{}", 0.5),
        ("Error ratio", 0): ('{service="triton", model="resnet"}', 0.25),
        ("Mean batch size", 0): ('{service="triton", model="resnet", host="gpu-host-1"}', 1.0),
    }
    checks = []
    for (title, index), (labels, value) in expected.items():
        expr = _as_triton(_panel(LATENCY, title)["targets"][index]["expr"])
        checks.append(
            {"expr": expr, "eval_time": "20m", "exp_samples": [{"labels": labels, "value": value}]}
        )
    (waiting,) = [
        t["expr"]
        for p in panels(BOARDS[LATENCY])
        if p["title"] == "Requests running and waiting"
        for t in p["targets"]
        if "{{state}}" in t["legendFormat"]
    ]
    checks.append(
        {
            "expr": _as_triton(waiting),
            "eval_time": "20m",
            "exp_samples": [
                {
                    "labels": '{source="triton", instance="gpu-host-1:8002", endpoint="infer", '
                    'state="waiting"}',
                    "value": 3,
                }
            ],
        }
    )
    document = {
        "rule_files": [str(RULES / "recording.yml"), str(RULES / "engines.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series, "values": values}
                    for series, values in _triton_input().items()
                ],
                "promql_expr_test": checks,
            }
        ],
    }
    path = tmp_path / "engine_panels_test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- what an engine cannot fill -------------------------------------------------------


def _without_phase_buckets() -> list[str]:
    return [
        engine.source
        for engine in engines.ENGINES
        if not all(t.bucket for t in engine.timings_for(engines.PHASE_HISTOGRAM))
    ]


def _without_bound(histogram: str, bound: str) -> list[str]:
    return [
        engine.source
        for engine in engines.ENGINES
        if not any(float(bound) in t.seconds for t in engine.timings_for(histogram))
    ]


def _says_not_reported(panel: dict[str, Any], sources: list[str]) -> None:
    text = panel["fieldConfig"]["defaults"]["noValue"]
    assert text.startswith("Not reported by this engine"), (panel["title"], text)
    named = text.partition("(")[2].partition(")")[0].split(", ")
    for source in sources:
        assert source in named, (panel["title"], text)


@pytest.mark.parametrize(
    ("board", "title"),
    [(LATENCY, "P99 per phase and compute stage"), (WHERE, "Phase P99 against end-to-end P99")],
)
def test_phase_p99_panels_name_the_engines_without_phase_buckets(board: str, title: str) -> None:
    """Triton's phases are counters, SGLang's have no buckets mapped: the phase P99
    panels of their source never have data, whatever the traffic."""
    lacking = _without_phase_buckets()
    assert engines.TRITON in lacking
    _says_not_reported(_panel(board, title), lacking)


@pytest.mark.parametrize(
    "slo", [Settings().latency_slo, Settings().ttft_slo], ids=lambda slo: slo.name
)
def test_burn_panels_name_the_engines_without_a_bucket_at_the_bound(slo: Any) -> None:
    """The rules record an objective's share only from a bucket at its bound: an engine
    without one never fills the error budget panel."""
    lacking = _without_bound(slo.histogram, slo.le)
    assert lacking
    _says_not_reported(_panel(LATENCY, f"{slo.title}: error budget burn"), lacking)


# --- the latency board's requests -----------------------------------------------------


def _sources_recording(record: str) -> set[str]:
    return {rule.get("labels", {}).get("source", "") for rule in RECORDED.get(record, [])}


@pytest.mark.parametrize("variable", ["service", "model", "gpu"])
def test_the_latency_boards_requests_are_picked_from_every_source(variable: str) -> None:
    """An engine's own /metrics reach gpuscope only through the rules: the latency
    board's service, model and GPU come from a series recorded for every source (as the
    where board's do), not from the spans' raw histograms."""
    chosen = {v["name"]: v for v in query_variables(BOARDS[LATENCY])}
    series, label = parse_label_values(chosen[variable]["query"])
    metric = series.partition("{")[0]
    assert label == variable and metric == SOURCE_SERIES
    assert _sources_recording(metric) >= set(engines.SOURCES)


# --- one share of the mean for board and verdict ---------------------------------------

SGLANG_SCHEDULER = (
    'job="sglang", instance="gpu-host-1:30000", model_name="qwen", engine_type="unified", '
    'tp_rank="0", pp_rank="0", moe_ep_rank="0"'
)
SGLANG_TOKENIZER = (
    'job="sglang", instance="gpu-host-1:30000", model_name="qwen", engine_type="unified", '
    'is_streaming="true"'
)


def _as_where(expr: str, **chosen: str) -> str:
    values: dict[str, str] = {
        v["name"]: v.get("allValue") or ".*" for v in query_variables(BOARDS[WHERE])
    }
    return substitute(expr, {**values, **chosen}, STEP_VALUES)


@pytest.mark.processes  # promtool
def test_the_phase_share_panel_is_the_verdicts_share_of_the_mean(tmp_path: Path) -> None:
    """ "Phase share of mean time" draws each phase's mean over the sum of the means,
    which is what the verdict's ``share_mean`` records, also where the phases count
    different requests: SGLang's queue histogram (two queue waits a request here, 0.5 s
    each) beside its end-to-end one (1.5 s after the queue). The seconds' share would be
    0.4 for queue; the mean's is 0.25."""
    promtool = require_binary("promtool")
    recorded = f"service_model_gpu:{engines.PHASE_HISTOGRAM}:share_mean{WINDOW}"
    panel = _as_where(
        _panel(WHERE, "Phase share of mean time")["targets"][0]["expr"], source=engines.SGLANG
    )
    agree = f"abs(\n{panel}\n- on (phase)\nsum by (phase) ({recorded})\n) < 1e-9"
    checks = [
        {
            "expr": f"count({agree})",
            "eval_time": "20m",
            "exp_samples": [{"labels": "{}", "value": 2}],
        },
        {
            "expr": f'{recorded}{{phase="queue"}} > 0.2499 < 0.2501',
            "eval_time": "20m",
            "exp_samples": [
                {
                    "labels": f'{recorded}{{source="sglang", service="sglang", model="qwen", '
                    'host="gpu-host-1", phase="queue"}',
                    "value": 0.25,
                }
            ],
        },
    ]
    series = {
        f"{engines.SGLANG_QUEUE}_sum{{{SGLANG_SCHEDULER}}}": "0+60x30",
        f"{engines.SGLANG_QUEUE}_count{{{SGLANG_SCHEDULER}}}": "0+120x30",
        f"{engines.SGLANG_E2E}_sum{{{SGLANG_TOKENIZER}}}": "0+150x30",
        f"{engines.SGLANG_E2E}_count{{{SGLANG_TOKENIZER}}}": "0+60x30",
    }
    document = {
        "rule_files": [str(RULES / "recording.yml"), str(RULES / "engines.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": checks,
            }
        ],
    }
    path = tmp_path / "share_test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
