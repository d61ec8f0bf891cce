"""Writing ``imp.toml`` by hand, so that it keeps its comments: each key with its documentation and example."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    pass

from impyard.imps.config import ImpConfig, default_token_env


def _toml_string(value: str) -> str:
    if "\\" in value and "'" not in value and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return f"'{value}'"  # a literal string: regexes stay readable
    out = []
    for char in value:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def toml_value(value: Any) -> str:
    """One TOML value: strings, booleans, numbers, (nested) lists and inline tables of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # finite by validation; repr always has a '.' or an exponent
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):  # an inline table ([memory] models)
        items = ", ".join(f"{_toml_key(str(key))} = {toml_value(item)}" for key, item in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _field_lines(
    model: BaseModel,
    cls: type[BaseModel],
    *,
    skip: tuple[str, ...] = (),
    shown_defaults: dict[str, Any] | None = None,
) -> list[str]:
    lines: list[str] = []
    explicit = model.model_fields_set
    for key, info in cls.model_fields.items():
        annotation = info.annotation
        if key in skip or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            continue
        lines.append(f"# {info.description}")
        if key in explicit:
            lines.append(f"{key} = {toml_value(getattr(model, key))}")
        else:
            default = info.get_default(call_default_factory=True)
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if shown_defaults and key in shown_defaults:
                lines.append(f"# {key} = {toml_value(shown_defaults[key])}")
            elif default is not None:
                lines.append(f"# {key} = {toml_value(default)}")
            elif extra.get("example") is not None:
                lines.append(f"# {key} = {toml_value(extra['example'])}  # an example; unset by default")
    return lines


def render_config(config: ImpConfig) -> str:
    """imp.toml text: keys set explicitly are written, every other key is a commented-out default."""
    lines = [
        f"# The imp {json.dumps(config.name)}. Edit, then check with: impyard imp show {config.name}",
        "# Every key but `name` is optional; a commented-out key shows its default.",
        "# Secrets never go here: the Discord token is read from [discord] token_env or token_file.",
        "",
        f"name = {toml_value(config.name)}",
        *_field_lines(config, ImpConfig, skip=("name",)),
    ]
    for key, info in ImpConfig.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            section = getattr(config, key)
            shown: dict[str, Any] | None = (
                {"token_env": default_token_env(config.name)} if key == "discord" else None
            )
            if key == "sessions":  # issue 38: the ceiling in force, from [model] server
                shown = {"turn_ceiling_s": config.turn_ceiling_s}
            lines += ["", f"[{key}]", *_field_lines(section, annotation, shown_defaults=shown)]
    return "\n".join(lines) + "\n"
