"""The dcgm-exporter rules against the release's counters files and the fixtures: every
field the rules read is in dcgm-exporter's default file or in the lines the docs give,
and the committed expositions are what ``render.py`` writes."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import yaml

from alerts import dcgm_rules

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "dcgm-exporter-4.5.3-4.8.2"


def fields_of(path: Path) -> set[str]:
    """The fields a counters file enables (comment lines start with #)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return {line.split(",")[0].strip() for line in lines if line.strip() and line[0] != "#"}


def test_every_field_the_rules_read_is_default_or_a_documented_counters_line() -> None:
    rules = (REPO / "alerts" / "rules" / "dcgm-exporter.yml").read_text(encoding="utf-8")
    read = set(re.findall(r"\b(DCGM_FI_(?:DEV|PROF)_[A-Z0-9_]+)\{", rules))
    default = fields_of(FIXTURES / "default-counters.csv")
    added = {line.split(",")[0] for line in dcgm_rules.counters_lines()}
    assert read - default == added, "a field neither default nor in counters_lines()"
    assert added.isdisjoint(default)
    # the fixture's counters file is the default one plus exactly those lines, as written
    ours = (FIXTURES / "gpuscope-counters.csv").read_text(encoding="utf-8")
    written = {re.sub(r",\s+", ", ", line.strip()) for line in ours.splitlines()}
    assert set(dcgm_rules.counters_lines()) <= written
    assert fields_of(FIXTURES / "gpuscope-counters.csv") == default | added
    # and the docs give every line
    docs = (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")
    documented = {re.sub(r",\s+", ", ", line.strip()) for line in docs.splitlines()}
    assert set(dcgm_rules.counters_lines()) <= documented


def test_the_committed_expositions_are_what_render_writes() -> None:
    spec = importlib.util.spec_from_file_location("dcgm_render", FIXTURES / "render.py")
    assert spec is not None and spec.loader is not None
    render = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules
    sys.modules[spec.name] = render
    try:
        spec.loader.exec_module(render)
    finally:
        del sys.modules[spec.name]
    default = render.read_counters(FIXTURES / "default-counters.csv")
    ours = render.read_counters(FIXTURES / "gpuscope-counters.csv")
    both = {**render.DEFAULTS, **render.EXTRA}
    expected = {
        "default.prom": render.render(default, render.node(render.DEFAULTS)),
        "counters.prom": render.render(ours, render.node(both)),
        "mig.prom": render.render(ours, render.mig()),
    }
    for name, text in expected.items():
        assert (FIXTURES / name).read_text(encoding="utf-8") == text, name


def test_the_promtool_cases_read_the_fixtures_samples_as_served() -> None:
    """Each input series of the promtool cases is a sample line of a fixture (its labels
    in the exposition's order) with the job and instance a scrape adds; the Hostname /
    hostname case renames those two labels only."""
    lines: set[str] = set()
    for name in ("default.prom", "counters.prom", "mig.prom"):
        for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                lines.add(line.rsplit(" ", 1)[0])
    cases = yaml.safe_load((REPO / "alerts" / "tests" / "dcgm_exporter_test.yml").read_text())
    renamed = {"uuid=": "UUID=", "hostname=": "Hostname="}
    for test in cases["tests"]:
        for entry in test["input_series"]:
            metric, labels = entry["series"].split("{", 1)
            parts = [p.strip() for p in labels.rstrip("}").split(", ")]
            assert parts[0].startswith("job=") and parts[1].startswith("instance=")
            served = []
            for part in parts[2:]:
                for new, old in renamed.items():
                    if part.startswith(new):
                        part = old + part.removeprefix(new)
                served.append(part)
            sample = metric + "{" + ",".join(served) + "}"
            if metric == "DCGM_FI_DEV_XID_ERRORS" and sample not in lines:
                # the XID case's codes on GPU 0 (0, 79, 43; the fixtures hold GPU 0's 0)
                sample = re.sub(
                    r'err_code="[0-9]+",err_msg="[^"]*"', 'err_code="0",err_msg="No Error"', sample
                )
            assert sample in lines, entry["series"]
