"""The contract (``gpuscope.contract``, with ``gpuscope.spans``) is a leaf, and the only
place a ``gpuscope_*`` metric name, one of gpuscope's HTTP paths or its default port is
written: the other code reads them from it, so a rename there is a rename everywhere."""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuscope.contract import exporter as exporter_rows
from gpuscope.contract import gpu as gpu_rows
from gpuscope.contract import http as http_paths
from gpuscope.contract import labels as L
from gpuscope.contract import worker as worker_rows
from gpuscope.contract.rows import MetricDef, label_order, label_values
from gpuscope.exporter.http.render import render_histograms
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.worker.config import BatchingMode
from gpuscope.worker.kv_cache import KvStats
from gpuscope.worker.metrics import WorkerCollector
from gpuscope.worker.scheduler import BatchPolicy, Counters
from support.exporter_fixtures import SpanFactory, encode

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "core" / "contract"
# The contract's modules: the package, and the span contract beside it.
CONTRACT_FILES = (*sorted(CONTRACT.glob("*.py")), REPO / "core" / "spans.py")
CONTRACT_MODULES = {"gpuscope.spans", "gpuscope.contract"}

# --- a leaf -------------------------------------------------------------------------


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}:{node.lineno}: a relative import"
            assert node.module is not None
            yield node.lineno, node.module


def _allowed(module: str) -> bool:
    top = module.split(".")[0]
    if module == "gpuscope" or top != "gpuscope":
        return top in sys.stdlib_module_names or top == "__future__"
    return any(module == m or module.startswith(m + ".") for m in CONTRACT_MODULES)


@pytest.mark.parametrize("path", CONTRACT_FILES, ids=lambda p: p.name)
def test_a_contract_module_imports_only_the_standard_library_and_the_contract(
    path: Path,
) -> None:
    bad = [f"{path.name}:{line}: {module}" for line, module in _imports(path)]
    bad = [entry for entry in bad if not _allowed(entry.rsplit(" ", 1)[1])]
    assert not bad, f"the contract must stay a leaf: {bad}"


def test_the_contract_package_imports_nothing_of_its_own() -> None:
    """The middleware imports ``gpuscope.contract.http`` on its hot path: importing it
    must not bring the rows along."""
    assert list(_imports(CONTRACT / "__init__.py")) == []


def test_the_walk_sees_a_forbidden_import() -> None:
    assert not _allowed("prometheus_client")
    assert not _allowed("gpuscope.exporter.ingest.series")
    assert not _allowed("gpuscope")
    assert _allowed("gpuscope.contract.rows") and _allowed("dataclasses")


# --- nothing written twice ----------------------------------------------------------

# A metric name (not the middle of a recorded series' name, which has colons, nor a
# prefix followed by a wildcard), a path where it is one (the whole string, or after a
# host, a port or an f-string's field; not a path mentioned in prose), the port.
METRIC_NAME = re.compile(r"(?<![\w:])gpuscope_[a-z0-9_]*[a-z0-9](?![\w:])")
HTTP_PATH = re.compile(
    r"(?:^|(?<=[\w}\]]))(?:/metrics|/healthz|/readyz|/v1/traces)(?=$|[\s,?#\"')\]])"
)
PORT = re.compile(r"(?<!\d)9420(?!\d)")

# Folders not walked: tests pin names, paths and the port as literals on purpose (a
# test that read them from the contract would pass whatever the contract said), and
# their fixtures are recorded expositions; the rest are not the project's code.
NOT_WALKED = {"tests", "build", "docs", "node_modules"}

# (file, literal) -> why it stays. Each must still occur (a stale entry fails).
ALLOWED: dict[tuple[str, str], str] = {
    ("core/connections.py", "gpuscope_connection"): "a ContextVar's name, not a metric",
    ("middleware/timeline.py", "gpuscope_timeline"): "a ContextVar's name, not a metric",
    ("exporter/http/auth.py", "gpuscope_authenticated"): "an aiohttp RequestKey's name",
    ("exporter/http/auth.py", "gpuscope_exporter_auth"): "an aiohttp AppKey's name",
    ("exporter/state.py", "gpuscope_exporter_state"): "an aiohttp AppKey's name",
    # Series the pack's rules record from the engines' own token histograms: no gpuscope
    # process serves them, so they have no row; pack/engines/ is the pack's table.
    ("pack/engines/base.py", "gpuscope_request_prompt_tokens"): (
        "recorded by the pack, not served"
    ),
    ("pack/engines/base.py", "gpuscope_request_generation_tokens"): (
        "recorded by the pack, not served"
    ),
    ("scripts/engines/ray_serve_app.py", "/healthz"): "the example Ray app's own route",
}


