"""The change recipes of docs/development.md, one test each: the change the recipe
describes, made in the test, reaches everything the recipe says it reaches, or fails
naming the place that still needs an edit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuscope import engine_spans, flags
from gpuscope.contract import exporter as defs
from gpuscope.contract import gpu as gpu_rows
from gpuscope.contract.rows import LATENCY_BUCKETS, MetricDef, MetricType
from gpuscope.exporter import doctor
from gpuscope.exporter.gpu import factory
from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.definitions import METRIC_GROUPS
from gpuscope.exporter.gpu.factory import open_gpu_source
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading, GpuSource, GpuSourceKind
from gpuscope.exporter.http.render import render_histograms
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.self_metrics import ExporterCollector, SelfMetrics
from gpuscope.flags import ConfigError, option, positive
from gpuscope.spans import COMPUTE_STAGES, PHASES
from gpuscope.worker.app import UNTRACED_PATHS
from gpuscope.worker.config import WorkerConfig
from pack.engines import DURATION_HISTOGRAM, PHASE_HISTOGRAM
from pack.recorded import ERRORS_RATIO, REQUESTS_RATE, WAITING, rate_record, slo_errors_ratio
from pack.settings import Settings
from support.span_recorder import SpanRecorder
from support.worker_servers import serve_worker

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "development.md"


def recipe(title: str) -> str:
    """The text of one recipe of docs/development.md's "Change recipes"."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Change recipes\n", 1)[1].split("\n## ", 1)[0]
    start = section.index(f"### {title}\n")
    return section[start:].split("\n### ", 1)[0]


@pytest.mark.parametrize(
    "title",
    [
        "A phase",
        "A request metric",
        "A GPU field metric",
        "A GPU source",
        "A worker endpoint",
        "An engine adapter",
        "An engine's own /metrics",
        "A flag",
    ],
)
def test_each_recipe_names_its_test(title: str) -> None:
    assert f"`tests/docs/test_docs_recipes.py::{_TESTS[title]}`" in recipe(title)


# --- a phase ------------------------------------------------------------------------

# Run in a fresh interpreter: ``gpuscope.spans`` with one more PHASE_MARKS line, then
# every module that reads the contract, imported after it.
_PHASE_SCRIPT = """
import importlib.util, json, sys, types
from pathlib import Path

repo = Path(sys.argv[1])
sys.path[:0] = [str(repo), str(repo / "tests")]
source = (repo / "core" / "spans.py").read_text()
old = '    "postprocess": ("computed", "finished"),'
assert old in source
source = source.replace(
    old,
    '    "detokenize": ("computed", "detokenized"),\\n'
    '    "postprocess": ("detokenized", "finished"),',
)
import gpuscope
spans = types.ModuleType("gpuscope.spans")
spans.__file__ = str(repo / "core" / "spans.py")
sys.modules["gpuscope.spans"] = spans
exec(compile(source, spans.__file__, "exec"), spans.__dict__)
gpuscope.spans = spans
found = {}

import time
from gpuscope.middleware.timeline import MARKS, RequestTimeline
timeline = RequestTimeline()
now = time.perf_counter_ns()
for index in range(1, len(MARKS)):  # every mark, the new one too, 1 ms apart
    timeline.mark_at(index, now + index * 1_000_000)
found["timeline"] = sorted(timeline.phase_seconds())

from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.http.render import render_histograms
from gpuscope.contract.rows import LATENCY_BUCKETS
from support.exporter_fixtures import SpanFactory, encode
aggregator = SpanAggregator()
span = SpanFactory().server(0.05, phases={"detokenize": 0.002, "compute": 0.01})
aggregator.ingest(encode([span]))
text = render_histograms(aggregator.histograms, openmetrics=False)
found["aggregator"] = 'phase="detokenize"' in text

from dashboards import build as boards
rendered = boards.rendered()
found["boards"] = sorted(name for name, board in rendered.items() if "detokenize" in board)
committed = {p.name: p.read_text() for p in (repo / "dashboards" / "json").glob("*.json")}
found["boards_changed"] = sorted(n for n in rendered if rendered[n] != committed[n])

from alerts import build as rules
from pack.settings import Settings
made = rules.rendered(Settings())
found["rules_unchanged"] = all(
    made[name] == (repo / "alerts" / "rules" / name).read_text() for name in made
)

from gpuscope.loadgen.record import PHASE_COLUMNS
found["loadgen"] = "detokenize ms" in PHASE_COLUMNS

spec = importlib.util.spec_from_file_location("docs_spans", repo / "tests/docs/test_docs_spans.py")
docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs)
found["docs"] = []
for name in sorted(vars(docs)):
    if name.startswith("test_") and "phase" in name or name.startswith("test_the_mark"):
        try:
            getattr(docs, name)()
        except AssertionError:
            found["docs"].append(name)
print(json.dumps(found))
"""


