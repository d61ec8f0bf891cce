"""Reading ``imp.toml``: parse and validate it, with errors that name the file, the line, the key, the reason and
the fix (``ImpConfigError``); nothing is ever half-loaded."""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from box.common.model_profiles import SettingProblem, config_problems
from impyard.toml_errors import line_of, syntax_error_line

if TYPE_CHECKING:
    pass

from impyard.imps.config import (
    MAX_GOT_CHARS,
    SECRET_FIX,
    SECRET_KEYS,
    ConfigProblem,
    ImpConfig,
    ImpConfigError,
    ModelConfig,
)


def parse_config(text: str, file: str, *, expected_name: str | None = None) -> ImpConfig:
    """Parse and validate imp.toml text; raise ``ImpConfigError`` naming ``file``, the line and the key."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise ImpConfigError(
            [
                ConfigProblem(
                    file,
                    syntax_error_line(exc),
                    "",
                    f'not valid TOML: {reason}; fix the syntax (text values need "quotes")',
                )
            ]
        ) from None
    return validate_config(raw, file, text=text, expected_name=expected_name)


def validate_config(
    raw: dict[str, Any], file: str, *, text: str | None = None, expected_name: str | None = None
) -> ImpConfig:
    """Validate a parsed config; every problem names the key (and, given ``text``, the line)."""
    secrets = list(_secret_keys(raw))
    problems = [ConfigProblem(file, locate(text, path), _key_text(path), SECRET_FIX) for path in secrets]
    try:
        config = ImpConfig.model_validate(raw)
    except ValidationError as exc:
        for error in exc.errors():
            loc = tuple(error["loc"])
            if loc in secrets:
                continue  # already reported, with the secret-specific fix
            problems.append(ConfigProblem(file, locate(text, loc), _key_text(loc), _reason(error, loc)))
        problems.sort(key=lambda problem: problem.line or 1 << 30)
        raise ImpConfigError(problems) from None
    if problems:
        raise ImpConfigError(problems)
    problems = [
        ConfigProblem(file, locate(text, ("model", problem.key)), f"model.{problem.key}", problem.reason)
        for problem in model_problems(config.model)
    ]
    if problems:
        raise ImpConfigError(problems)  # issue 16: asks for what no request to this model could carry
    if expected_name is not None and config.name != expected_name:
        raise ImpConfigError(
            [
                ConfigProblem(
                    file,
                    locate(text, ("name",)),
                    "name",
                    f"must be {json.dumps(expected_name)}, the directory's name (got {json.dumps(config.name)}); "
                    "fix the name or rename the directory",
                )
            ]
        )
    return config


def model_problems(model: ModelConfig) -> list[SettingProblem]:
    """Issue 16: what ``[model]`` asks that its models cannot take (``box.common.model_profiles.config_problems``);
    a reasoning effort or temperature counts only when written, since a default is adapted per model."""
    explicit = model.model_fields_set
    keys = ("model", "vision_model", "factual_model", "retry_model")
    return config_problems(
        models={key: getattr(model, key) for key in keys if getattr(model, key) is not None},
        server=model.server,
        reasoning_effort=model.reasoning_effort if "reasoning_effort" in explicit else None,
        temperature=model.temperature if "temperature" in explicit else None,
        tools=bool(model.tools),
        use_responses_api=model.use_responses_api,
    )


def _secret_keys(raw: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(raw, dict):
        for key, value in raw.items():
            if key.lower() in SECRET_KEYS:
                yield (*prefix, key)
            else:
                yield from _secret_keys(value, (*prefix, key))


def _key_text(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _field_info(loc: tuple[Any, ...]) -> FieldInfo | None:
    """The FieldInfo of the deepest config field on ``loc`` (list indexes skipped)."""
    model: type[BaseModel] | None = ImpConfig
    info: FieldInfo | None = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return info
        info = model.model_fields[part]
        annotation = info.annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return info


def _got(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_GOT_CHARS else text[: MAX_GOT_CHARS - 1] + "…"


def _reason(error: Any, loc: tuple[Any, ...]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        section = _field_info(loc[:-1]) if len(loc) > 1 else None
        model = section.annotation if section is not None else ImpConfig
        known = list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []
        close = [k for k in known if _similar(str(loc[-1]), k)]
        hint = f"did you mean '{close[0]}'? " if close else ""
        # The value is never echoed: an unknown key might hold a secret.
        return f"unknown key; {hint}remove it or fix its spelling (known here: {', '.join(known)})"
    if kind == "missing":
        return 'missing; add it (name = "<the directory\'s name>")' if loc == ("name",) else "missing"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    info = _field_info(loc)
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    expect = extra.get("expect")
    if not expect:
        return error["msg"]
    if loc and loc[0] == "discord":
        return f"must be {expect}"  # discord values are not echoed: a pasted token must not reach a log
    return f"must be {expect} (got {_got(error['input'])})"


def _similar(a: str, b: str) -> bool:
    return difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio() >= 0.75


def locate(text: str | None, loc: tuple[Any, ...]) -> int | None:
    """The line of the key on ``loc`` (else of its table's header); ``None`` without the text."""
    return None if text is None else line_of(text, loc)