def _project_files() -> Iterator[Path]:
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if parts[0] in NOT_WALKED or any(part.startswith(".") for part in parts):
            continue
        if path.parent == CONTRACT:
            continue
        yield path


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def literals(path: Path) -> Iterator[tuple[int, str]]:
    """(line, what) of each metric name, path or port written in ``path``'s code
    (docstrings are documentation, comments are not code)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in docstrings:
            continue
        value = node.value
        if isinstance(value, str):
            for pattern in (METRIC_NAME, HTTP_PATH, PORT):
                yield from ((node.lineno, m.group(0)) for m in pattern.finditer(value))
        elif isinstance(value, int) and not isinstance(value, bool) and value == 9420:
            yield node.lineno, str(value)


def test_no_metric_name_path_or_port_is_written_outside_the_contract() -> None:
    found, used = [], set()
    walked = 0
    for path in _project_files():
        walked += 1
        relative = path.relative_to(REPO).as_posix()
        for line, what in literals(path):
            if (relative, what) in ALLOWED:
                used.add((relative, what))
            else:
                found.append(f"{relative}:{line}: {what}")
    assert walked > 150  # the walk found the project
    assert not found, (
        "written as a string outside gpuscope.contract (read it from the contract's rows, "
        "labels or http module, or allow it in ALLOWED with a reason): " + ", ".join(found)
    )
    assert not set(ALLOWED) - used, f"stale ALLOWED entries: {sorted(set(ALLOWED) - used)}"


@pytest.mark.parametrize(
    ("code", "caught"),
    [
        ('X = "gpuscope_gpu_power_watts"', ["gpuscope_gpu_power_watts"]),
        ('X = f"{u}/metrics"', ["/metrics"]),
        ('X = "http://127.0.0.1:9420/v1/traces"', ["/v1/traces", "9420"]),
        ("X = 9420", ["9420"]),
        ('X = "rate(gpuscope_tokens_total[5m])"', ["gpuscope_tokens_total"]),
        ('X = "service_model:gpuscope_requests:rate"', []),  # a recorded series
        ('X = "the gpuscope_gpu_* series"', []),
        ('X = "scrape /metrics now"', []),  # prose
        ('X = "src/metrics.cc"', []),
        ('"""gpuscope_gpu_up on /metrics at :9420"""', []),  # a docstring
    ],
)
def test_the_walk_catches_what_it_should(tmp_path: Path, code: str, caught: list[str]) -> None:
    path = tmp_path / "module.py"
    path.write_text(code + "\n")
    assert sorted(what for _, what in literals(path)) == sorted(caught)


def test_the_paths_and_port_are_what_the_servers_answer_on() -> None:
    assert http_paths.DEFAULT_TRACES_URL == "http://127.0.0.1:9420/v1/traces"
    assert http_paths.PROBE_PATHS == ("/healthz", "/readyz")
    assert http_paths.METRICS_PATH == "/metrics"


# --- label names inside the pack's PromQL --------------------------------------------

# The label names the contract owns: those its rows carry (not ``labels``' values, such
# as ``direction``'s input and output). The rows are every MetricDef of the contract.
OWNED_LABELS = frozenset(
    name
    for module in (exporter_rows, gpu_rows, worker_rows)
    for row in vars(module).values()
    if isinstance(row, MetricDef)
    for name in row.labels
)
# The pack's builders: what writes PromQL (rules, boards, manifests).
PACK_CODE = ("pack", "alerts", "dashboards", "deploy")
# A placeholder for an f-string's replacement field: never part of a label name.
FIELD = "\x00"
# Where PromQL names a label: a grouping or a vector match's list (up to its ``)``, or to
# the end of a string that a later one closes); a matcher (``{gpu="0"}``, and a Go
# template's printf ``uuid=%q``); a quoted name, as label_replace / label_join /
# count_values take them (a matcher's value excepted: it follows ``=`` or ``~``).
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)(?:\)|$)")
MATCHER = re.compile(r"(?:^|(?<=[{,\s]))([A-Za-z_]\w*)\s*(?:=~|!~|!=|=(?!=))\s*[\"'%\x00]")
QUOTED = re.compile(r"(?<![=~])(?<![=~]\s)([\"'])([A-Za-z_]\w*)\1")

# (file, label) -> why it stays. A file ``pack/engines.py`` stands for the package
# ``pack/engines/`` too. Each must still occur (a stale entry fails).
PROMQL_ALLOWED: dict[tuple[str, str], str] = {
    ("pack/engines.py", "reason"): "Triton's own label of nv_inference_request_failure",
    ("alerts/pod_join.py", "pod"): "dcgm-exporter's holder pod on its GPU series",
    ("dashboards/board_latency.py", "reason"): (
        "the finish reason the rules record from the engines' (alerts/recording.py), "
        "not the exporter's rejection or clock-event reason"
    ),
    ("dashboards/serving.py", "state"): (
        "running or waiting, written by the query for its own legend; not the "
        "exporter's connection state"
    ),
}


def _pack_files() -> Iterator[Path]:
    for folder in PACK_CODE:
        yield from sorted(p for p in (REPO / folder).rglob("*.py") if "tests" not in p.parts)


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of each string of ``tree``'s code, an f-string whole with ``FIELD``
    for each replacement field (its parts are not strings of their own)."""
    docstrings = _docstrings(tree)
    parts: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts.update(id(inner) for inner in ast.walk(node) if inner is not node)
    for node in ast.walk(tree):
        if id(node) in parts or id(node) in docstrings:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                str(v.value) if isinstance(v, ast.Constant) else FIELD for v in node.values
            )
            yield node.lineno, text