def test_a_new_phase_reaches_the_timeline_aggregator_boards_rules_and_loadgen() -> None:
    """One ``PHASE_MARKS`` line (and its new mark): the middleware marks it, the exporter
    counts it, the boards list it, the rules (which group by ``phase``) take it as is,
    the load generator reports it, and the tests of docs/spans.md fail until its rows
    are there."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PHASE_SCRIPT), str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["timeline"] == sorted(["detokenize", *PHASES])
    assert found["aggregator"]
    assert found["boards"] == ["inference-latency.json", "where-did-the-time-go.json"]
    assert found["boards_changed"] == found["boards"]  # make dashboards, then commit
    assert found["rules_unchanged"]
    assert found["loadgen"]
    # docs/spans.md's phase and mark tables lack it: their tests say so
    assert found["docs"] == [
        "test_the_mark_table_is_the_phase_bounds_in_order_plus_first_token",
        "test_the_phase_table_is_the_modules_phase_marks_in_order",
    ]


# --- a request metric ---------------------------------------------------------------

EXTRA_HISTOGRAM = MetricDef(
    "gpuscope_request_extra_seconds",
    MetricType.HISTOGRAM,
    "A request histogram a recipe adds.",
    ("service", "model", "uuid", "gpu"),
    LATENCY_BUCKETS,
)


def test_a_new_request_metric_row_is_created_rendered_and_capped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row in ``SPAN_HISTOGRAMS``: the aggregator creates its family, /metrics writes it
    after the others, the overflow count names it; the observation is the one line the
    recipe leaves to write."""
    monkeypatch.setattr(defs, "SPAN_HISTOGRAMS", (*defs.SPAN_HISTOGRAMS, EXTRA_HISTOGRAM))
    aggregator = SpanAggregator(max_series=1)
    (extra,) = [h for h in aggregator.histograms if h.name == EXTRA_HISTOGRAM.name]
    assert aggregator.histograms[-1] is extra
    extra.observe(("svc", "m", "GPU-1", "0"), 0.01, (b"\x01" * 16, b"\x02" * 8, 1))
    extra.observe(("svc", "m2", "GPU-1", "0"), 0.01, (b"\x01" * 16, b"\x02" * 8, 1))
    text = render_histograms(aggregator.histograms, openmetrics=False)
    families = [f.name for f in text_string_to_metric_families(text)]
    assert families[-1] == EXTRA_HISTOGRAM.name
    registry = CollectorRegistry()
    registry.register(ExporterCollector(aggregator, SelfMetrics()))
    overflow = {"metric": EXTRA_HISTOGRAM.name, "reason": "max_series"}
    assert registry.get_sample_value("gpuscope_series_overflow_total", overflow) == 1.0


EXTRA_COUNTER = MetricDef(
    "gpuscope_request_extras",
    MetricType.COUNTER,
    "A request counter a recipe adds.",
    ("service", "model"),
)


