"""Loading the governance policy (docs/security.md, docs/architecture.md): the shipped default, overlaid by the operator's files.

Where the files are:

* The shipped default is ``policies/default.toml`` at the top of the project
  (docs/architecture.md). It is found, in order, at ``$IMPYARD_DEFAULT_POLICY`` (a file),
  next to the ``impyard`` package (a checkout or an editable install), or under
  ``<sys.prefix>/share/impyard/policies/default.toml`` (where a wheel's
  ``data-files`` puts it). One file, no copies to drift; if none is found the
  gateway does not start.
* The operator's directory (``$IMPYARD_POLICY_DIR``, default
  ``IMPYARD_HOME/policies``) holds any number of ``*.toml`` files, read in name
  order. Their rules come first (first match wins), a rule with a default
  rule's name replaces it, and their other tables (budgets, prices, trust,
  channels, gates, upstream, http) override the default key by key. A rule's
  ``purposes`` select by purpose and model (issue 16), so an operator's rule
  for one more model sits next to the shipped ones without shadowing them.

A broken file raises ``PolicyError`` naming the file, the line, the key and the
reason; nothing is ever half-loaded.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

import impyard
from impyard.gateway.policy_models import (
    BudgetLimit,
    Budgets,
    ChannelSettings,
    GateSettings,
    HttpSettings,
    PolicyFile,
    Price,
    Rule,
    TrustSettings,
    UpstreamSettings,
)
from impyard.paths import home
from impyard.toml_errors import Problem, ProblemsError, line_of, syntax_error_line

DEFAULT_POLICY_ENV = "IMPYARD_DEFAULT_POLICY"
POLICY_DIR_ENV = "IMPYARD_POLICY_DIR"
DEFAULT_POLICY_NAME = "default.toml"
MAX_POLICY_FILE_BYTES = 1_048_576


class PolicyError(ProblemsError[Problem]):
    """A policy file is broken; ``problems`` lists every finding, the message starts with the first."""


@dataclass(frozen=True)
class Policy:
    """The effective policy: ordered rules plus the merged tables."""

    rules: tuple[Rule, ...]
    budgets: Budgets = Budgets()
    prices: Mapping[str, Price] = field(default_factory=dict)
    trust: Mapping[str, TrustSettings] = field(default_factory=dict)
    channels: ChannelSettings = ChannelSettings()
    gates: GateSettings = GateSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    http: HttpSettings = HttpSettings()
    sources: tuple[Path, ...] = ()
    rule_sources: Mapping[str, str] = field(default_factory=dict)

    def price(self, model: str) -> Price | None:
        return self.prices.get(model)

    def trust_for(self, act: str) -> TrustSettings:
        return self.trust.get(act) or TrustSettings()

    def budget_for(self, imp: str) -> BudgetLimit:
        """[budgets.imps.NAME], each missing key falling back to [budgets.per_imp] (never to "no limit")."""
        own, default = self.budgets.imps.get(imp), self.budgets.per_imp
        if own is None:
            return default
        return BudgetLimit(
            daily_usd=own.daily_usd if own.daily_usd is not None else default.daily_usd,
            monthly_usd=own.monthly_usd if own.monthly_usd is not None else default.monthly_usd,
        )

    @property
    def warnings(self) -> list[str]:
        """Things that load but will refuse requests at run time (a model allowed but not priced)."""
        found: list[str] = []
        for rule in self.rules:
            for purpose, models in (rule.purposes or {}).items():
                for model in models:
                    if model != "*" and model not in self.prices:
                        found.append(
                            f'rule "{rule.name}" allows model {model!r} for {purpose!r} but [prices] has no '
                            f"entry for it: such requests will be refused"
                        )
            if rule.allow_loopback:
                found.append(
                    f'rule "{rule.name}" sets allow_loopback: boxes may fetch from this host\'s own services '
                    "(meant for tests only)"
                )
        return found


# ------------------------------------------------------------------ where the files are


def default_policy_path() -> Path:
    configured = os.environ.get(DEFAULT_POLICY_ENV)
    if configured:
        return Path(configured).expanduser()
    candidates = [
        Path(impyard.__file__).resolve().parent.parent / "policies" / DEFAULT_POLICY_NAME,
        Path(sys.prefix) / "share" / "impyard" / "policies" / DEFAULT_POLICY_NAME,
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return candidates[0]


def operator_policy_dir() -> Path:
    configured = os.environ.get(POLICY_DIR_ENV)
    return Path(configured).expanduser() if configured else home() / "policies"


def policy_files(directory: Path) -> list[Path]:
    """The ``*.toml`` files of an operator directory, in name order (editor temp files skipped)."""
    return sorted(p for p in directory.glob("*.toml") if p.is_file() and not p.name.startswith((".", "#")))


# ------------------------------------------------------------------ loading


def load_policy(
    operator_dir: Path | None = None, *, default_path: Path | None = None, require_dir: bool = False
) -> Policy:
    """The shipped default overlaid by the operator's directory. Raises PolicyError; never half-loads."""
    default_path = default_path or default_policy_path()
    if not default_path.is_file():
        raise PolicyError(
            [
                Problem(
                    str(default_path),
                    None,
                    "",
                    f"the shipped default policy is missing; set {DEFAULT_POLICY_ENV} to a policy file "
                    "or run impyard from a checkout that has policies/default.toml",
                )
            ]
        )
    # An operator who names a policy dir expects it: a typo there must not silently drop their rules.
    require_dir = require_dir or (operator_dir is None and bool(os.environ.get(POLICY_DIR_ENV)))
    operator_dir = operator_dir if operator_dir is not None else operator_policy_dir()
    if not operator_dir.is_dir():
        if require_dir or operator_dir.exists():
            raise PolicyError(
                [Problem(str(operator_dir), None, "", "not a directory of *.toml policy files")]
            )
        operator_files: list[Path] = []
    else:
        operator_files = [p for p in policy_files(operator_dir) if p.resolve() != default_path.resolve()]
    layers = [(str(p), _read(p)) for p in operator_files] + [(str(default_path), _read(default_path))]
    return build_policy(layers)


