"""The YAML the pack writes, in one style, and the documents its builders share.

The rule builder writes ``alerts/rules/*.yml`` with ``dump``; the Kubernetes builder
writes its manifests with it too, and wraps the rule files' groups in a
``prometheus_rule`` (the Prometheus Operator's kind), so a cluster runs the groups of
``alerts/rules/``, in the order of ``RULE_FILES``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import yaml

# The rule files ``alerts/build.py`` writes, in the order a PrometheusRule holds their
# groups: the recording rules (with the engines' timings the verdict reads) first.
RULE_FILES: Final = ("recording.yml", "alerting.yml", "engines.yml", "dcgm-exporter.yml")


class _Dumper(yaml.SafeDumper):
    pass


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _string)


def dump(document: Any) -> str:
    """YAML text in the rule files' style (expressions of several lines as blocks)."""
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=4096)


def prometheus_rule(groups: Sequence[dict[str, Any]], metadata: dict[str, Any]) -> dict[str, Any]:
    """The Prometheus Operator's ``PrometheusRule`` holding ``groups``."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": {"groups": list(groups)},
    }
