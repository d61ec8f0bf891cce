"""Where a problem sits in a TOML text: the line of a key path, and the line of a syntax error.

Used by the imp config and the policy files to turn a pydantic error ``loc`` (or a
``tomllib`` error) into ``<file>:<line>``. Best effort, line based: the text has
already parsed, so only valid TOML needs reading; what the key is called and why
it is wrong stay with each file's own messages. A finding is a ``Problem``; an error
that lists every finding of a file is a ``ProblemsError``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from impyard.errors import ImpyardError

__all__ = ["Problem", "ProblemsError", "line_of", "syntax_error_line"]

_STRINGS_AND_COMMENT = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'|#.*$")
_KEY_PART = re.compile(r"""[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*'""")
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY_LINE = re.compile(
    r"""^\s*((?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*'))*)\s*="""
)
_SYNTAX_LINE = re.compile(r"at line (\d+)")


@dataclass(frozen=True)
class Problem:
    """One finding in a file: ``<file>[:<line>]: <key>: <reason and fix>``."""

    file: str
    line: int | None
    key: str
    reason: str

    def key_text(self) -> str:
        """How the message names the key."""
        return self.key

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key_text()}: {self.reason}" if self.key else f"{where}: {self.reason}"


P = TypeVar("P", bound=Problem)


class ProblemsError(ImpyardError, Generic[P]):
    """A file that is broken: ``problems`` lists every finding, one line each; the message starts with the first,
    whose place and reason are the error's own attributes. The base of each file kind's error class."""

    def __init__(self, problems: list[P]) -> None:
        self.problems = problems
        first = problems[0]
        self.file, self.line, self.key, self.reason = first.file, first.line, first.key, first.reason
        super().__init__("\n".join(str(problem) for problem in problems))


def line_of(text: str, path: Sequence[str | int]) -> int | None:
    """The 1-based line of the deepest header or key on ``path``, or ``None`` when nothing on it is written.

    ``path`` is a pydantic error ``loc``: table and key names, and the index of an
    array-of-tables entry (``("rules", 2, "name")`` is ``name`` in the third ``[[rules]]``).
    A key written inside an inline table or array is found at the line of the key that holds it.
    """
    want = tuple(path)
    table: tuple[str | int, ...] = ()
    array_counts: dict[tuple[str | int, ...], int] = {}  # entries seen so far of each [[array]]
    best_line, best_depth = None, 0
    open_brackets = 0  # inside a multi-line array, lines are values, not headers or keys
    for number, line in enumerate(text.splitlines(), start=1):
        inside_array = open_brackets > 0
        bare = _STRINGS_AND_COMMENT.sub("", line)
        open_brackets = max(0, open_brackets + bare.count("[") - bare.count("]"))
        if inside_array:
            continue
        header = _HEADER.match(line)
        if header:
            open_brackets = 0
            table = _header_path(header.group(2), header.group(1) == "[[", array_counts)
            candidate = table
        else:
            key = _KEY_LINE.match(line)
            if not key:
                continue
            candidate = table + _split_key(key.group(1))
        depth = len(candidate)
        if depth > best_depth and want[:depth] == candidate:
            best_line, best_depth = number, depth
    return best_line


def syntax_error_line(error: tomllib.TOMLDecodeError) -> int | None:
    """The 1-based line ``tomllib`` names in ``error``; ``None`` for an error at the end of the document."""
    match = _SYNTAX_LINE.search(str(error))
    return int(match.group(1)) if match else None


def _split_key(text: str) -> tuple[str, ...]:
    return tuple(part[1:-1] if part[0] in "\"'" else part for part in _KEY_PART.findall(text))


def _header_path(
    text: str, is_array: bool, array_counts: dict[tuple[str | int, ...], int]
) -> tuple[str | int, ...]:
    """The path a ``[table]`` or ``[[array]]`` header opens; counts ``[[array]]`` entries in ``array_counts``."""
    path: tuple[str | int, ...] = _split_key(text)
    for cut in range(len(path) - is_array, 0, -1):
        if path[:cut] in array_counts:  # [rules.purposes] belongs to the last [[rules]] entry
            path = (*path[:cut], array_counts[path[:cut]], *path[cut:])
            break
    if is_array:
        index = array_counts.get(path, -1) + 1
        array_counts[path] = index
        path = (*path, index)
    return path
