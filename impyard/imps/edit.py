"""``impyard imp set``: change keys of an imp.toml by their dotted names, keeping the file's comments.

Pure functions over the file's text. ``parse_assignment`` reads ``model.model=gpt-4.1``; ``apply_settings``
returns the new text and the settings it must parse to. Each key is written where it is (its line, or the
commented-out default ``impyard imp add`` wrote), or added at the end of its table; where the file's shape
does not allow that (a table written inline, dotted keys), the whole file is written afresh by
``render_config`` (every setting documented, the user's own comments lost). Validation is the caller's:
the store validates the text as it validates every imp.toml before anything is written.
"""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from pydantic import BaseModel

from impyard.imps.config import ImpConfig, ImpError
from impyard.imps.render import render_config, toml_value
from impyard.imps.validate import validate_config

KEY_PART = re.compile(r"^[A-Za-z0-9_-]+$")
_HEADER = re.compile(r"^\s*\[")
SECTIONS = frozenset(
    name
    for name, info in ImpConfig.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
)


class AssignmentError(ImpError):
    """An argument of ``imp set`` that is not ``key=value``."""


@dataclass(frozen=True)
class Assignment:
    """``path = value``; ``value`` is ``UNSET`` for ``key=`` (the key goes back to its default)."""

    path: tuple[str, ...]
    value: Any

    @property
    def key(self) -> str:
        return ".".join(self.path)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def parse_value(text: str) -> Any:
    """A TOML value (``false``, ``60``, ``0.7``, ``"text"``, ``["a", "b"]``, ``{ appraisal = "x" }``), else
    the text itself as a string, so ``gpt-4.1`` needs no quotes. A TOML date or time stays text."""
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text
    return text if isinstance(value, date | time | datetime) else value


def parse_assignment(argument: str) -> Assignment:
    """``section.key=value`` (or ``key=value`` for a top-level key; ``key=`` unsets it)."""
    key, sep, value = argument.partition("=")
    key = key.strip()
    parts = tuple(part.strip() for part in key.split("."))
    if not sep or not key or not all(KEY_PART.match(part) for part in parts):
        raise AssignmentError(
            f"{argument[:60]!r} is not KEY=VALUE: write a dotted key, e.g. model.model=gpt-4.1 or "
            "memory.enabled=false (KEY= puts a key back to its default)"
        )
    value = value.strip()
    return Assignment(parts, UNSET if value == "" else parse_value(value))


def settings_after(raw: dict[str, Any], assignments: list[Assignment]) -> dict[str, Any]:
    """The parsed settings with the assignments applied (what the new text must parse to)."""
    out = copy.deepcopy(raw)
    for assignment in assignments:
        *parents, last = assignment.path
        table = out
        for part in parents:
            child = table.get(part)
            if not isinstance(child, dict):
                if assignment.value is UNSET:
                    break
                child = table[part] = {}
            table = child
        else:
            if assignment.value is UNSET:
                table.pop(last, None)
            else:
                table[last] = assignment.value
    return out


def _split(path: tuple[str, ...]) -> tuple[str | None, str]:
    """The table a key is written in (None: the top level) and the key's name there."""
    if len(path) >= 2 and path[0] in SECTIONS:
        return path[0], path[1]
    return None, path[0]


def _region(lines: list[str], table: str | None) -> tuple[int, int] | None:
    """The lines [start, end) of ``table``'s body (the top level: before the first header), or None."""
    headers = [i for i, line in enumerate(lines) if _HEADER.match(line)]
    if table is None:
        return 0, headers[0] if headers else len(lines)
    pattern = re.compile(rf"^\s*\[\s*{re.escape(table)}\s*\]\s*(#.*)?$")
    for index in headers:
        if pattern.match(lines[index]):
            after = [h for h in headers if h > index]
            return index + 1, after[0] if after else len(lines)
    return None


def _value_end(lines: list[str], start: int) -> int:
    """The line after the assignment starting at ``start`` (a multi-line array or string spans lines)."""
    for end in range(start + 1, len(lines) + 1):
        try:
            tomllib.loads("\n".join(lines[start:end]))
        except tomllib.TOMLDecodeError:
            continue
        return end
    return start + 1


def _trailing_comment(line: str) -> str:
    """The comment after a one-line assignment (``  # why``), or ""."""
    for match in re.finditer("#", line):
        try:
            tomllib.loads(line[: match.start()])
        except tomllib.TOMLDecodeError:
            continue
        return "  " + line[match.start() :].strip()
    return ""


def _edit(lines: list[str], table: str | None, key: str, value: Any) -> list[str]:
    region = _region(lines, table)
    if region is None:
        if value is UNSET:
            return lines
        while lines and not lines[-1].strip():
            lines = lines[:-1]
        return [*lines, "", f"[{table}]", f"{key} = {toml_value(value)}"]
    start, end = region
    active = re.compile(rf"^\s*{re.escape(key)}\s*=")
    commented = re.compile(rf"^\s*#\s*{re.escape(key)}\s*=")
    for index in range(start, end):
        if active.match(lines[index]):
            stop = _value_end(lines, index)
            if value is UNSET:
                return [*lines[:index], *(f"# {line}" for line in lines[index:stop]), *lines[stop:]]
            comment = _trailing_comment(lines[index]) if stop == index + 1 else ""
            return [*lines[:index], f"{key} = {toml_value(value)}{comment}", *lines[stop:]]
    if value is UNSET:
        return lines
    for index in range(start, end):
        if commented.match(lines[index]):  # the documented default `impyard imp add` wrote
            return [*lines[:index], f"{key} = {toml_value(value)}", *lines[index + 1 :]]
    last = end
    while last > start and not lines[last - 1].strip():
        last -= 1
    if table is None and last == start:
        last = end  # nothing but blank lines before the first table: write the key there
    return [*lines[:last], f"{key} = {toml_value(value)}", *lines[last:]]


def apply_settings(text: str, assignments: list[Assignment], name: str) -> tuple[str, dict[str, Any]]:
    """The new imp.toml text and the settings it parses to. ``text`` must be valid TOML; the settings are
    not validated here. Comments are kept where the key can be edited in place; otherwise the file is
    rendered afresh (``render_config``) when the new settings are valid, and left as edited when not (the
    caller's validation then says why)."""
    raw = tomllib.loads(text)
    wanted = settings_after(raw, assignments)
    lines = text.split("\n")
    trailing_newline = text.endswith("\n")
    if trailing_newline:
        lines = lines[:-1]
    for assignment in assignments:
        table, key = _split(assignment.path)
        value = assignment.value
        if len(assignment.path) > (
            2 if table else 1
        ):  # memory.models.appraisal: write the whole inline table
            holder = wanted.get(table, {}) if table else wanted
            value = holder.get(key, UNSET) if isinstance(holder, dict) else UNSET
        lines = _edit(lines, table, key, value)
    new_text = "\n".join(lines) + ("\n" if trailing_newline or not lines else "")
    try:
        same = tomllib.loads(new_text) == wanted
    except tomllib.TOMLDecodeError:
        same = False
    if not same:
        try:
            new_text = render_config(validate_config(wanted, "imp.toml", expected_name=name))
        except ImpError:
            pass  # invalid settings: the caller's validation of this text reports them
    return new_text, wanted
