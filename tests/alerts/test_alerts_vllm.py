"""vLLM's metrics-only path: the rules and their promtool cases against vLLM's real
``/metrics`` (the capture in tests/fixtures, taken from the running engine)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pack import engines
from pack.engines import EngineHistogram

REPO = Path(__file__).parents[2]
CAPTURE = REPO / "tests" / "fixtures" / "vllm-0.32.0" / "metrics.txt"
RULES = REPO / "alerts" / "rules"
UNIT_TESTS = sorted((REPO / "alerts" / "tests").glob("*_test.yml"))
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}
# ... and, scraped through Kubernetes service discovery (the deploy's vLLM PodMonitor),
# the pod's own: the join by pod (alerts/pod_join.py)
POD_LABELS = {"namespace", "pod"}
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
LABEL = re.compile(r'(\w+)="([^"]*)"')
VLLM_NAME = re.compile(r"\bvllm:[a-z0-9_]+")


def captured() -> dict[str, tuple[set[str], set[str]]]:
    """Sample name -> (label names, ``le`` values) in the capture."""
    samples: dict[str, tuple[set[str], set[str]]] = {}
    for family in text_string_to_metric_families(CAPTURE.read_text()):
        for sample in family.samples:
            names, bounds = samples.setdefault(sample.name, (set(), set()))
            names.update(sample.labels)
            if "le" in sample.labels:
                bounds.add(sample.labels["le"])
    return samples


CAPTURED = captured()


def _bounds(native: str) -> set[str]:
    return CAPTURED[native + "_bucket"][1] - {"+Inf"}


@pytest.mark.parametrize(
    "histogram", [*engines.VLLM_HISTOGRAMS, *engines.VLLM_TOKEN_HISTOGRAMS], ids=lambda h: h.native
)
def test_the_engines_table_has_vllms_histograms_and_buckets(histogram: EngineHistogram) -> None:
    for suffix in ("_bucket", "_sum", "_count"):
        assert histogram.native + suffix in CAPTURED, histogram.native + suffix
    assert {float(b) for b in histogram.buckets} == {float(b) for b in _bounds(histogram.native)}


def test_the_engines_table_names_vllms_gauges_and_counters() -> None:
    for name in (
        engines.VLLM_RUNNING,
        engines.VLLM_WAITING,
        engines.VLLM_KV_USAGE,
        engines.VLLM_PREEMPTIONS,
        engines.VLLM_FINISHED,
    ):
        assert name in CAPTURED, name
    reason = engines.VLLM_ERROR_REASON.split("=")[0]
    assert reason in CAPTURED[engines.VLLM_FINISHED][0]


def rule_exprs() -> str:
    return "\n".join(
        rule["expr"]
        for path in RULES.glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    )


def test_the_rules_select_only_what_vllm_serves() -> None:
    """Every vLLM series a rule reads, with the labels its matchers name."""
    text = rule_exprs()
    used = set(VLLM_NAME.findall(text))
    assert used, "no rule reads vLLM's /metrics"
    assert used - set(CAPTURED) == set()
    for name, matchers in re.findall(r"\b(vllm:[a-z0-9_]+)\{([^}]*)\}", text):
        labels = {label for label, _ in LABEL.findall(matchers)}
        assert labels - CAPTURED[name][0] - TARGET_LABELS == set(), f"{name}{{{matchers}}}"
    # vLLM's own label names, read by label_replace and matchers
    for label in ("model_name", "finished_reason"):
        assert label in text


def input_series() -> list[tuple[Path, str, dict[str, str]]]:
    found = []
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for series in test.get("input_series", []):
                match = SERIES.match(series["series"])
                assert match, series["series"]
                found.append((path, match.group(1), dict(LABEL.findall(match.group(2)))))
    return found


def test_promtool_inputs_are_shaped_like_vllms_exposition() -> None:
    """Names, label names (plus job and instance) and bucket bounds as vLLM serves them."""
    vllm = [series for series in input_series() if series[1].startswith("vllm:")]
    assert len(vllm) > 100
    for path, name, labels in vllm:
        assert name in CAPTURED, f"{path.name}: {name} is not in vLLM's /metrics"
        names, bounds = CAPTURED[name]
        assert set(labels) - POD_LABELS == names | TARGET_LABELS, f"{path.name}: {name}{labels}"
        if "le" in labels:
            assert labels["le"] in bounds, f"{path.name}: {name} has no bucket {labels['le']}"


def test_every_histogram_the_cases_give_has_all_of_its_buckets() -> None:
    """A case with some buckets of a histogram has all of them, as vLLM serves them."""
    buckets: dict[tuple[str, str, str], set[str]] = {}
    for path, name, labels in input_series():
        if name.startswith("vllm:") and "le" in labels:
            others = str(sorted((k, v) for k, v in labels.items() if k != "le"))
            buckets.setdefault((path.name, name, others), set()).add(labels["le"])
    assert buckets
    for (file, name, others), bounds in buckets.items():
        assert bounds == CAPTURED[name][1], f"{file}: {name} {others}"
