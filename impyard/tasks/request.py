"""A task request, every field validated before anything is written (``validate_request``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from impyard.durations import DurationError, format_duration, parse_duration
from impyard.errors import ImpyardError
from impyard.imps.store import ImpStore, validate_name

Origin = Literal["manual", "schedule", "continuation", "event"]
ORIGINS: tuple[Origin, ...] = ("manual", "schedule", "continuation", "event")

DEFAULT_KIND = "prompt"
KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,39}$")  # the protocol's TaskSpec.kind
DEFAULT_CEILING = timedelta(minutes=10)
MIN_CEILING = timedelta(seconds=10)
MAX_CEILING = timedelta(hours=6)
MAX_PROMPT_CHARS = 8_000
MAX_CHANNEL_CHARS = 128  # the protocol's Id
MAX_PERSON_CHARS = 128
TASK_CHANNEL_PREFIX = "task:"  # task:<imp> is the imp's task log (printed on the host's surface)
_CHANNEL_PATTERN = re.compile(r"^[^\s\x00-\x1f\x7f]+$")
MAX_SCOPE_CHARS = 200  # a memory scope: terminal, guild:<id>, dm:<id>, guild:channel:<id>, ...
MAX_ARGS = 16  # the protocol's TaskSpec.args
MAX_ARG_NAME_CHARS = 40
MAX_ARG_CHARS = 1_000
_ARG_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,39}$")

TaskArg = str | int | float | bool | None  # the protocol's TaskSpec.args values: plain values only


class TaskError(ImpyardError, ValueError):
    """A task that cannot be added, found or changed; the message is one line that says what to do."""


def default_channel(imp: str) -> str:
    """Where a task posts when no channel is given: the imp's task log on the host's own surface."""
    return f"{TASK_CHANNEL_PREFIX}{imp}"


@dataclass(frozen=True)
class TaskRequest:
    imp: str
    prompt: str | None
    kind: str = DEFAULT_KIND
    channel_id: str | None = None
    ceiling: str | float | timedelta | None = None
    origin: Origin = "manual"
    wake_on_resolve: bool = False
    briefing: bool = False
    person: str | None = None
    scope: str | None = None  # a memory task's privacy scope (a ``sleep`` task works in this one alone)
    args: Mapping[str, TaskArg] | None = None  # the kind's own arguments (a ``sleep`` task's ``since``)


@dataclass(frozen=True, kw_only=True)
class ValidTask:
    """What a task is asked to do, every field checked: what ``insert`` writes, and what a stored ``Task`` adds its
    state to."""

    imp: str
    kind: str
    prompt: str | None
    person: str | None
    origin: Origin
    channel_id: str
    ceiling_s: float
    wake_on_resolve: bool
    briefing: bool
    scope: str | None = None  # a memory task's privacy scope (issue 15: a ``sleep`` task's one scope)
    args: Mapping[str, TaskArg] = field(default_factory=dict)  # the kind's own arguments (``TaskSpec.args``)


def parse_ceiling(value: str | float | timedelta | None) -> float:
    """A task's ceiling in seconds: 10 s to 6 h (default 10 min)."""
    if value is None:
        return DEFAULT_CEILING.total_seconds()
    try:
        ceiling = value if isinstance(value, timedelta) else parse_duration(value, what="--ceiling")
    except DurationError as exc:
        raise TaskError(str(exc)) from None
    if not MIN_CEILING <= ceiling <= MAX_CEILING:
        raise TaskError(
            f"a ceiling of {format_duration(ceiling)} is out of range: give a task from "
            f"{format_duration(MIN_CEILING)} to {format_duration(MAX_CEILING)} (e.g. --ceiling 10m)"
        )
    return ceiling.total_seconds()


