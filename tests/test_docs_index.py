"""docs/README.md is the map of the docs: every page of docs/ is linked from it exactly once, every link of it
resolves (the file, and the heading when it names one), and the project's README points to it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return found


def test_every_page_is_linked_once_from_the_docs_index() -> None:
    links = [m.group(1) for m in LINK.finditer(INDEX.read_text()) if "://" not in m.group(1)]
    linked = [(INDEX.parent / link.split("#")[0]).resolve() for link in links]
    pages = sorted(p.resolve() for p in DOCS.rglob("*.md") if p != INDEX)
    assert len(pages) >= 30
    missing = [str(p.relative_to(ROOT)) for p in pages if p not in linked]
    assert not missing, f"docs/README.md does not link {missing}"
    twice = sorted({str(p.relative_to(ROOT)) for p in pages if linked.count(p) > 1})
    assert not twice, f"docs/README.md links {twice} more than once"


def test_every_link_of_the_docs_index_resolves() -> None:
    for link in (m.group(1) for m in LINK.finditer(INDEX.read_text())):
        assert "://" not in link, f"{link}: the index links pages of this repository"
        path, _, anchor = link.partition("#")
        target = (INDEX.parent / path).resolve()
        assert target.is_file(), f"docs/README.md links {link}: no such file"
        if anchor:
            assert anchor in _anchors(target), f"docs/README.md links {link}: no such heading"


def test_the_readme_points_to_the_docs_index() -> None:
    assert "(docs/README.md)" in (ROOT / "README.md").read_text()
