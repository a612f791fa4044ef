"""Each engine's own ``/metrics`` (the ``ENGINES`` rows): the rules read only what each
engine exposes (``pack/engines/``, taken from its source at a release), and their
promtool cases feed series shaped exactly as the engine writes them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from alerts.build import main as build_main
from alerts.build import rendered
from alerts.engine_rules import BOTTLENECK_GROUP, timing_rules
from pack import engines
from pack.contract import PHASES
from pack.engines import ENGINES, ROW_RULED, Engine
from pack.settings import EngineJobs, Settings

REPO = Path(__file__).parents[2]
RULES = REPO / "alerts" / "rules"
TESTS = REPO / "alerts" / "tests"
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}
# A label a scrape config may set on the target: TGI's series name no model, and
# trtllm-serve's say model_name="undefined" (docs/engines/tgi.md, tensorrt-llm.md).
SCRAPE_LABELS = {engines.TGI: {"model"}, engines.TRTLLM: {"model"}}
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
LABEL = re.compile(r'(\w+)="([^"]*)"')
# A native name of any engine: its row's prefix, then a name.
NATIVE_NAME = "(?:" + "|".join(re.escape(engine.prefix) for engine in ENGINES) + r")\w+"
NATIVE = re.compile(rf"\b{NATIVE_NAME}")
LE_REGEX = re.compile(r'\ble=~"([^"]*)"')


def normalised(bound: str) -> str:
    """A bucket bound as Prometheus 3 stores it: a whole number with ``.0``."""
    value = float(bound)
    return f"{value:.1f}" if value.is_integer() else repr(value)


def engine_of(name: str) -> Engine | None:
    for engine in ENGINES:
        if name in engine.exposition:
            return engine
    return None


def rule_exprs() -> str:
    return "\n".join(
        rule["expr"]
        for path in RULES.glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    )


def test_the_rules_read_only_what_the_engines_expose() -> None:
    """Every native name a rule reads is in an engine's table, and every label its
    matchers name is one that series carries (or job and instance)."""
    text = rule_exprs()
    used = set(NATIVE.findall(text))
    for name in used:
        assert engine_of(name) is not None, f"{name} is in no engine's exposition"
    read = {engine.source for engine in ENGINES for name in used if name in engine.exposition}
    assert read == {engine.source for engine in ENGINES}
    for name, matchers in re.findall(rf"\b({NATIVE_NAME})\{{([^}}]*)\}}", text):
        shape = engines_shape(name)
        labels = {label for label, _ in LABEL.findall(matchers)}
        allowed = {*shape.labels, *shape.optional} | TARGET_LABELS
        assert labels <= allowed, f"{name}{{{matchers}}}"
        for label, value in LABEL.findall(matchers):
            if label == "le":
                assert value in (*shape.bounds, "+Inf"), f"{name} has no bucket {value}"
        for value in LE_REGEX.findall(matchers):
            # a bound written either way: the engine's form and Prometheus 3's
            matched = {b for b in shape.bounds if re.fullmatch(value.replace("\\\\", "\\"), b)}
            assert len(matched) == 1, f"{name}{{{matchers}}} matches bounds {matched}"
            (bound,) = matched
            assert re.fullmatch(value.replace("\\\\", "\\"), normalised(bound)), value


def engines_shape(name: str) -> engines.Exposition:
    engine = engine_of(name)
    assert engine is not None, name
    return engine.exposition[name]


def test_every_engine_label_the_rules_read_is_one_the_engine_writes() -> None:
    """The model label of each engine, and the labels its error matchers select."""
    for engine in ENGINES:
        names = {label for shape in engine.exposition.values() for label in shape.labels}
        if engine.model_label:
            assert engine.model_label in names, engine.source
        counter, matcher = engine.errors
        if counter:
            label = matcher.split("=")[0]
            assert label in engine.exposition[counter].labels, engine.source


def input_series(path: Path) -> list[tuple[str, dict[str, str]]]:
    found = []
    for test in yaml.safe_load(path.read_text())["tests"]:
        for series in test.get("input_series", []):
            match = SERIES.match(series["series"])
            assert match, series["series"]
            found.append((match.group(1), dict(LABEL.findall(match.group(2)))))
    return found


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.source)
def test_promtool_inputs_are_shaped_like_the_engines_exposition(engine: Engine) -> None:
    """Each engine's cases: names, label names (required ones all there, optional ones
    as the engine may add them), bucket bounds as the engine writes them, and every
    bucket of a histogram given."""
    path = TESTS / f"{engine.source}_test.yml"
    native = [(n, labels) for n, labels in input_series(path) if NATIVE.fullmatch(n)]
    assert len(native) > 40, path.name
    buckets: dict[tuple[str, str], set[str]] = {}
    for name, labels in native:
        assert name in engine.exposition, f"{path.name}: {name} is not in {engine.release}"
        shape = engine.exposition[name]
        extra = set(labels) - set(shape.labels) - TARGET_LABELS
        assert set(shape.labels) <= set(labels), f"{path.name}: {name}{labels}"
        assert extra <= set(shape.optional) | SCRAPE_LABELS.get(engine.source, set()), (
            f"{path.name}: {name}{labels}"
        )
        assert set(labels) >= TARGET_LABELS
        if "le" in labels:
            # as the engine writes the bound, or as Prometheus 3 stores it (500 as 500.0)
            written = {b: b for b in shape.bounds} | {normalised(b): b for b in shape.bounds}
            le = labels["le"]
            assert le in (*written, "+Inf"), f"{name} has no bucket {le}"
            others = str(sorted((k, v) for k, v in labels.items() if k != "le"))
            buckets.setdefault((name, others), set()).add(written.get(le, le))
    assert buckets or engine is engines.TRITON_ENGINE
    for (name, others), bounds in buckets.items():
        assert bounds == {*engine.exposition[name].bounds, "+Inf"}, f"{name} {others}"


def test_the_triton_cases_give_bounds_both_ways() -> None:
    """Rules are tested against bounds as Triton writes them (500) and as Prometheus 3
    stores them (500.0)."""
    les = {
        labels["le"]
        for name, labels in input_series(TESTS / "triton_test.yml")
        if name == engines.TRITON_FIRST_RESPONSE_MS + "_bucket"
    }
    assert {"500", "500.0"} <= les


def test_triton_durations_stay_cumulative_microsecond_counters_in_the_cases() -> None:
    """A counter in µs stays a counter in µs: every Triton duration series of the cases
    only grows, and by amounts of microseconds (a second of queue a minute is 1e6)."""
    document = yaml.safe_load((TESTS / "triton_test.yml").read_text())
    durations = [
        series["values"]
        for test in document["tests"]
        for series in test["input_series"]
        if series["series"].startswith(("nv_inference_queue_duration_us", "nv_inference_compute"))
    ]
    assert durations
    for values in durations:
        match = re.fullmatch(r"0\+([0-9.e+]+)x\d+", values)
        assert match, values  # a counter from 0 that only grows
        growth = float(match.group(1))
        assert growth == 0 or growth >= 1000, values  # µs, not seconds; 0 idle


def test_every_engine_has_a_verdict_case() -> None:
    for engine in ENGINES:
        text = (TESTS / f"{engine.source}_test.yml").read_text()
        causes = set(re.findall(rf'verdict\{{source="{engine.source}"[^}}]*cause="(\w+)"', text))
        assert causes, engine.source
    # and, between them, the phase, the GPU-join and the underfed outcomes
    every = "".join((TESTS / f"{e.source}_test.yml").read_text() for e in ENGINES)
    assert {"queue", "compute", "underfed"} <= set(re.findall(r'cause="(\w+)"', every))


def test_the_timings_are_where_the_verdict_reads_them() -> None:
    """At the head of the bottleneck group, before the means and shares in it."""
    groups = yaml.safe_load((RULES / "recording.yml").read_text())["groups"]
    bottleneck = next(group for group in groups if group["name"] == BOTTLENECK_GROUP)
    expected = timing_rules(Settings())
    assert bottleneck["rules"][: len(expected)] == expected
    sources = {rule["labels"]["source"] for rule in expected}
    assert sources == {engine.source for engine in ROW_RULED}


def test_the_engine_rules_are_generated_into_their_own_file_and_named_like_the_rest() -> None:
    made = rendered(Settings())
    assert set(made) == {"recording.yml", "alerting.yml", "engines.yml", "dcgm-exporter.yml"}
    for rule in (
        rule for group in yaml.safe_load(made["engines.yml"])["groups"] for rule in group["rules"]
    ):
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def test_job_selectors_can_be_set_per_engine() -> None:
    jobs = EngineJobs().replace(triton='job="inference"', tgi=None)
    made = rendered(dataclasses.replace(Settings(), engine_jobs=jobs))
    assert 'nv_inference_request_success{job="inference"}' in made["engines.yml"]
    assert 'nv_inference_request_success{job="triton"}' not in made["engines.yml"]
    assert 'tgi_request_success{job="tgi"}' in made["engines.yml"]


@pytest.mark.parametrize("name", ["recording.yml", "engines.yml"])
def test_the_rule_files_name_each_engines_release(name: str) -> None:
    head = "".join(line for line in (RULES / name).read_text().splitlines(True) if line[0] == "#")
    for engine in ROW_RULED:  # vLLM's rules are recording.py's, its release its docs page's
        for release in (engine.release, *engine.also):
            assert str(release) in head and release.ref in head, engine.source


def test_the_capabilities_say_what_the_rules_record() -> None:
    """The phases each engine's table maps are those its capability names, and a
    timing the capability denies has no rule."""
    for engine in ENGINES:
        mapped = {t.key_value for t in engine.timings if t.gpuscope == engines.PHASE_HISTOGRAM}
        assert mapped == set(engine.capability.phases), engine.source
        assert set(engine.capability.phases) <= set(PHASES)
        assert engine.capability.reports("ttft") == bool(
            engine.timings_for(engines.TTFT_HISTOGRAM)
        ), engine.source
        assert engine.capability.reports("tpot") == bool(
            engine.timings_for(engines.TPOT_HISTOGRAM)
        ), engine.source
        assert engine.capability.reports("kv_cache") == bool(engine.kv_usage), engine.source
    assert set(engines.SOURCE_DETAILS) == set(engines.SOURCES)
    assert set(engines.SOURCE_CAPABILITIES) == set(engines.SOURCES)


def test_bounds_in_other_units_are_converted_to_seconds() -> None:
    ttft = engines.TRITON_ENGINE.timings_for(engines.TTFT_HISTOGRAM)[0]
    assert ttft.seconds == (0.1, 0.5, 2.0, 5.0)
    made = rendered(Settings())["recording.yml"]
    for native, seconds in (("100", "0.1"), ("500", "0.5"), ("2000", "2"), ("5000", "5")):
        # the bound written either way (Prometheus 3 stores 500 as 500.0)
        assert f'le=~"{native}(\\\\.0)?"}}[5m]),' in made
        assert f'"le", "{seconds}", "", ""' in made


@pytest.mark.parametrize("source", engines.SOURCES)
def test_what_the_boards_read_agrees_with_the_details(source: str) -> None:
    """The boards' capabilities (SOURCE_CAPABILITIES) and the details the docs' table
    is checked against (SOURCE_DETAILS) say the same of each source."""
    boards = engines.SOURCE_CAPABILITIES[source]
    details = engines.SOURCE_DETAILS[source]
    given = boards.reports | boards.sometimes
    assert (engines.PHASE_TIMES in given) == bool(details.phases)
    assert (engines.COMPUTE_SPLIT in given) == bool(details.stages)
    assert (engines.TIME_TO_FIRST_TOKEN in given) == details.reports("ttft")
    assert (engines.TIME_PER_OUTPUT_TOKEN in given) == details.reports("tpot")


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.source)
def test_each_engines_job_selector_is_a_flag_of_the_rule_build(
    engine: Engine, tmp_path: Path
) -> None:
    flag = f"--{engine.source}-job-selector"
    assert build_main(["--out", str(tmp_path), flag, 'job="llm"']) == 0
    made = "".join(path.read_text() for path in tmp_path.glob("*.yml"))
    counter = engine.requests[0]
    assert counter + '{job="llm"}' in made
    assert counter + "{" + engine.job_selector not in made


def test_the_job_selectors_are_the_rows_and_only_the_rows() -> None:
    assert EngineJobs().selectors == tuple((e.source, e.job_selector) for e in ENGINES)
    assert Settings().engine_sel(engines.VLLM, 'le="1"') == '{job="vllm", le="1"}'
    with pytest.raises(KeyError, match="nosuch"):
        EngineJobs().replace(nosuch='job="x"')


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.source)
def test_every_name_an_engine_exposes_starts_with_its_prefix(engine: Engine) -> None:
    """The prefix tells the engines' names apart in the rules (``NATIVE``)."""
    assert all(name.startswith(engine.prefix) for name in engine.exposition), engine.source
    others = [e.prefix for e in ENGINES if e is not engine]
    assert not any(name.startswith(tuple(others)) for name in engine.exposition)


def test_the_tensorrt_llm_backend_gauges_are_read_with_their_family_label() -> None:
    """The backend's families hold several gauges apart by one label: the rules read
    one of them each, never the family summed."""
    made = rendered(Settings())["engines.yml"]
    for family, label, value in (
        (engines.TRTLLM_BACKEND_REQUESTS, "request_type", "scheduled"),
        (engines.TRTLLM_BACKEND_KV_BLOCKS, "kv_cache_block_type", "fraction"),
    ):
        reads = re.findall(rf"\b{family}\{{([^}}]*)\}}", made)
        assert reads, family
        assert all(f'{label}="{value}"' in matchers for matchers in reads), reads
        assert label in engines.TRITON_ENGINE.exposition[family].labels
