"""Every relative link in the docs leads to a file that exists, and its #anchor to a heading.

GitHub's anchors: a heading lower-cased, its punctuation dropped (hyphens and
underscores stay), spaces turned to hyphens, and -1, -2, ... on repeats.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PAGES = sorted(
    [
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        REPO / "dashboards" / "README.md",
        *(REPO / "alerts").glob("*.md"),
        REPO / "deploy" / "kubernetes" / "README.md",
    ]
)
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.M)


def prose(text: str) -> str:
    """The page without its fenced code blocks, where `](` is code, not a link."""
    return _FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(prose(page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        repeat = seen.get(slug, 0)
        found.add(slug if repeat == 0 else f"{slug}-{repeat}")
        seen[slug] = repeat + 1
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file or anchor does not exist."""
    broken = []
    for target in _LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z+.-]*:", target):  # http:, mailto:, ...: not ours to check
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


def test_the_pages_exist() -> None:
    assert (REPO / "README.md") in PAGES
    assert len(PAGES) >= 10


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## The `flags` and more, too\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Twice\n\n## Twice\n\n"
        "[ok](other.md#the-flags-and-more-too) [ok](#twice-1) [web](https://example.com/x)\n"
        "[gone](missing.md) [bad](other.md#nowhere) [bad](#twice-2)\n"
        "```\n[in code](not-checked.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading #nowhere in other.md",
        "#twice-2: no heading #twice-2 in page.md",
    ]