def validate_request(request: TaskRequest, imps: ImpStore | None = None) -> ValidTask:
    """Check every field; ``imps`` also checks that the imp exists (ImpNotFound lists the imps there are)."""
    validate_name(request.imp)  # ImpNameError: never a path built from a bad name
    if imps is not None:
        imps.get(request.imp)  # ImpNotFound / ImpConfigError
    if not isinstance(request.kind, str) or not KIND_PATTERN.match(request.kind):
        raise TaskError(
            f"task kind {str(request.kind)[:60]!r} is not valid: 1-40 lowercase letters, digits and underscores, "
            "starting with a letter (e.g. prompt)"
        )
    if request.origin not in ORIGINS:
        raise TaskError(f"unknown task origin {request.origin!r}: one of {', '.join(ORIGINS)}")
    prompt = request.prompt if request.prompt else None
    if prompt is not None:
        if len(prompt) > MAX_PROMPT_CHARS:
            raise TaskError(
                f"the prompt is {len(prompt)} characters; a task prompt may be at most {MAX_PROMPT_CHARS}: shorten it"
            )
        if "\x00" in prompt:
            raise TaskError("the prompt contains a NUL character; remove it")
    elif request.kind == DEFAULT_KIND:
        raise TaskError('a prompt task needs its prompt text, e.g. impyard task add pip "Summarise the week"')
    channel = request.channel_id if request.channel_id is not None else default_channel(request.imp)
    if not channel or len(channel) > MAX_CHANNEL_CHARS or not _CHANNEL_PATTERN.match(channel):
        raise TaskError(
            f"channel {channel[:60]!r} is not a channel id: 1-{MAX_CHANNEL_CHARS} characters without spaces "
            "(a Discord channel id; leave --channel out for the imp's task log)"
        )
    if channel.startswith(TASK_CHANNEL_PREFIX) and channel != default_channel(request.imp):
        raise TaskError(
            f"channel {channel!r} is another imp's task log; leave --channel out for {default_channel(request.imp)}"
        )
    person = request.person
    if person is not None and (not person or len(person) > MAX_PERSON_CHARS):
        raise TaskError(f"person must be 1-{MAX_PERSON_CHARS} characters")
    return ValidTask(
        imp=request.imp,
        kind=request.kind,
        prompt=prompt,
        person=person,
        origin=request.origin,
        channel_id=channel,
        ceiling_s=parse_ceiling(request.ceiling),
        wake_on_resolve=bool(request.wake_on_resolve),
        briefing=bool(request.briefing),
        scope=_valid_scope(request.scope),
        args=_valid_args(request.args),
    )


def _valid_scope(scope: str | None) -> str | None:
    if scope is None:
        return None
    if (
        not isinstance(scope, str)
        or not 0 < len(scope) <= MAX_SCOPE_CHARS
        or not _CHANNEL_PATTERN.match(scope)
    ):
        raise TaskError(
            f"scope {str(scope)[:60]!r} is not a memory scope: 1-{MAX_SCOPE_CHARS} characters without spaces "
            "(terminal, guild:<server id> or dm:<person id>)"
        )
    return scope


def _valid_args(args: Mapping[str, TaskArg] | None) -> dict[str, TaskArg]:
    """A kind's arguments: at most 16 names (lowercase, as kinds are) of plain values (no list, no object)."""
    if not args:
        return {}
    if len(args) > MAX_ARGS:
        raise TaskError(f"a task takes at most {MAX_ARGS} arguments (got {len(args)})")
    valid: dict[str, TaskArg] = {}
    for name, value in args.items():
        if not isinstance(name, str) or not _ARG_NAME_PATTERN.match(name):
            raise TaskError(
                f"task argument name {str(name)[:60]!r} is not valid: 1-{MAX_ARG_NAME_CHARS} lowercase letters, "
                "digits and underscores, starting with a letter"
            )
        if isinstance(value, str) and (len(value) > MAX_ARG_CHARS or "\x00" in value):
            raise TaskError(f"task argument {name!r} must be at most {MAX_ARG_CHARS} characters, without NUL")
        if isinstance(value, float) and not math.isfinite(value):
            raise TaskError(f"task argument {name!r} must be a finite number")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise TaskError(f"task argument {name!r} must be text, a number, true/false or null")
        valid[name] = value
    return valid
