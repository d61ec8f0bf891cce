"""Durations as an operator writes them: ``90s``, ``10m``, ``1h30m``, ``24h``, ``2d`` (task ceilings, schedules)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from impyard.errors import ImpyardError

_PART = r"(\d+(?:\.\d+)?)(d|h|m|s)"
_UNIT_S = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}


class DurationError(ImpyardError, ValueError):
    """Text that is not a duration; the message says how to write one."""


def parse_duration(text: str | float, *, what: str = "duration") -> timedelta:
    """``90s``, ``10m``, ``1h30m``, ``24h``, ``2d``, or a bare number of seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return timedelta(seconds=float(text))
    raw = str(text).strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        return timedelta(seconds=float(raw))
    if raw and re.fullmatch(f"(?:{_PART})+", raw):
        return timedelta(seconds=sum(float(n) * _UNIT_S[unit] for n, unit in re.findall(_PART, raw)))
    raise DurationError(f"{what} {str(text)[:40]!r} is not a duration: write e.g. 90s, 10m, 1h30m, 24h or 2d")


def format_duration(value: timedelta | float) -> str:
    """The short form ``parse_duration`` reads back: ``1d``, ``1h30m``, ``45s``."""
    seconds = int(round(value.total_seconds() if isinstance(value, timedelta) else value))
    if seconds <= 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)


def relative_time(when: datetime, now: datetime) -> str:
    """``when`` as an operator reads it beside ``now``: ``in 26s``, ``4s ago``, ``now`` (within a second)."""
    delta = when - now
    if abs(delta.total_seconds()) < 1:
        return "now"
    return f"in {format_duration(delta)}" if delta.total_seconds() > 0 else f"{format_duration(-delta)} ago"
