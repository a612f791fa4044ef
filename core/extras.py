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
    """The pip command that adds ``extras`` to gpuscope from where it was installed: the
    checkout (``pip install '/src/gpuscope[exporter]'``), the git repository at the
    installed commit or the archive URL (``'gpuscope[exporter] @ git+https://…@<commit>'``),
    else by name. gpuscope is on no public index, where the bare name would find
    nothing, or somebody else's package."""
    direct_url = direct_url_record()
    wanted = f"[{','.join(extras)}]"
    directory = installed_from_directory(direct_url)
    url = None if directory else installed_from_url(direct_url)
    if directory:
        target = directory + wanted
    elif url:
        target = f"{DISTRIBUTION}{wanted} @ {url}"
    else:
        target = DISTRIBUTION + wanted
    return "pip install " + shlex.quote(target)


def direct_url_record() -> str | None:
    """pip's ``direct_url.json`` for gpuscope (PEP 610): where it was installed from."""
    try:
        return metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None


def _direct_url_record(direct_url: str | None) -> dict[str, object] | None:
    try:
        record = json.loads(direct_url or "null")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def installed_from_url(direct_url: str | None) -> str | None:
    """The PEP 508 URL of a VCS or archive install in pip's ``direct_url.json`` record
    (PEP 610): ``git+https://host/gpuscope.git@<commit>``, the installed commit so that
    the extras join the same version; None for a directory, an index or a bad record."""
    record = _direct_url_record(direct_url)
    url = record.get("url") if record else None
    if record is None or not isinstance(url, str) or not url:
        return None
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("vcs"), str):
        revision = vcs.get("commit_id") or vcs.get("requested_revision")
        return f"{vcs['vcs']}+{url}" + (f"@{revision}" if isinstance(revision, str) else "")
    if isinstance(record.get("archive_info"), dict):
        return url
    return None


def installed_from_directory(direct_url: str | None) -> str | None:
    """The local directory in pip's ``direct_url.json`` record (PEP 610), or None when
    gpuscope came from an index, a wheel file or a VCS URL, or the record is unreadable."""
    record = _direct_url_record(direct_url)
    if record is None or "dir_info" not in record:
        return None
    url = urlsplit(str(record.get("url", "")))
    return unquote(url.path) if url.scheme == "file" and url.path else None
