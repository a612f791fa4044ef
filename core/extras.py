"""Which optional parts of gpuscope are installed, read from its own package metadata.

The base install is what the middleware needs; each command needs an extra
(``pip install 'gpuscope[exporter]'``). The extras are defined once, in
``pyproject.toml``; this module reads them back from the installed distribution's
``Requires-Dist`` lines, so that a command can say which extra to install instead of
failing with an ``ImportError`` deep inside.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from importlib import metadata

DISTRIBUTION = "gpuscope"

# 'name[extra,...] >=1.0 ; extra == "exporter"' -> name, extras, marker
_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[(?P<extras>[^\]]*)\])?[^;]*(?:;(?P<marker>.*))?$"
)
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions_of(extras: Iterable[str], requires: Sequence[str]) -> list[str]:
    """The distributions that ``extras`` bring, following extras that name other
    extras of gpuscope (``gpuscope[exporter,worker]``); in order, without repeats."""
    wanted = [_normalized(extra) for extra in extras]
    seen_extras: set[str] = set()
    names: list[str] = []
    while wanted:
        extra = wanted.pop(0)
        if extra in seen_extras:
            continue
        seen_extras.add(extra)
        for line in requires:
            found = _REQUIREMENT.match(line)
            marker = _EXTRA_MARKER.search((found and found["marker"]) or "")
            if found is None or marker is None or _normalized(marker.group(1)) != extra:
                continue
            name = _normalized(found["name"])
            if name == DISTRIBUTION:
                wanted += [_normalized(e) for e in (found["extras"] or "").split(",") if e.strip()]
            elif name not in names:
                names.append(name)
    return names


def is_installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def missing(extras: Iterable[str]) -> list[str]:
    """The distributions of ``extras`` that are not installed (empty when all are,
    or when gpuscope itself carries no metadata to tell)."""
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    return [name for name in distributions_of(extras, requires) if not is_installed(name)]


def install_hint(extras: Sequence[str]) -> str:
    return f"pip install '{DISTRIBUTION}[{','.join(extras)}]'"