def promql_labels(path: Path) -> Iterator[tuple[int, str]]:
    """(line, label) of each label name the contract owns written into PromQL in
    ``path``'s strings (rather than read from ``pack.contract``)."""
    for line, text in _strings(ast.parse(path.read_text(encoding="utf-8"))):
        names = [n.strip() for m in GROUPING.finditer(text) for n in m.group(1).split(",")]
        names += [m.group(1) for m in MATCHER.finditer(text)]
        names += [m.group(2) for m in QUOTED.finditer(text)]
        yield from ((line, name) for name in names if name in OWNED_LABELS)


def _allowed_key(relative: str, label: str) -> tuple[str, str]:
    parts = relative.split("/")
    if parts[:2] == ["pack", "engines"] and len(parts) > 2:
        return "pack/engines.py", label
    return relative, label


def test_no_label_name_of_the_contract_is_written_into_the_packs_promql() -> None:
    found, used = [], set()
    walked = 0
    for path in _pack_files():
        walked += 1
        relative = path.relative_to(REPO).as_posix()
        for line, label in promql_labels(path):
            key = _allowed_key(relative, label)
            if key in PROMQL_ALLOWED:
                used.add(key)
            else:
                found.append(f"{relative}:{line}: {label}")
    assert walked > 25  # the walk found the builders
    assert not found, (
        "a label name of gpuscope.contract written into PromQL (read it from pack.contract, "
        "or allow it in PROMQL_ALLOWED with a reason): " + ", ".join(found)
    )
    stale = set(PROMQL_ALLOWED) - used
    assert not stale, f"stale PROMQL_ALLOWED entries: {sorted(stale)}"


def test_the_contract_owns_the_labels_its_rows_carry() -> None:
    assert {L.GPU, L.UUID, L.MODEL, L.PHASE, L.ENDPOINT, L.STATUS_CODE} <= OWNED_LABELS
    # values of a label, and other systems' labels, are not the contract's
    assert not {L.INPUT, L.OUTPUT, "le", "instance", "job", "UUID", "model_name"} & OWNED_LABELS


@pytest.mark.parametrize(
    ("code", "caught"),
    [
        ('X = "sum by (phase, model) (rate(x[5m]))"', ["phase", "model"]),
        ('X = f"max by ({K}, uuid, name) ({e})"', ["uuid", "name"]),
        ('X = f"sum by (job, instance, " + f"{R}, model) (x)"', []),  # split by +: unseen
        ('X = f"a\\n* on (job, instance) group_left (model)\\n{b}"', ["model"]),
        ('X = f"x{{gpu=\\"{g}\\", uuid=~\\"a.*\\"}}"', ["gpu", "uuid"]),
        ("X = 'model!=\"\"'", ["model"]),
        ("X = '{{instance=%q, uuid=%q}}'", ["uuid"]),
        ('X = f\'label_replace({e}, "uuid", "$1", "UUID", "(.+)")\'', ["uuid"]),
        ('X = f\'label_replace({e}, "{UUID}", "$1", "UUID", "(.+)")\'', []),
        ('X = \'x{phase="queue", direction="input"}\'', ["phase", "direction"]),
        ('X = "sum by (le, job, host, model_name) (x)"', []),  # not the contract's
        ('X = f"sum by ({SMG}) (x) == 1"', []),
        ('"""sum by (model) (x)"""', []),  # a docstring
    ],
)
def test_the_promql_walk_catches_what_it_should(
    tmp_path: Path, code: str, caught: list[str]
) -> None:
    path = tmp_path / "module.py"
    path.write_text(code + "\n")
    assert sorted(label for _, label in promql_labels(path)) == sorted(caught)


