"""The PromQL text every rule module of the pack builds on: a recording rule's entry,
a label copied from another (``host`` from ``instance``), and the indentation of
nested expressions."""

from __future__ import annotations

from typing import Any

from pack.settings import Settings

# The labels of one scrape target: the rules of a target's series keep both.
INSTANCE = "job, instance"


def record_rule(record: str, expr: str, **labels: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"record": record, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule


def copy_label(expr: str, dst: str, src: str, regex: str = "(.*)") -> str:
    """``expr`` with label ``dst`` set from ``src`` (``$1`` of the anchored ``regex``)."""
    return f'label_replace(\n  {indent(expr)},\n  "{dst}", "$1", "{src}", "{regex}"\n)'


def with_host(settings: Settings, expr: str) -> str:
    """``expr`` with a ``host`` label: its ``instance`` without the port."""
    return copy_label(expr, "host", "instance", settings.host_from_instance)


def indent(text: str) -> str:
    return text.replace("\n", "\n  ")