def test_a_new_request_counter_row_is_collected_after_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(defs, "SPAN_COUNTERS", (*defs.SPAN_COUNTERS, EXTRA_COUNTER))
    aggregator = SpanAggregator()
    aggregator.counters[EXTRA_COUNTER].inc(("svc", "m"), 3)
    registry = CollectorRegistry()
    registry.register(ExporterCollector(aggregator, SelfMetrics()))
    names = [family.name for family in registry.collect()]
    assert names.index(EXTRA_COUNTER.name) == len(defs.SPAN_COUNTERS) - 1
    labels = {"service": "svc", "model": "m"}
    assert registry.get_sample_value(EXTRA_COUNTER.sample_name, labels) == 3.0


def test_the_golden_list_and_the_docs_name_every_request_metric() -> None:
    """The two places a new row must also reach, checked by their own tests."""
    golden = (REPO / "tests" / "exporter" / "test_exporter_metric_definitions.py").read_text()
    docs = (REPO / "docs" / "exporter.md").read_text()
    for row in defs.EXPORTER_METRICS:
        assert f'"{row.name}"' in golden, row.name
        assert row.sample_name in docs, row.name


# --- a GPU field metric -------------------------------------------------------------

FAN = MetricDef(
    "gpuscope_gpu_fan_speed_ratio",
    MetricType.GAUGE,
    "Fan speed over its maximum.",
    gpu_rows.GPU_LABELS,
    field="fan_speed_ratio",
)


class _TwoGpus:
    """A source whose first GPU gives the new field and whose second does not."""

    name = "recipe"

    def devices(self) -> Sequence[GpuDevice]:
        return [GpuDevice(0, "GPU-0", "g", "0"), GpuDevice(1, "GPU-1", "g", "1")]

    def sample(self) -> Sequence[GpuReading]:
        return [
            GpuReading(0, "GPU-0", values={"fan_speed_ratio": 0.5, "power_watts": 90.0}),
            GpuReading(1, "GPU-1", values={"power_watts": 80.0}),
        ]

    def close(self) -> None:
        """Nothing to release."""