def policy_from_text(text: str, name: str = "<policy>") -> Policy:
    """A policy from one TOML text alone (no default underneath); for tests and `policy check`."""
    return build_policy([(name, text)])


def build_policy(layers: list[tuple[str, str]]) -> Policy:
    """Overlay (name, text) layers, highest priority first. All problems are collected, then raised."""
    problems: list[Problem] = []
    parsed: list[tuple[str, PolicyFile]] = []
    for name, text in layers:
        try:
            parsed.append((name, parse_policy_file(text, name)))
        except PolicyError as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyError(problems)

    rules: list[Rule] = []
    rule_sources: dict[str, str] = {}
    for name, policy_file in parsed:
        for rule in policy_file.rules:
            if rule.name in rule_sources:
                if rule_sources[rule.name] != name and _is_default_layer(name, layers):
                    continue  # an operator rule of the same name replaces the default one
                line = line_of(dict(layers)[name], ("rules", policy_file.rules.index(rule), "name"))
                problems.append(
                    Problem(
                        name,
                        line,
                        f"rules.{rule.name}",
                        f"rule name already used in {rule_sources[rule.name]}",
                    )
                )
                continue
            rules.append(rule)
            rule_sources[rule.name] = name
    if problems:
        raise PolicyError(problems)

    merged: dict[str, Any] = {}
    for _name, policy_file in reversed(parsed):  # lowest priority first, overridden key by key
        merged = _deep_merge(merged, policy_file.model_dump(exclude_unset=True, exclude={"rules"}))
    tables = PolicyFile.model_validate(merged)
    return Policy(
        rules=tuple(rules),
        budgets=tables.budgets,
        prices=dict(tables.prices),
        trust=dict(tables.trust.items()),  # keyed by act name, read with any str
        channels=tables.channels,
        gates=tables.gates,
        upstream=tables.upstream,
        http=tables.http,
        sources=tuple(Path(name) for name, _ in layers),
        rule_sources=rule_sources,
    )


def _is_default_layer(name: str, layers: list[tuple[str, str]]) -> bool:
    return len(layers) > 1 and name == layers[-1][0]


