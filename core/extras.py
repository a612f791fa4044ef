"""Which optional parts of gpuscope are installed, read from its own package metadata.

The base install is what the middleware needs; each command needs an extra
(``pip install 'gpuscope[exporter]'``). The extras are defined once, in
``pyproject.toml``; this module reads them back from the installed distribution's
``Requires-Dist`` lines, so that a command can say which extra to install instead of
failing with an ``ImportError`` deep inside.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from importlib import metadata
from urllib.parse import unquote, urlsplit

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
    """The pip command that adds ``extras``: from the checkout gpuscope was installed
    from, when it was (``pip install '/src/gpuscope[exporter]'``), else by name."""
    try:
        direct_url = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct_url = None
    source = installed_from_directory(direct_url) or DISTRIBUTION
    return "pip install " + shlex.quote(f"{source}[{','.join(extras)}]")


def installed_from_directory(direct_url: str | None) -> str | None:
    """The local directory in pip's ``direct_url.json`` record (PEP 610), or None when
    gpuscope came from an index, a wheel file or a VCS URL, or the record is unreadable."""
    try:
        record = json.loads(direct_url or "null")
    except ValueError:
        return None
    if not isinstance(record, dict) or "dir_info" not in record:
        return None
    url = urlsplit(str(record.get("url", "")))
    return unquote(url.path) if url.scheme == "file" and url.path else None
