"""The shape every alert of the pack has, for the modules that build them."""

from __future__ import annotations

from typing import Any

from pack.settings import Settings


def alert(
    settings: Settings,
    name: str,
    expr: str,
    for_: str,
    severity: str,
    summary: str,
    description: str,
) -> dict[str, Any]:
    """One alerting rule: its ``severity`` label, and a summary (a sentence), a
    description and a ``runbook_url`` to the alert's section of the runbook."""
    assert summary.endswith("."), name
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{settings.runbook}#{name.lower()}",
        },
    }