# --- label tuples by name -----------------------------------------------------------

ROW = MetricDef("gpuscope_x", exporter_rows.REQUEST_DURATION.type, "x", ("b", "a", "c"))


def test_label_values_and_label_order_put_values_in_the_rows_order() -> None:
    assert label_values(ROW, {"a": "1", "b": "2", "c": "3", "d": "4"}) == ("2", "1", "3")
    assert label_order(ROW, ("a", "b", "c"))(("1", "2", "3")) == ("2", "1", "3")
    one = MetricDef("gpuscope_y", ROW.type, "y", ("a",))
    assert label_order(one, ("a",))(("1",)) == ("1",)
    same = ("2", "1", "3")
    assert label_order(ROW, ROW.labels)(same) is same


def test_a_label_the_row_lacks_or_misses_is_named() -> None:
    with pytest.raises(LookupError, match="'c'"):
        label_values(ROW, {"a": "1", "b": "2"})
    with pytest.raises(LookupError, match="gpuscope_x"):
        label_order(ROW, ("a", "b"))
    with pytest.raises(LookupError, match="gpuscope_x"):
        label_order(ROW, ("a", "b", "d"))


def test_the_aggregator_keys_a_reordered_row_by_label_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row whose labels change order: the aggregator's series follow, by name."""
    duration = exporter_rows.REQUEST_DURATION
    reordered = dataclasses.replace(duration, labels=tuple(reversed(duration.labels)))
    histograms = [reordered if r is duration else r for r in exporter_rows.SPAN_HISTOGRAMS]
    monkeypatch.setattr(exporter_rows, "REQUEST_DURATION", reordered)
    monkeypatch.setattr(exporter_rows, "SPAN_HISTOGRAMS", tuple(histograms))
    aggregator = SpanAggregator()
    aggregator.ingest(encode([SpanFactory().server(0.05, route="/v1/chat", code=201)]))
    text = render_histograms(aggregator.histograms, openmetrics=False)
    count = next(line for line in text.splitlines() if line.startswith(duration.name + "_count"))
    pairs = re.findall(r'(\w+)="([^"]*)"', count)
    # the pod's labels left out: the span names its GPU (and its resource no pod)
    assert [name for name, _ in pairs] == [n for n in reordered.labels if n not in L.OMIT_EMPTY]
    values = dict(pairs)
    assert (values[L.CODE], values[L.ROUTE]) == ("201", "/v1/chat")
    assert (values[L.MODEL], values[L.UUID]) == ("m1", "GPU-aaaa")


# --- the worker serves its rows -----------------------------------------------------


class _Scheduler:
    queued = running = 0
    counters = Counters()


def test_the_worker_serves_its_rows_in_their_order() -> None:
    registry = CollectorRegistry()
    kv = KvStats(
        blocks_used=0, blocks_total=1, preemptions_total=0, iterations_total=0, running=0, waiting=0
    )
    policy = BatchPolicy(BatchingMode.CONTINUOUS, 4, 0.001, 8)
    collector = WorkerCollector(
        {"completions": _Scheduler()},
        policy,
        model_name="m",
        kv_stats=("completions", lambda: kv),
        telemetry=dict,
    )
    registry.register(collector)
    served = [(family.name, family.type, family.documentation) for family in registry.collect()]
    rows = [row for row in worker_rows.WORKER_METRICS if row not in worker_rows.CONNECTION_METRICS]
    assert served == [(row.name, str(row.type), row.help) for row in rows]
    info = next(f for f in registry.collect() if f.name == worker_rows.INFO.name)
    assert info.samples[0].labels == {L.MODEL: "m", L.BATCHING: "continuous"}
