"""A task request, every field validated before anything is written (``validate_request``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from impyard.durations import DurationError, format_duration, parse_duration
from impyard.errors import ImpyardError
from impyard.imps import ImpStore, validate_name

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


@dataclass(frozen=True)
class ValidTask:
    imp: str
    kind: str
    prompt: str | None
    person: str | None
    origin: Origin
    channel_id: str
    ceiling_s: float
    wake_on_resolve: bool
    briefing: bool


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
    )
