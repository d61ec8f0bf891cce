"""The host imports nothing of the box but what both sides run (issue 35): ``box.protocol`` and ``box.common``.

Read from the source (``ast``), every import at any depth — inside functions too — and every
``importlib.import_module`` / ``__import__`` of a constant name. The host may also ``import box`` itself, to
find the package's files (the image build copies them, the process backend puts them on a box's path);
``box/__init__.py`` imports nothing, so that runs no box code. ``box.common`` in turn imports only the
standard library, pydantic, ``box.protocol`` and ``box.common``: what the host shares stays shared.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ("box.protocol", "box.common")  # the box's packages the host may import
COMMON_THIRD_PARTY = frozenset({"pydantic"})  # beside the standard library, what box/common may import


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) of everything ``source`` imports; ``from a import b`` gives ``a`` and ``a.b``
    (``b`` may be a module). ``module``: the importer's own name, to resolve relative imports."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def _of_box(name: str) -> bool:
    return name == "box" or name.startswith("box.")


def _shared(name: str) -> bool:
    return any(name == top or name.startswith(f"{top}.") for top in SHARED)


def host_refusals(source: str, module: str) -> list[str]:
    """What of the box a host module imports beyond ``box`` itself, ``box.protocol`` and ``box.common``."""
    return [
        f"line {line}: {name}"
        for line, name in imported(source, module)
        if _of_box(name) and name != "box" and not _shared(name)
    ]


def common_refusals(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """What a ``box.common`` module imports beyond the standard library, pydantic, box.protocol, box.common."""
    refused = []
    for line, name in imported(source, module, is_package=is_package):
        top = name.partition(".")[0]
        if _of_box(name):
            if not _shared(name):
                refused.append(f"line {line}: {name}")
        elif top not in sys.stdlib_module_names and top not in COMMON_THIRD_PARTY and top != "__future__":
            refused.append(f"line {line}: {name}")
    return refused


def _sources(folder: str) -> list[Path]:
    return sorted(path for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts)


def test_the_host_imports_nothing_of_the_box_but_protocol_and_common() -> None:
    files = _sources("impyard")
    assert len(files) > 50  # the walk found the host
    refused = {
        str(path.relative_to(ROOT)): found
        for path in files
        if (found := host_refusals(path.read_text(encoding="utf-8"), _module_name(path)))
    }
    assert refused == {}, (
        "the host may import only box.protocol and box.common of the box (tests/test_box_common.py)"
    )


def test_box_common_imports_only_the_standard_library_pydantic_protocol_and_itself() -> None:
    files = _sources("box/common")
    assert {path.stem for path in files} >= {"__init__", "laws", "slot", "model_profiles", "request_bodies"}
    refused = {
        str(path.relative_to(ROOT)): found
        for path in files
        if (
            found := common_refusals(
                path.read_text(encoding="utf-8"), _module_name(path), is_package=path.stem == "__init__"
            )
        )
    }
    assert refused == {}


def test_importing_the_box_package_itself_runs_no_box_code() -> None:
    """``import box`` (the host's way to find the box's files) must stay free of imports."""
    assert (
        list(imported((ROOT / "box" / "__init__.py").read_text(encoding="utf-8"), "box", is_package=True))
        == []
    )


def test_the_box_protocol_imports_nothing_else_of_the_box() -> None:
    """What the host shares stays closed: box.protocol reaches no box module but its own."""
    refused = {
        str(path.relative_to(ROOT)): bad
        for path in _sources("box/protocol")
        if (
            bad := [
                f"line {line}: {name}"
                for line, name in imported(
                    path.read_text(encoding="utf-8"), _module_name(path), is_package=path.stem == "__init__"
                )
                if _of_box(name) and not name.startswith("box.protocol")
            ]
        )
    }
    assert refused == {}


# The checks themselves, on written-out sources: each would let a reach into the box through if it were wrong.
@pytest.mark.parametrize(
    ("source", "refused"),
    [
        ("from box.protocol.models import ResponderSettings", []),
        ("from box.common import laws\nfrom box.common.history import trim", []),
        ("import box", []),  # the package's location
        ("from box import protocol", []),
        ("from box.memory import laws", ["line 1: box.memory", "line 1: box.memory.laws"]),
        ("import box.chat_api", ["line 1: box.chat_api"]),
        ("from box import chat_api", ["line 1: box.chat_api"]),
        ("from box import __version__", ["line 1: box.__version__"]),
        ("def f():\n    from box.model import ModelCallFailed", ["line 2: box.model", "line 2: box.model.ModelCallFailed"]),
        ("import importlib\nimportlib.import_module('box.failures')", ["line 2: box.failures"]),
        ("__import__('box.history')", ["line 1: box.history"]),
        ("import boxes\nfrom impyard.paths import box_dir_name", []),  # not the box package
        ("from box.protocolx import y", ["line 1: box.protocolx", "line 1: box.protocolx.y"]),
    ],
)  # fmt: skip
def test_the_host_check(source: str, refused: list[str]) -> None:
    assert host_refusals(source, "impyard.cli.memory") == refused


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        ("import re\nfrom collections.abc import Sequence\nfrom pydantic import BaseModel", []),
        ("from box.protocol import ErrorCode\nfrom box.common.laws import DEFAULTS", []),
        ("from . import laws\nfrom .slot import Held", []),  # relative, inside box.common
        ("from box.model import ModelCallFailed", ["line 1: box.model", "line 1: box.model.ModelCallFailed"]),
        ("from ..memory import engine", ["line 1: box.memory", "line 1: box.memory.engine"]),
        ("import anyio", ["line 1: anyio"]),  # no I/O library: common is pure
        ("def f():\n    import httpx", ["line 2: httpx"]),
    ],
)  # fmt: skip
def test_the_common_check(source: str, refused: list[str]) -> None:
    assert common_refusals(source, "box.common.history") == refused
