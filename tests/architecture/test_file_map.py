"""docs/architecture.md's file map is true to the tree: every path it names exists, and every top-level module and
package of `evalsi/` is in it (deeper files may be added without touching the map)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "evalsi"


def file_map(text: str) -> str:
    """The `## File map` section of the document."""
    found = re.search(r"^## File map\n(.*?)(?=^## )", text, re.S | re.M)
    assert found, f"{DOC.relative_to(ROOT)} has no '## File map' section"
    return found.group(1)


def listed_paths(section: str) -> set[str]:
    """The paths the map names: each `evalsi/...` in backticks (a trailing `/` marks a package)."""
    return set(re.findall(r"`(evalsi/[\w./]*)`", section))


def top_level(package: Path) -> set[str]:
    """The top-level modules (`evalsi/x.py`) and packages (`evalsi/x/`) of the tree."""
    found = set()
    for p in package.iterdir():
        if p.is_dir() and (p / "__init__.py").exists():
            found.add(f"evalsi/{p.name}/")
        elif p.suffix == ".py":
            found.add(f"evalsi/{p.name}")
    return found


def problems(listed: set[str], root: Path, tree: set[str]) -> list[str]:
    missing = sorted(p for p in listed if not (root / p).exists() or p.endswith("/") != (root / p).is_dir())
    unlisted = sorted(tree - listed)
    return [f"listed but not in the tree: {p}" for p in missing] + [
        f"in the tree but not listed: {p}" for p in unlisted
    ]


def test_the_file_map_matches_the_tree() -> None:
    listed = listed_paths(file_map(DOC.read_text()))
    found = problems(listed, ROOT, top_level(PACKAGE))
    assert not found, "docs/architecture.md's file map is out of date:\n" + "\n".join(found)


def test_the_check_names_what_is_missing_and_what_is_extra(tmp_path: Path) -> None:
    (tmp_path / "evalsi" / "pkg").mkdir(parents=True)
    (tmp_path / "evalsi" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "evalsi" / "mod.py").write_text("")
    (tmp_path / "evalsi" / "new.py").write_text("")
    section = "| `evalsi/pkg/` | x |\n| `evalsi/mod.py`, `evalsi/gone.py` | y |\n| `evalsi/mod.py/` | z |\n"
    assert problems(listed_paths(section), tmp_path, top_level(tmp_path / "evalsi")) == [
        "listed but not in the tree: evalsi/gone.py",
        "listed but not in the tree: evalsi/mod.py/",
        "in the tree but not listed: evalsi/new.py",
    ]
