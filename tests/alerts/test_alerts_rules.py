"""The committed rule files: generated from alerts/build.py, valid, unit-tested by promtool."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pack.settings import RUNBOOK_PATH, RUNBOOK_URL_VARIABLE
from support.binaries import require_binary

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REPO = Path(__file__).parents[2]
ALERTS = REPO / "alerts"
RULES = sorted((ALERTS / "rules").glob("*.yml"))
UNIT_TESTS = sorted((ALERTS / "tests").glob("*_test.yml"))
CAUSES = {"queue", "batch_wait", "compute", "underfed", "throttled", "pcie", "none"}


def build_rules(out: Path, *args: str, runbook_url: str | None = None) -> None:
    """Run alerts/build.py as a user would (with GPUSCOPE_RUNBOOK_URL only when given)."""
    command = [sys.executable, str(ALERTS / "build.py"), "--out", str(out), *args]
    env = {k: v for k, v in os.environ.items() if k != RUNBOOK_URL_VARIABLE}
    if runbook_url is not None:
        env[RUNBOOK_URL_VARIABLE] = runbook_url
    subprocess.run(command, check=True, capture_output=True, env=env)


def rules_of(path: Path) -> list[dict[str, Any]]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return rules_of(ALERTS / "rules" / "alerting.yml")


def test_committed_rules_regenerate_byte_identically(tmp_path: Path) -> None:
    build_rules(tmp_path)
    generated = sorted(p.name for p in tmp_path.iterdir())
    assert generated == [p.name for p in RULES]
    assert "engines.yml" in generated  # Triton's, TGI's and SGLang's (engine_rules.py)
    for path in RULES:
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), (
            f"{path} is stale: run 'make rules'"
        )


def test_check_mode_reports_stale_rules(tmp_path: Path) -> None:
    build_rules(tmp_path)
    check = [sys.executable, str(ALERTS / "build.py"), "--check", "--out", str(tmp_path)]
    assert subprocess.run(check, capture_output=True, check=False).returncode == 0
    (tmp_path / "alerting.yml").write_text("groups: []\n")
    result = subprocess.run(check, capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert "alerting.yml" in result.stderr
    assert "recording.yml" not in result.stderr


def test_overrides_change_interval_and_every_for(tmp_path: Path) -> None:
    build_rules(tmp_path, "--interval", "1s", "--for", "2s")
    groups = yaml.safe_load((tmp_path / "alerting.yml").read_text())["groups"]
    assert {group["interval"] for group in groups} == {"1s"}
    assert {rule["for"] for group in groups for rule in group["rules"]} == {"2s"}


@pytest.mark.parametrize("window", ["5m", "10s", "10m"])
def test_every_recorded_series_an_alert_uses_is_recorded(tmp_path: Path, window: str) -> None:
    """An alert on a series no rule records never fires, whatever the window."""
    build_rules(tmp_path, "--window", window)
    recorded = {rule["record"] for rule in rules_of(tmp_path / "recording.yml")}
    for rule in rules_of(tmp_path / "alerting.yml"):
        used = set(re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", rule["expr"]))
        assert used <= recorded, f"{rule['alert']} uses unrecorded {used - recorded}"


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.name)
def test_promtool_accepts_the_rule_file(path: Path) -> None:
    promtool = require_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def promtool_shards(path: Path, count: int, out: Path) -> list[Path]:
    """``path``'s tests dealt round-robin into up to ``count`` files under ``out``, each
    with ``path``'s settings (its rule files as absolute paths) and each test's text as
    written; ``[path]`` itself where its tests are not one top-level list to deal out.
    ``promtool test rules`` runs a file's tests one after the other on one core: the
    shards run side by side (alerting_test.yml alone took 41 s of a 2-core run)."""
    text = path.read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    _, found, body = text.partition("\ntests:\n")
    blocks = re.split(r"(?m)^(?=- )", body)
    tests = document["tests"]
    count = min(count, len(tests))
    if not found or blocks[0] or len(blocks) - 1 != len(tests) or count < 2:
        return [path]
    settings = {key: value for key, value in document.items() if key != "tests"}
    settings["rule_files"] = [str((path.parent / f).resolve()) for f in settings["rule_files"]]
    head = yaml.safe_dump(settings, sort_keys=False)
    shards = []
    for index in range(count):
        shard = out / f"{path.stem}.{index}.yml"
        shard.write_text(head + "tests:\n" + "".join(blocks[1 + index :: count]), encoding="utf-8")
        shards.append(shard)
    # every test of the file is in exactly one shard, as the file wrote it
    dealt = [test for shard in shards for test in yaml.safe_load(shard.read_text())["tests"]]
    assert sorted(map(repr, dealt)) == sorted(map(repr, tests)), path.name
    return shards


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(path: Path, tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    shards = promtool_shards(path, os.cpu_count() or 1, tmp_path)
    running = [
        subprocess.Popen(
            [promtool, "test", "rules", shard.name],
            cwd=shard.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for shard in shards
    ]
    for shard, process in zip(shards, running, strict=True):
        stdout, stderr = process.communicate()
        assert process.returncode == 0, f"{shard.name}: {stdout}{stderr}"


def test_the_promtool_shards_hold_every_test_once(tmp_path: Path) -> None:
    """The sharded run of test_promtool_unit_tests_pass runs what promtool would run
    over the whole file: every test, once, with the file's rules and interval."""
    path = ALERTS / "tests" / "alerting_test.yml"
    shards = promtool_shards(path, 2, tmp_path)
    assert len(shards) == 2
    whole = yaml.safe_load(path.read_text())
    for shard in shards:
        part = yaml.safe_load(shard.read_text())
        assert part["evaluation_interval"] == whole["evaluation_interval"]
        assert [Path(f) for f in part["rule_files"]] == [
            (path.parent / f).resolve() for f in whole["rule_files"]
        ]
    names = [t["name"] for shard in shards for t in yaml.safe_load(shard.read_text())["tests"]]
    assert sorted(names) == sorted(t["name"] for t in whole["tests"])


