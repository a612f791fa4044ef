"""docs/spans.md and ``gpuscope.spans`` describe the same contract: attributes, phases
and their marks, span names, batch triggers and the instrumentation scope."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from gpuscope import spans

DOC = Path(__file__).resolve().parents[2] / "docs" / "spans.md"
_CODE = re.compile(r"`([^`]+)`")


def section(title: str) -> str:
    """The text under ``## title``, up to the next heading of that level."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match is not None, f"docs/spans.md has no section {title!r}"
    return match.group(1)


def tables(text: str) -> list[list[list[str]]]:
    """The body rows of each table in ``text``, as cells (header and rule rows left out)."""
    found: list[list[list[str]]] = []
    previous_was_row = False
    for line in text.splitlines():
        is_row = line.startswith("|")
        if is_row and not previous_was_row:
            found.append([])
        if is_row and "`" in line.split("|")[1]:  # headers and rules have no code
            found[-1].append([cell.strip() for cell in line.strip().strip("|").split("|")])
        previous_was_row = is_row
    return found


def table_rows(text: str) -> list[list[str]]:
    return [row for table in tables(text) for row in table]


def first_column_names(text: str) -> set[str]:
    """Backquoted names in the first column of the tables in ``text``, with
    ``gpuscope.<phase>.duration`` spelled out for every phase."""
    names: set[str] = set()
    for row in table_rows(text):
        for name in _CODE.findall(row[0]):
            if "<phase>" in name:
                names.update(name.replace("<phase>", phase) for phase in spans.PHASES)
            else:
                names.add(name)
    return names


def module_attributes() -> set[str]:
    """Every attribute key the module defines: its dotted string constants that are not
    span names, and the phase and compute-stage durations."""
    span_names = {spans.BATCH_SPAN_NAME, *spans.PHASE_SPANS.values()}
    keys = {
        value
        for name, value in vars(spans).items()
        if name.isupper() and isinstance(value, str) and "." in value
    }
    return (
        (keys - span_names)
        | set(spans.PHASE_DURATION.values())
        | set(spans.COMPUTE_STAGE_DURATION.values())
    )


def test_every_attribute_in_the_module_is_documented_and_every_documented_one_defined() -> None:
    documented = first_column_names(section("Server span")) | first_column_names(
        section("Batch span")
    )
    defined = module_attributes()
    assert defined - documented == set(), "defined in gpuscope.spans, missing in docs/spans.md"
    assert documented - defined == set(), "in docs/spans.md, not defined in gpuscope.spans"


def test_the_phase_table_is_the_modules_phase_marks_in_order() -> None:
    _, phase_table = tables(section("The phase model"))
    documented = {_CODE.findall(phase)[0]: (start, end) for phase, start, end in phase_table}
    assert list(documented.items()) == list(spans.PHASE_MARKS.items())
    assert tuple(documented) == spans.PHASES


def test_phases_follow_each_other_so_they_add_up_to_the_duration() -> None:
    bounds = list(spans.PHASE_MARKS.values())
    for (_, end), (start, _) in itertools.pairwise(bounds):
        assert end == start
    assert (*(start for start, _ in bounds), bounds[-1][1]) == spans.MARKS
    assert len(set(spans.MARKS)) == len(spans.MARKS)


def test_the_mark_table_is_the_phase_bounds_in_order_plus_first_token() -> None:
    mark_table, _ = tables(section("The phase model"))
    documented = [_CODE.findall(row[0])[0] for row in mark_table]
    assert [mark for mark in documented if mark != "first_token"] == list(spans.MARKS)
    assert "first_token" in documented


@pytest.mark.parametrize(
    ("title", "names"),
    [
        ("Phase spans", set(spans.PHASE_SPANS.values())),
        ("Batch span", {spans.BATCH_SPAN_NAME}),
    ],
)
def test_span_names_are_documented(title: str, names: set[str]) -> None:
    prose = section(title).split("\n|", 1)[0]  # the text before the section's table
    assert {name for name in _CODE.findall(prose) if name.startswith("gpuscope.")} == names


def test_batch_triggers_scope_and_error_types_are_documented() -> None:
    trigger_row = next(
        row for row in table_rows(section("Batch span")) if f"`{spans.BATCH_TRIGGER}`" in row[0]
    )
    assert set(_CODE.findall(trigger_row[-1])) == {trigger.value for trigger in spans.BatchTrigger}
    assert f"instrumentation scope `{spans.INSTRUMENTATION_NAME}`" in section("Server span")
    error_row = next(
        row for row in table_rows(section("Server span")) if f"`{spans.ERROR_TYPE}`" in row[0]
    )
    assert {spans.CLIENT_DISCONNECTED, spans.NO_RESPONSE} <= set(_CODE.findall(error_row[-1]))
    assert f"**{spans.CLIENT_CLOSED_REQUEST_STATUS}**" in section("Server span")
