"""docs/engines/: the table says what ``SOURCE_DETAILS`` (pack/engines/) says, and
each engine's page names the release its metric names were read from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pack import engines
from pack.engines import ENGINES, SOURCE_DETAILS, Engine

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs" / "engines"
MAKEFILE = ROOT / "Makefile"
# table column -> source
COLUMNS = {
    "vLLM, metrics only": engines.VLLM,
    "Triton": engines.TRITON,
    "TGI": engines.TGI,
    "SGLang": engines.SGLANG,
    "TensorRT-LLM": engines.TRTLLM,
}
# table row -> what ``Capability.reports`` is asked
ROWS = {
    "preprocess": "preprocess",
    "queue": "queue",
    "batch-wait": "batch_wait",
    "compute": "compute",
    "postprocess": "postprocess",
    "TTFT": "ttft",
    "TPOT": "tpot",
    "batch size, trigger": "batch_size",
    "KV cache": "kv_cache",
    "GPU join": "gpu_join",
}
ABSENT = "–"


def table() -> dict[str, dict[str, str]]:
    """Row label -> column header -> cell, of the page's first table."""
    lines = []
    for line in (DOCS / "README.md").read_text().splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:  # the first table has ended (the page has others)
            break
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:], strict=True))
    return rows


def test_the_table_has_a_column_per_engine_and_the_rows_the_capabilities_have() -> None:
    rows = table()
    assert set(ROWS) <= set(rows)
    assert set(COLUMNS) <= set(rows["queue"])


@pytest.mark.parametrize("column", COLUMNS)
def test_the_table_says_what_each_source_reports(column: str) -> None:
    capability = SOURCE_DETAILS[COLUMNS[column]]
    rows = table()
    for row, what in ROWS.items():
        cell = rows[row][column]
        reported = not cell.startswith(ABSENT)
        assert reported == capability.reports(what), f"{column}, {row}: {cell!r}"


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.source)
def test_each_engine_page_names_its_release_and_source_files(engine: Engine) -> None:
    page = (DOCS / engine.doc_page).read_text()
    for release in (engine.release, *engine.also):
        assert release.version in page, release
        for path in release.files:
            assert path in page, path
    assert f"alerts/tests/{engine.source}_test.yml" in page
    assert (
        engine.release.version
        in table()["tested against"][next(c for c, s in COLUMNS.items() if s == engine.source)]
    )


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.source)
def test_each_engine_page_names_every_series_the_rules_read(engine: Engine) -> None:
    page = (DOCS / engine.doc_page).read_text()
    read = {name for timing in engine.timings for name in (*timing.sums, timing.count)}
    read |= set(engine.requests) | {engine.waiting, engine.running, engine.kv_usage}
    for name in read - {""}:
        family = name.removesuffix("_sum").removesuffix("_count")
        assert f"`{family}" in page, name


def _makefile_target(name: str) -> str:
    """The recipe of one target of the Makefile (its lines up to the next blank one)."""
    text = MAKEFILE.read_text()
    match = re.search(rf"^{name}:.*?(?=^\s*$)", text, re.M | re.S)
    assert match, name
    return match.group(0)


def test_the_triton_column_cites_the_live_run_and_the_release_ttft_needs() -> None:
    """Triton's "tested against" names, besides the source release, the live run: `make
    triton-check` and the ``tritonserver`` whose captures it writes (the wheel the
    Makefile pins); its TTFT cell the release the first-response histogram arrived in,
    as triton.md's "TTFT before ..." row names it."""
    rows = table()
    tested = rows["tested against"]["Triton"]
    captured = re.search(
        r"GPUSCOPE_TRITON_CAPTURE=tests/fixtures/triton-(\S+)", _makefile_target("triton-check")
    )
    assert captured, "triton-check captures no fixtures"
    wheel = re.search(r"^TRITON_VERSION\s*:=\s*(\S+)", MAKEFILE.read_text(), re.M)
    assert wheel
    assert "`make triton-check`" in tested
    assert f"`tritonserver` {captured.group(1)}." in tested, tested
    assert f"`nvidia-pytriton` {wheel.group(1)}" in tested, tested
    since = re.search(r"^\| TTFT before (\S+) \|", (DOCS / "triton.md").read_text(), re.M)
    assert since, "triton.md names no release TTFT needs"
    assert f"Triton ≥ {since.group(1)}" in rows["TTFT"]["Triton"]