def test_alerts_have_the_mixin_shape() -> None:
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)) >= 18
    for rule in alerts():
        name, annotations = rule["alert"], rule["annotations"]
        assert re.fullmatch(r"Gpuscope[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert annotations["summary"].endswith(".") and "{{" not in annotations["summary"]
        assert "{{" in annotations["description"], name
        assert annotations["runbook_url"].endswith("runbook.md#" + name.lower()), name
    for rule in rules_of(ALERTS / "rules" / "recording.yml"):
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def _checks() -> list[dict[str, Any]]:
    document = yaml.safe_load((ALERTS / "tests" / "alerting_test.yml").read_text())
    return [check for test in document["tests"] for check in test["alert_rule_test"]]


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    firing = {c["alertname"] for c in _checks() if c["exp_alerts"]}
    quiet = {c["alertname"] for c in _checks() if not c["exp_alerts"]}
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown not firing (yet)"


def test_every_verdict_cause_is_produced_by_a_case() -> None:
    document = yaml.safe_load((ALERTS / "tests" / "verdict_test.yml").read_text())
    produced = {
        match
        for test in document["tests"]
        for check in test["promql_expr_test"]
        for sample in check["exp_samples"]
        for match in re.findall(r'cause="(\w+)"', sample["labels"])
    }
    assert produced == CAUSES


def test_every_runbook_url_opens_its_section_of_the_shipped_runbook() -> None:
    # by default the links name the runbook beside the rules, not a host nobody owns
    sections = {
        heading.lower()
        for heading in re.findall(r"^## (\w+)$", (ALERTS / "runbook.md").read_text(), re.M)
    }
    for path in RULES:
        for rule in rules_of(path):
            if "alert" not in rule:
                continue
            url = rule["annotations"]["runbook_url"]
            file, _, section = url.partition("#")
            assert file == RUNBOOK_PATH and (REPO / file).is_file(), url
            assert section == rule["alert"].lower() and section in sections, url


def test_the_runbook_url_is_a_setting_of_the_build(tmp_path: Path) -> None:
    def urls(folder: Path) -> set[str]:
        found = {r["annotations"]["runbook_url"] for r in rules_of(folder / "alerting.yml")}
        return {url.partition("#")[0] for url in found}

    mine = "https://git.example.com/ops/gpuscope/blob/v1/alerts/runbook.md"
    build_rules(tmp_path / "env", runbook_url=mine)
    assert urls(tmp_path / "env") == {mine}
    other = "https://wiki.example.com/gpuscope/runbook.md"
    build_rules(tmp_path / "flag", "--runbook-url", other, runbook_url=mine)  # the flag wins
    assert urls(tmp_path / "flag") == {other}
    build_rules(tmp_path / "old", "--runbook", other)  # the former spelling still works
    assert urls(tmp_path / "old") == {other}
    build_rules(tmp_path / "empty", runbook_url="")  # set but empty: the default
    assert urls(tmp_path / "empty") == {RUNBOOK_PATH}


def test_the_runbook_has_a_section_per_alert() -> None:
    headings = re.findall(r"^## (\w+)$", (ALERTS / "runbook.md").read_text(), re.M)
    assert sorted(headings) == sorted(rule["alert"] for rule in alerts())


# The labels that say where an alert fired, by rule group: a GPU, exporter or worker
# alert names its scrape target; a request alert its source, service and model, and
# the host too when it is about a GPU's requests (service_model_gpu:* series).
WHERE_BY_GROUP = {
    "gpuscope-gpu-alerts": {"job", "instance"},
    "gpuscope-sharing-alerts": {"job", "instance"},
    "gpuscope-exporter-alerts": {"job", "instance"},
    "gpuscope-worker-alerts": {"job", "instance"},
    "gpuscope-request-alerts": {"source", "service", "model"},
}
# absent() has no target, so no instance: only the job its selector names
WHERE_EXCEPTIONS = {"GpuscopeExporterAbsent": {"job"}, "GpuscopeEngineMetricsDown": {"job"}}


def _where(group: str, rule: dict[str, Any]) -> set[str]:
    if rule["alert"] in WHERE_EXCEPTIONS:
        return WHERE_EXCEPTIONS[rule["alert"]]
    where = WHERE_BY_GROUP[group]
    if "service_model_gpu:" in rule["expr"]:
        where = where | {"host"}
    return where


def test_every_alert_keeps_the_labels_that_say_where_it_fired() -> None:
    """promtool compares each case's exp_labels with the alert's labels exactly (the
    unit tests above), so the labels of every firing case are what the alert carries."""
    groups = yaml.safe_load((ALERTS / "rules" / "alerting.yml").read_text())["groups"]
    assert {group["name"] for group in groups} == set(WHERE_BY_GROUP)
    where = {rule["alert"]: _where(g["name"], rule) for g in groups for rule in g["rules"]}
    fired: dict[str, list[set[str]]] = {name: [] for name in where}
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test.get("alert_rule_test", []):
                for alert in check["exp_alerts"]:
                    fired[check["alertname"]].append(set(alert["exp_labels"]))
    for name, label_sets in fired.items():
        assert label_sets, f"{name} is never shown firing"
        for labels in label_sets:
            assert where[name] <= labels, f"{name} fires without {where[name] - labels}"


def test_every_recorded_series_is_recorded_before_a_rule_of_its_group_reads_it() -> None:
    """Within a group, rules run in order; across groups, a reader would lag a writer
    by an evaluation (or two, chained): the verdict must not judge old shares."""
    groups = yaml.safe_load((ALERTS / "rules" / "recording.yml").read_text())["groups"]
    group_of = {r["record"]: g["name"] for g in groups for r in g["rules"]}
    # The rules over dcgm-exporter's series are the GPU side's input, read across groups
    # as scraped series are (the GPU series they record have no colon, the pod map does)
    dcgm = yaml.safe_load((ALERTS / "rules" / "dcgm-exporter.yml").read_text())["groups"]
    inputs = {r["record"] for g in dcgm for r in g["rules"]}
    for group in groups:
        seen: set[str] = set()
        for rule in group["rules"]:
            used = set(re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", rule["expr"])) - inputs
            for name in used:
                assert group_of[name] == group["name"], f"{rule['record']} reads {name}"
                assert name in seen, f"{rule['record']} reads {name} before it is recorded"
            seen.add(rule["record"])


def test_every_recorded_series_a_promtool_case_reads_is_recorded() -> None:
    """A case over a series no rule records passes vacuously (expecting nothing, it
    gets nothing): after a rename, every case must still read a recorded name."""
    # recording.yml's and engines.yml's (Triton's, TGI's and SGLang's series)
    recorded = {rule["record"] for path in RULES for rule in rules_of(path) if "record" in rule}
    window = re.compile(r"(\d+[smhd])$")
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test.get("promql_expr_test", []):
                for name in re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", check["expr"]):
                    assert name in recorded or window.sub("", name) in recorded, (
                        f"{path.name}: {check['expr']} reads {name}, which no rule records"
                    )
