"""The builders read gpuscope's names from gpuscope: every metric the committed boards and
rules name is a row of the exporter's tables or a family the reference worker serves,
with labels those rows have, and the builders' guards name what broke."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from alerts import dcgm_rules
from gpuscope.contract.exporter import EXPORTER_METRICS
from gpuscope.contract.gpu import GPU_METRICS
from gpuscope.contract.rows import MetricDef, MetricType
from gpuscope.worker.config import BatchingMode
from gpuscope.worker.kv_cache import KvStats
from gpuscope.worker.metrics import WorkerCollector
from gpuscope.worker.scheduler import BatchPolicy, Counters
from pack import contract, engines
from support.dashboards_json import (
    REPO,
    TARGET_LABELS,
    load_dashboards,
    parse_label_values,
    query_variables,
    selected_metrics,
    targets,
)

RULES = sorted((REPO / "alerts" / "rules").glob("*.yml"))
# A gpuscope metric name, not the middle of a recorded series' name (those have colons).
GPUSCOPE_NAME = re.compile(r"(?<![\w:])(gpuscope_\w+)(?![\w:])")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def table_samples() -> dict[str, MetricDef]:
    """Every sample name the exporter serves -> its row."""
    names: dict[str, MetricDef] = {}
    for row in (*EXPORTER_METRICS, *GPU_METRICS):
        if row.type is MetricType.HISTOGRAM:
            names |= {row.name + suffix: row for suffix in HISTOGRAM_SUFFIXES}
        else:
            names[row.sample_name] = row
    return names


class _Scheduler:
    queued = running = 0
    counters = Counters()


def worker_samples() -> set[str]:
    """Every sample name the reference worker's /metrics serves (continuous batching,
    so the KV-cache families are there)."""
    registry = CollectorRegistry()
    kv = KvStats(
        blocks_used=0, blocks_total=1, preemptions_total=0, iterations_total=0, running=0, waiting=0
    )
    registry.register(
        WorkerCollector(
            {"completions": _Scheduler()},
            BatchPolicy(BatchingMode.CONTINUOUS, 8, 0.005, 64),
            model_name="m",
            kv_stats=("completions", lambda: kv),
        )
    )
    return {sample.name for family in registry.collect() for sample in family.samples}


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL or text) of every board query, variable and rule (annotations too)."""
    found = []
    for name, board in load_dashboards().items():
        found += [(f"{t.board} / {t.panel}", t.expr) for t in targets(name, board)]
        found += [(f"{name} / ${v['name']}", v["query"]) for v in query_variables(board)]
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                where = f"{path.name} / {rule.get('alert') or rule['record']}"
                found.append((where, rule["expr"]))
                found += [(where, text) for text in rule.get("annotations", {}).values()]
    return found


def test_every_gpuscope_name_in_the_boards_and_rules_is_served() -> None:
    served = set(table_samples()) | worker_samples()
    unknown = [
        f"{where}: {name}"
        for where, text in expressions()
        for name in GPUSCOPE_NAME.findall(text)
        if name not in served
    ]
    assert unknown == []


def test_the_worker_names_of_the_engines_table_are_served() -> None:
    named = {value for key, value in vars(engines).items() if key.startswith("WORKER_")}
    assert named - worker_samples() == set()


def test_selectors_use_labels_of_the_rows() -> None:
    """``metric{label=...}`` and ``label_values(metric, label)`` on a table row name
    labels the row has (or the ones Prometheus adds)."""
    rows = table_samples()
    wrong = []
    for where, text in expressions():
        for metric, labels in selected_metrics(text):
            row = rows.get(metric)
            if row is None:
                continue
            extra = {"le"} if metric.endswith("_bucket") else set()
            if row in GPU_METRICS:
                # recorded from dcgm-exporter's series, a GPU row keeps its holder pod's
                # and its MIG instance's labels (the join by pod selects by them)
                extra |= {*dcgm_rules.HOLDER, *dcgm_rules.MIG}
            missing = set(labels) - {*row.labels, *TARGET_LABELS, *extra}
            if missing:
                wrong.append(f"{where}: {metric} has no {sorted(missing)}")
    for name, board in load_dashboards().items():
        for variable in query_variables(board):
            series, label = parse_label_values(variable["query"])
            row = rows.get(series.partition("{")[0])
            if row is not None and label not in {*row.labels, *TARGET_LABELS}:
                wrong.append(f"{name} / ${variable['name']}: {row.name} has no {label}")
    assert wrong == []


def test_a_label_a_row_lost_fails_the_build_naming_the_row() -> None:
    row = MetricDef("gpuscope_x_seconds", MetricType.HISTOGRAM, "x", ("service",))
    assert contract.label("service", row) == "service"
    with pytest.raises(LookupError, match=r"'model' of \['gpuscope_x_seconds'\]"):
        contract.label("model", row)


def test_a_phase_or_stage_the_contract_lost_fails_the_build() -> None:
    assert contract.phase("queue") == "queue"
    with pytest.raises(LookupError, match="'detokenize'"):
        contract.phase("detokenize")
    with pytest.raises(LookupError, match="'verify'"):
        contract.stage("verify")


def test_series_names_samples_by_the_row_type() -> None:
    histogram = MetricDef("gpuscope_x_seconds", MetricType.HISTOGRAM, "x")
    counter = MetricDef("gpuscope_x", MetricType.COUNTER, "x")
    assert contract.series(histogram, "bucket") == "gpuscope_x_seconds_bucket"
    assert contract.series(counter) == "gpuscope_x_total"
    with pytest.raises(ValueError, match="histogram"):
        contract.series(histogram)
    with pytest.raises(ValueError, match="counter"):
        contract.series(counter, "sum")


def test_no_builder_writes_a_gpuscope_metric_name() -> None:
    """Outside the worker's names (pack/engines/, which has no table to read them from),
    the names the rules give what they record, and the histograms only engines report
    (recorded under a gpuscope name, engines.RECORDED_ONLY), a builder reads names from
    the tables."""
    literal = re.compile(r"[\"'](gpuscope_(?!worker_)\w+)")
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for folder in ("dashboards", "alerts")
        for path in sorted((REPO / folder).glob("*.py"))
        for name in literal.findall(Path(path).read_text())
        if name not in engines.RECORDED_ONLY
    ]
    assert found == []


def test_recorded_only_names_are_no_exporter_metric() -> None:
    """A name recorded from the engines' histograms alone must not shadow a metric the
    exporter serves (its series would then be added up with the engines')."""
    served = {row.name for row in (*EXPORTER_METRICS, *GPU_METRICS)}
    assert engines.RECORDED_ONLY and not set(engines.RECORDED_ONLY) & served