def _read(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_POLICY_FILE_BYTES:
            raise PolicyError([Problem(str(path), None, "", f"larger than {MAX_POLICY_FILE_BYTES} bytes")])
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError([Problem(str(path), None, "", f"not UTF-8 text ({exc.reason})")]) from exc
    except OSError as exc:
        raise PolicyError([Problem(str(path), None, "", f"cannot read it: {exc.strerror or exc}")]) from exc


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


_TOML_LINE = re.compile(r"at line (\d+), column (\d+)")


def parse_policy_file(text: str, name: str) -> PolicyFile:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason = _TOML_LINE.sub("", str(exc)).replace("()", "").strip()  # "(at end of document)" stays whole
        raise PolicyError([Problem(name, syntax_error_line(exc), "", f"not valid TOML: {reason}")]) from exc
    try:
        return PolicyFile.model_validate(raw)
    except ValidationError as exc:
        errors = _without_redundant_missing(exc.errors())
        raise PolicyError([_problem(name, text, raw, error) for error in errors]) from exc


def _without_redundant_missing(errors: list[Any]) -> list[Any]:
    """Drop "action is missing" when the same table has an unknown key that is a typo of it ("acton")."""
    typos = {
        (tuple(e["loc"][:-1]), close[0])
        for e in errors
        if e["type"] == "extra_forbidden"
        and (model := _model_at(tuple(e["loc"][:-1]))) is not None
        and (close := difflib.get_close_matches(str(e["loc"][-1]), list(model.model_fields), n=1, cutoff=0.6))
    }
    return [
        e for e in errors if not (e["type"] == "missing" and (tuple(e["loc"][:-1]), e["loc"][-1]) in typos)
    ]


_PATTERN_HINTS = {
    "hosts": "a host name in lowercase (letters, digits, dots, hyphens) or *.example.com",
    "name": "a name of letters, digits, _ . - (up to 64 characters)",
    "scope": '"*" or an imp name',
    "purposes": 'a purpose in lowercase letters, digits and _ (or "*")',
}


# ------------------------------------------------------------------ legible errors


def _problem(name: str, text: str, raw: dict[str, Any], error: Any) -> Problem:
    loc = tuple(part for part in error["loc"] if part != "[key]")
    key = _key_text(loc, raw)
    kind = error["type"]
    if kind == "extra_forbidden":
        leaf = str(loc[-1]) if loc else ""
        reason = f"unknown key {leaf!r}"
        model = _model_at(loc[:-1])
        if model is not None:
            close = difflib.get_close_matches(leaf, list(model.model_fields), n=1, cutoff=0.6)
            reason += (
                f" (did you mean {close[0]!r}?)"
                if close
                else f" (known keys: {', '.join(model.model_fields)})"
            )
    elif kind == "missing":
        reason = "required key is missing"
    elif kind == "int_parsing_size":  # pydantic's own words ("input string") would mislead here
        reason = f"{error.get('input')!r} is far too large for this key"
    elif kind == "string_pattern_mismatch":
        field_name = next((str(part) for part in reversed(loc) if isinstance(part, str)), "")
        hint = _PATTERN_HINTS.get(field_name, "a value of the expected form")
        reason = f"{error.get('input')!r} is not {hint}"
    else:
        msg = error["msg"].removeprefix("Value error, ")
        value = error.get("input")
        shown = (
            f" (got {value!r})"
            if isinstance(value, str | int | float | bool) and kind != "value_error"
            else ""
        )
        reason = f"{msg}{shown}"
    return Problem(name, line_of(text, loc), key, reason)


def _key_text(loc: tuple[Any, ...], raw: dict[str, Any]) -> str:
    parts: list[str] = []
    node: Any = raw
    for part in loc:
        if isinstance(part, int):
            rule_name = (
                node[part].get("name")
                if isinstance(node, list) and part < len(node) and isinstance(node[part], dict)
                else None
            )
            parts[-1] += f"[{rule_name!r}]" if isinstance(rule_name, str) else f"[#{part + 1}]"
        else:
            parts.append(part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f'"{part}"')
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return ".".join(parts)


def _inner_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The pydantic model inside an annotation, and whether it sits in a dict (next loc part is a key)."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _inner_model(get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        for arg in get_args(annotation):
            model, is_dict = _inner_model(arg)
            if model is not None:
                return model, is_dict
        return None, False
    if origin is list:
        return _inner_model(get_args(annotation)[0])
    if origin is dict:
        return _inner_model(get_args(annotation)[1])[0], True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = PolicyFile
    skip_key = False
    for part in loc:
        if isinstance(part, int):
            continue
        if skip_key:
            skip_key = False
            continue
        field_info = model.model_fields.get(part)
        if field_info is None:
            return None
        inner, skip_key = _inner_model(field_info.annotation)
        if inner is None:
            return None
        model = inner
    return model
