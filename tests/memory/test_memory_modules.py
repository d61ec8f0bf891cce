"""The host's memory package keeps its plan (issue 35): one concept a module, each saying what it is, none
over ~800 lines, no module reaching into another's private names, and a recall that walks one way (the cache
imports nothing that calls it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import impyard.memory

PACKAGE = Path(impyard.memory.__file__).parent
MODULES = sorted(PACKAGE.glob("*.py"))
MAX_LINES = 800


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _memory_imports(tree: ast.Module) -> set[str]:
    """The ``impyard.memory`` modules a module imports (``from impyard.memory import x`` counts as ``x``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "impyard.memory":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("impyard.memory."):
            found.add(str(node.module).removeprefix("impyard.memory."))
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("impyard.memory.")
                for a in node.names
                if a.name.startswith("impyard.memory.")
            }
    return found


def test_the_package_holds_the_store_split_by_aggregate() -> None:
    names = {path.stem for path in MODULES}
    assert {"store", "scoped", "records", "lookups", "search", "moments", "constructs", "slot", "dispositions",
            "conversations", "night", "forgetting", "copying", "stats", "counts", "generations", "reach",
            "errors", "cache", "cache_rows"} <= names  # fmt: skip


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_each_module_says_what_it_is_and_stays_small(path: Path) -> None:
    assert ast.get_docstring(_tree(path)), f"{path.name} has no docstring naming its concept"
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.name} is {lines} lines"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_no_module_reaches_into_another_s_private_names(path: Path) -> None:
    """What is shared has a public name: no ``from impyard.memory.x import _y``, no ``thing._y`` but on
    ``self`` or ``cls``."""
    reaches = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("impyard.memory"):
            reaches += [f"import {alias.name}" for alias in node.names if _private(alias.name)]
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                reaches.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert reaches == [], f"{path.name} reaches into private names: {reaches}"


def test_a_recall_walks_one_way() -> None:
    """search -> cache -> cache_rows: the cache and its loader import nothing that calls them."""
    cache = _memory_imports(_tree(PACKAGE / "cache.py"))
    rows = _memory_imports(_tree(PACKAGE / "cache_rows.py"))
    assert cache <= {"vectors"}, cache
    assert not rows & {"search", "store", "scoped", "lookups"}, rows
    assert "cache_rows" in _memory_imports(_tree(PACKAGE / "search.py"))
