"""The house's plan (issue 35; docs/architecture.md): impyard's packages in layers, every import pointing down.

Each package of ``impyard`` has a rank; a module may import its own package and packages of a lower rank, never
a higher one and never a peer of the same rank. The root modules are split in two: the foundations
(``errors``, ``clock``…) that everything may use, and the assembly (``host``, ``runtime``) that builds a host from
the packages below it. Imports inside functions count: a late import is still an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMPYARD = ROOT / "impyard"

# Lowest first. A package may import only packages of a lower rank (and itself).
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "foundations",
    ),  # impyard/{errors,clock,durations,paths,toml_errors,failure_words,threads,stop_signals}.py
    ("metrics",),  # issue 34: every package counts into it; it knows none of them
    ("storage",),
    ("backends",),
    ("imps",),
    ("channels",),
    ("gateway",),
    ("tasks",),
    ("memory",),
    ("conversation",),
    ("assembly",),  # impyard/{host,runtime,query_vector}.py
    ("supervisor",),
    ("discord", "terminal", "console"),
    ("cli",),
)
FOUNDATIONS = {
    "errors",
    "clock",
    "durations",
    "paths",
    "toml_errors",
    "failure_words",
    "threads",
    "stop_signals",
    "__init__",
    "__main__",
}
ASSEMBLY = {"host", "runtime", "query_vector"}
RANK = {package: rank for rank, peers in enumerate(LAYERS) for package in peers}

# The fakes and kits tests use are not part of the host.
UNRANKED = {"testing"}


def package_of(module: str) -> str | None:
    """``impyard.gateway.core`` → ``gateway``; a root module → foundations or assembly."""
    parts = module.split(".")
    if parts[0] != "impyard":
        return None
    if len(parts) == 1:
        return "foundations"
    head = parts[1]
    if head in FOUNDATIONS:
        return "foundations"
    if head in ASSEMBLY:
        return "assembly"
    return head


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, with its line: ``from impyard import paths`` names ``impyard.paths``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "impyard":
                # a submodule (``from impyard import paths``), not a name of impyard/__init__.py (``__version__``)
                found += [
                    (node.lineno, f"impyard.{alias.name}")
                    for alias in node.names
                    if (IMPYARD / f"{alias.name}.py").exists() or (IMPYARD / alias.name).is_dir()
                ]
    return found


def upward_imports() -> list[str]:
    wrong: list[str] = []
    for path in sorted(IMPYARD.rglob("*.py")):
        here = package_of(module_name(path))
        if here is None or here in UNRANKED:
            continue
        assert here in RANK, f"{path.relative_to(ROOT)}: package {here!r} has no layer: add it to LAYERS"
        for line, target in imports_of(path):
            there = package_of(target)
            if there is None or there == here or there in UNRANKED:
                continue
            assert there in RANK, f"{target}: package {there!r} has no layer"
            if RANK[there] >= RANK[here]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {here} imports {target} ({there})")
    return wrong


def test_every_import_points_down_the_layers() -> None:
    wrong = upward_imports()
    assert not wrong, "imports against the layers (docs/architecture.md):\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize(
    ("module", "package"),
    [
        ("impyard.gateway.core", "gateway"),
        ("impyard.errors", "foundations"),
        ("impyard.host", "assembly"),
        ("impyard", "foundations"),
        ("box.protocol", None),
    ],
)
def test_package_of(module: str, package: str | None) -> None:
    assert package_of(module) == package


def test_every_package_says_what_it_is_and_what_it_may_import() -> None:
    for init in sorted(IMPYARD.glob("*/__init__.py")):
        package = init.parent.name
        if package in UNRANKED:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import:" in doc, f"{init.relative_to(ROOT)}: its docstring names no 'May import:' line"
