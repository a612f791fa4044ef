"""The Kubernetes manifests of ``deploy/kubernetes/`` as ``kubectl kustomize`` renders them,
and the schemas they are checked against.

Kubernetes' own kinds are checked by ``kubernetes-validate`` (its bundled schemas, no
network) at ``KUBERNETES_VERSION``; the Prometheus Operator's by the CRDs vendored in
``tests/fixtures/prometheus-operator-<release>/`` (see the README there).
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import jsonschema
import yaml

from support.binaries import require_binary

REPO: Final = Path(__file__).resolve().parents[2]
KUBERNETES: Final = REPO / "deploy" / "kubernetes"
# The Kubernetes release the objects must be valid for (kubectl from Debian is 1.32).
KUBERNETES_VERSION: Final = "1.32.0"
OPERATOR_RELEASE: Final = "v0.93.0"
CRDS: Final = REPO / "tests" / "fixtures" / f"prometheus-operator-{OPERATOR_RELEASE}"

Obj = dict[str, Any]


def kustomization_dirs() -> list[str]:
    """``base`` and every overlay, as paths under deploy/kubernetes/."""
    overlays = sorted(p.name for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
    return ["base", *(f"overlays/{name}" for name in overlays)]


@functools.cache
def _kustomize(folder: str) -> str:
    kubectl = require_binary("kubectl")
    done = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {folder}: {done.stderr}"
    return done.stdout


def kustomize(folder: str) -> list[Obj]:
    """The objects ``kubectl kustomize deploy/kubernetes/<folder>`` renders (fresh copies)."""
    return [d for d in yaml.safe_load_all(_kustomize(folder)) if d is not None]


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _closed(schema: Any) -> None:
    """Refuse unknown fields where the CRD lists the known ones, as the API server's
    field validation (kubectl apply --validate=strict) does."""
    if isinstance(schema, dict):
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            _closed(value)
    elif isinstance(schema, list):
        for item in schema:
            _closed(item)


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """``(apiVersion, kind)`` -> a validator of the vendored CRD's served schema."""
    out: dict[tuple[str, str], jsonschema.protocols.Validator] = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if not version["served"]:
                continue
            schema = version["schema"]["openAPIV3Schema"]
            _closed(schema)
            cls = jsonschema.validators.validator_for(schema, jsonschema.Draft7Validator)
            out[(f"{group}/{version['name']}", kind)] = cls(schema)
    return out


def crd_errors(obj: Obj) -> Iterator[str]:
    validator = crd_validators()[(obj["apiVersion"], obj["kind"])]
    for error in validator.iter_errors(obj):
        yield f"{'/'.join(map(str, error.absolute_path))}: {error.message}"


def secret_data(objects: list[Obj], name: str) -> dict[str, str]:
    """A rendered Secret's values, from ``stringData`` or base64 ``data``."""
    import base64

    secret = find(objects, "Secret", name)
    data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    data.update(secret.get("stringData") or {})
    return data
