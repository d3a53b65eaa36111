"""docs/internals.md names every module under regency/ (a module nobody documented, or a doc
describing a module that moved, fails here)."""

from __future__ import annotations

from pathlib import Path

import regency

PACKAGE = Path(regency.__file__).parent
DOC = PACKAGE.parent / "docs" / "internals.md"


def _documented() -> set[str]:
    """Module paths (relative to the repository) listed in the doc's module table."""
    text = DOC.read_text()
    block = text.split("## Modules", 1)[1].split("```", 2)[1]
    named: set[str] = set()
    package = "regency/"
    for line in block.splitlines():
        if not line.strip():
            continue
        first = line.split()[0]
        if not line.startswith(" ") and first.endswith("/"):
            package = first  # a package heading: "regency/core/"
        elif first.endswith(".py"):
            named.add(package + first)  # the name column: "  _codec.py   what it does"
    return named


def _modules() -> set[str]:
    return {
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if "__pycache__" not in path.parts
    }


def test_every_module_is_named_in_internals() -> None:
    missing = sorted(_modules() - _documented())
    assert not missing, f"modules not named in docs/internals.md: {missing}"


def test_internals_names_no_module_that_does_not_exist() -> None:
    stale = sorted(_documented() - _modules())
    assert not stale, f"docs/internals.md names modules that do not exist: {stale}"