def test_a_new_gpu_field_metric_is_one_row_plus_the_value_a_source_fills(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``PER_GPU`` row with a ``field``: served from the readings that have it, absent
    for a GPU whose source cannot give it; a value no row names is refused."""
    with pytest.raises(ValueError, match="fan_speed_ratio"):
        GpuReading(0, "GPU-0", values={"fan_speed_ratio": 0.5})
    monkeypatch.setattr(gpu_rows, "PER_GPU", (*gpu_rows.PER_GPU, FAN))
    monkeypatch.setattr(gpu_rows, "GPU_METRICS", (*gpu_rows.GPU_METRICS, FAN))
    poller = GpuPoller(_TwoGpus(), 1.0)
    poller.poll_once()
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    assert registry.get_sample_value(FAN.name, {"gpu": "0", "uuid": "GPU-0"}) == 0.5
    assert registry.get_sample_value(FAN.name, {"gpu": "1", "uuid": "GPU-1"}) is None


def test_every_gpu_field_is_in_one_doctor_group() -> None:
    """The doctor reports on groups; a field row outside every group would go unreported."""
    grouped = [name for names in METRIC_GROUPS.values() for name in names]
    fields = [row.field for row in gpu_rows.PER_GPU]
    assert sorted(set(grouped) & set(fields)) == sorted(fields)
    assert len(grouped) == len(set(grouped))


# --- a GPU source -------------------------------------------------------------------


def test_a_registered_gpu_source_is_what_auto_and_the_doctor_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One ``HardwareSource`` row: ``--gpu-source auto`` and ``gpuscope doctor`` try the
    registry in its order; every hardware kind of ``GpuSourceKind`` has its row."""
    others = {GpuSourceKind.AUTO, GpuSourceKind.NONE, GpuSourceKind.SIMULATED, *factory.RETIRED}
    kinds = [entry.kind for entry in factory.HARDWARE_SOURCES]
    assert sorted(kinds) == sorted(set(GpuSourceKind) - others)
    tried: list[str] = []

    def refuse() -> GpuSource:
        tried.append("first")
        raise OSError("no such engine")

    def simulate() -> GpuSource:
        tried.append("second")
        return SimulatedSource(1)

    registry = (
        # a second hardware kind for the recipe: the retired one's value, un-retired here
        factory.HardwareSource(GpuSourceKind.DCGM, refuse, OSError),
        factory.HardwareSource(GpuSourceKind.NVML, simulate, OSError),
    )
    monkeypatch.setattr(factory, "HARDWARE_SOURCES", registry)
    monkeypatch.setattr(factory, "RETIRED", {})
    opened = open_gpu_source(GpuSourceKind.AUTO, scenario=None, simulated_count=1)
    assert isinstance(opened, SimulatedSource)
    source, errors = doctor._open(doctor.DoctorConfig())
    assert isinstance(source, SimulatedSource)
    assert errors == ["--gpu-source dcgm: no such engine"]
    assert tried == ["first", "second", "first", "second"]


# --- a worker endpoint --------------------------------------------------------------


def test_worker_endpoints_are_served_and_only_untraced_ones_make_no_span(
    span_recorder: SpanRecorder,
) -> None:
    """Every path of ``UNTRACED_PATHS`` is a route of the worker (a stale entry fails)
    and makes no span; a model endpoint makes one."""
    with serve_worker(span_recorder) as url:
        for path in UNTRACED_PATHS:
            assert httpx.get(url + path, timeout=30).status_code == 200, path
        assert span_recorder.server_spans() == []
        assert httpx.get(url + "/v1/models", timeout=30).status_code == 200
        served = span_recorder.wait_for(lambda recorder: bool(recorder.server_spans()))
    assert [span.name for span in served] == ["GET /v1/models"]


# --- an engine adapter --------------------------------------------------------------


class _Recording(Mapping[str, object]):
    """Attributes that remember which keys were asked for (``get`` asks through
    ``__getitem__``)."""

    def __init__(self, values: Mapping[str, object]) -> None:
        self._values = dict(values)
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> object:
        self.asked.add(key)
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def test_an_engine_adapter_declares_every_attribute_it_reads() -> None:
    """The exporter reads an engine span's attributes in one pass over the keys
    ``engine_spans`` declares; a key ``read_engine_span`` reads without declaring it
    would never reach it."""
    declared = {
        *engine_spans.SECONDS_ATTRIBUTES,
        *engine_spans.COUNT_ATTRIBUTES,
        *engine_spans.TEXT_ATTRIBUTES,
    }
    # All zero: any other one value for every duration contradicts itself (stages of
    # 0.02 s in an inference of 0.01 s), which read_engine_span refuses.
    attributes = _Recording({key: 0.0 for key in engine_spans.SECONDS_ATTRIBUTES})
    report = engine_spans.read_engine_span(attributes)
    assert attributes.asked <= declared
    # in gpuscope's vocabulary: the contract's phases and compute stages
    assert set(report.phases) <= set(PHASES)
    assert set(report.stages) <= set(COMPUTE_STAGES)


# --- an engine's own /metrics ------------------------------------------------------

# Run in a fresh interpreter over a copy of the pack with the recipe's edits: one more
# module in ``pack/engines/`` holding the row, and that row in ``ENGINES``
# (``pack/engines/__init__.py``), nothing else edited; then every builder, imported
# after it.
_ENGINE_MODULE = '''
"""FakeLLM's own /metrics: its row of ``ENGINES``."""

from __future__ import annotations

from pack.contract import phase
from pack.engines.base import (
    DURATION_HISTOGRAM,
    END_TO_END,
    ERRORS,
    PHASE_HISTOGRAM,
    PHASE_TIMES,
    Capability,
    Engine,
    EngineTiming,
    Exposition,
    Release,
    histogram_samples,
)

FAKE_ENGINE = Engine(
    source="fakellm",
    name="FakeLLM",
    prefix="fakellm_",
    release=Release("FakeLLM", "1.0", "example/fakellm", "tag v1.0", ("fakellm/metrics.py",)),
    job_selector='job="fakellm"',
    model_label="model_name",
    exposition={
        **histogram_samples("fakellm_e2e_seconds", ("model_name",), ("0.5", "1.0", "5.0")),
        **histogram_samples("fakellm_queue_seconds", ("model_name",), ()),
        "fakellm_requests_total": Exposition("counter", ("model_name", "status")),
        "fakellm_queue_size": Exposition("gauge", ("model_name",)),
    },
    timings=(
        EngineTiming(
            DURATION_HISTOGRAM,
            "",
            ("fakellm_e2e_seconds_sum",),
            "fakellm_e2e_seconds_count",
            bucket="fakellm_e2e_seconds_bucket",
            bounds=("0.5", "1.0", "5.0"),
        ),
        EngineTiming(
            PHASE_HISTOGRAM,
            phase("queue"),
            ("fakellm_queue_seconds_sum",),
            "fakellm_queue_seconds_count",
        ),
    ),
    requests=("fakellm_requests_total",),
    errors=("fakellm_requests_total", 'status="error"'),
    running="",
    waiting="fakellm_queue_size",
    kv_usage="",
    capability=Capability(
        phases=(phase("queue"),),
        stages=(),
        ttft="",
        tpot="",
        batch_size="",
        kv_cache="",
        gpu_join="per host",
        quantiles="request duration",
    ),
    reports=frozenset({PHASE_TIMES, END_TO_END, ERRORS}),
)
'''

_ENGINE_SCRIPT = """
import contextlib, importlib.util, io, json, shutil, sys, tempfile
from pathlib import Path

repo, module = Path(sys.argv[1]), sys.argv[2]
copy = Path(tempfile.mkdtemp())
shutil.copytree(repo / "pack", copy / "pack", ignore=shutil.ignore_patterns("__pycache__"))
package = copy / "pack" / "engines"
(package / "fakellm.py").write_text(module)
init = package / "__init__.py"
source = init.read_text()
old, exports = "\\nENGINES = (", "\\n__all__ = ["
assert source.count(old) == 1 and source.count(exports) == 1
head, tail = source.split(old)
rows, rest = tail.split(")\\n", 1)
source = head + old + rows + ", FAKE_ENGINE)\\n" + rest
source = source.replace(exports, "from pack.engines.fakellm import FAKE_ENGINE\\n" + exports)
init.write_text(source)
sys.path[:0] = [str(copy), str(repo), str(repo / "tests")]
from pack import engines
assert Path(engines.__file__) == init, engines.__file__
fake = engines.FAKE_ENGINE
found = {"sources": list(engines.SOURCES)}

import yaml
from alerts import build as rules
from pack.settings import Settings
made = rules.rendered(Settings())
recording = yaml.safe_load(made["recording.yml"])["groups"]
found["timings"] = sorted(
    rule["record"]
    for group in recording
    if group["name"] == "gpuscope-bottleneck"
    for rule in group["rules"]
    if rule.get("labels", {}).get("source") == "fakellm"
)
engine_rules = yaml.safe_load(made["engines.yml"])["groups"]
found["engine_rules"] = sorted(
    {rule["record"] for g in engine_rules for rule in g["rules"]
     if rule.get("labels", {}).get("source") == "fakellm"}
)
found["release_comment"] = [
    line for line in made["engines.yml"].splitlines() if line.startswith("#") and "FakeLLM" in line
]
alerts = {
    rule["alert"]: rule["expr"]
    for group in yaml.safe_load(made["alerting.yml"])["groups"]
    for rule in group["rules"]
    if "alert" in rule
}
found["down_alert"] = 'up{job="fakellm"} == 0' in alerts["GpuscopeEngineMetricsDown"]
found["spans_alert"] = 'fakellm_requests_total{job="fakellm"}' in alerts["GpuscopeSpansNotArriving"]
found["rules_changed"] = sorted(
    name for name in made if made[name] != (repo / "alerts" / "rules" / name).read_text()
)

with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
    code = rules.main(["--out", out, "--fakellm-job-selector", 'job="llm-x"'])
    text = (Path(out) / "engines.yml").read_text()
    found["flag"] = [code, 'fakellm_requests_total{job="llm-x"}' in text,
                     'fakellm_requests_total{job="fakellm"}' in text]

from dashboards import build as boards
latency = json.loads(boards.rendered()["inference-latency.json"])
variables = {v["name"]: v for v in latency["templating"]["list"]}
found["variables"] = sorted(
    name for name in ("job", "instance")
    if "fakellm_requests_total" in json.dumps(variables[name])
    and "fakellm_queue_size" in json.dumps(variables[name])
)
panels = [p for row in latency["panels"] for p in [row, *row.get("panels", [])]]
note = next(p["options"]["content"] for p in panels if p["type"] == "text")
found["note"] = [line for line in note.splitlines() if "fakellm" in line or "FakeLLM" in line]
found["not_reported"] = sorted(
    p["title"] for p in panels
    if "fakellm" in p.get("fieldConfig", {}).get("defaults", {}).get("noValue", "")
)

def missing(test_file, test, *args):
    spec = importlib.util.spec_from_file_location("held", repo / test_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        getattr(module, test)(*args)
    except (AssertionError, FileNotFoundError, KeyError) as error:
        return str(error)
    return ""

found["promtool"] = missing(
    "tests/alerts/test_alerts_engines.py",
    "test_promtool_inputs_are_shaped_like_the_engines_exposition",
    fake,
)
found["page"] = missing(
    "tests/docs/test_docs_engines.py",
    "test_each_engine_page_names_its_release_and_source_files",
    fake,
)
shutil.rmtree(copy)
print(json.dumps(found))
"""


def test_a_new_engine_is_one_row_its_promtool_cases_and_a_doc_page() -> None:
    """One ``Engine`` row in a module of its own, added to ``ENGINES``, nothing else
    edited: its job selector and ``--<source>-job-selector`` flag, its rules (timings at
    the head of the bottleneck group, requests, errors, objectives and state in
    engines.yml), the "engine metrics down" and "spans not arriving" alerts, the latency
    board's job and instance variables and its notes all take it; the engine tests ask
    for the rest of the recipe, its promtool cases and its page."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_ENGINE_SCRIPT), str(REPO), _ENGINE_MODULE],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["sources"][-1] == "fakellm"
    settings = Settings()
    window = settings.window
    assert found["timings"] == sorted(
        rate_record(histogram, part) + window
        for histogram, parts in (
            (DURATION_HISTOGRAM, ("sum", "count", "bucket")),
            (PHASE_HISTOGRAM, ("sum", "count")),
        )
        for part in parts
    )
    # requests, errors, the latency objective (1 s is one of its bounds), its queue
    assert set(found["engine_rules"]) >= {
        REQUESTS_RATE + window,
        ERRORS_RATIO + window,
        slo_errors_ratio(settings.latency_slo) + "1h",
        WAITING + window,
    }, found["engine_rules"]
    assert found["release_comment"][0].endswith(
        "TensorRT-LLM's and FakeLLM's series as their own source defines them:"
    )
    assert "FakeLLM 1.0" in found["release_comment"][1]
    assert found["down_alert"] and found["spans_alert"]
    assert found["rules_changed"] == ["alerting.yml", "engines.yml", "recording.yml"]
    assert found["flag"] == [0, True, False]
    assert found["variables"] == ["instance", "job"]
    assert any(line.startswith("- FakeLLM 1.0 (/metrics): queue") for line in found["note"])
    assert any(line.startswith("- `fakellm`: phase times") for line in found["note"])
    assert found["not_reported"]  # e.g. TTFT: "Not reported by this engine (..., fakellm)"
    # the rest of the recipe: the tests name what is missing
    assert "fakellm_test.yml" in found["promtool"]
    assert "fakellm.md" in found["page"]


def test_the_engine_recipe_is_one_row_its_cases_and_a_page() -> None:
    """The recipe asks for the row, its promtool cases and its page, and nothing the
    rows give (a selector field, a flag, an alert)."""
    text = recipe("An engine's own /metrics")
    needed_parts = (
        "`pack/engines/<source>.py`",
        "`ENGINES`",
        "alerts/tests/<source>_test.yml",
        "docs/engines/",
    )
    for needed in needed_parts:
        assert needed in text, needed
    for derived in ("EngineJobs", "vllm_job_selector"):
        assert derived not in text, derived


# --- a flag -------------------------------------------------------------------------


@dataclass(frozen=True)
class _WorkerWithAFlag(WorkerConfig):
    warm_up_s: float = option(2.0, help="time spent warming the models up", check=positive)


@dataclass(frozen=True)
class _WorkerWithAUnitlessTime(WorkerConfig):
    warm_up_delay: float = option(2.0, help="time spent warming the models up")


def test_a_new_flag_is_one_field_with_its_help_twin_and_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One field with its option: the flag, its twin, --help, the check (from flags and
    in code) and a child's command line follow; the naming lint finds a time without its unit."""
    text = " ".join(flags.build_parser(_WorkerWithAFlag).format_help().split())
    assert (
        "--warm-up-s SECONDS time spent warming the models up [GPUSCOPE_WARM_UP_S] "
        "(default 2.0 s)" in text
    )

    def parse(argv: list[str], environ: dict[str, str]) -> _WorkerWithAFlag:
        return flags.parse(_WorkerWithAFlag, argv, environ, exit_on_error=False)

    assert parse(["--warm-up-s", "3"], {}).warm_up_s == 3.0
    assert parse([], {"GPUSCOPE_WARM_UP_S": "4"}).warm_up_s == 4.0
    with pytest.raises(ConfigError, match=r"^--warm-up-s: must be greater than 0, got 0.0$"):
        parse(["--warm-up-s", "0"], {})
    with pytest.raises(ConfigError, match=r"^--warm-up-s: "):
        _WorkerWithAFlag(warm_up_s=-1)
    argv = flags.to_argv(_WorkerWithAFlag, warm_up_s=5.0)
    assert argv == ["--warm-up-s", "5.0"] and parse(argv, {}).warm_up_s == 5.0
    with pytest.raises(SystemExit):  # the command's own parse: one line, status 2
        flags.parse(_WorkerWithAFlag, ["--warm-up-s", "soon"], {})
    assert capsys.readouterr().err == (
        "gpuscope worker: --warm-up-s: cannot read 'soon' as float (see 'gpuscope worker --help')\n"
    )
    assert flags.naming_problems(_WorkerWithAUnitlessTime) == [
        "_WorkerWithAUnitlessTime.warm_up_delay: --warm-up-delay holds a time; "
        "name its unit (_s or _ms)"
    ]


_TESTS = {
    "A phase": test_a_new_phase_reaches_the_timeline_aggregator_boards_rules_and_loadgen.__name__,
    "A request metric": test_a_new_request_metric_row_is_created_rendered_and_capped.__name__,
    "A GPU field metric": (
        test_a_new_gpu_field_metric_is_one_row_plus_the_value_a_source_fills.__name__
    ),
    "A GPU source": test_a_registered_gpu_source_is_what_auto_and_the_doctor_open.__name__,
    "A worker endpoint": (
        test_worker_endpoints_are_served_and_only_untraced_ones_make_no_span.__name__
    ),
    "An engine adapter": test_an_engine_adapter_declares_every_attribute_it_reads.__name__,
    "An engine's own /metrics": (
        test_a_new_engine_is_one_row_its_promtool_cases_and_a_doc_page.__name__
    ),
    "A flag": test_a_new_flag_is_one_field_with_its_help_twin_and_check.__name__,
}
