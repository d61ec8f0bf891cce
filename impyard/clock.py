"""Time for the host: a Clock protocol, the system clock, and a fixed movable clock for tests (docs/contributing.md).

Every rule that depends on time (budget windows, gate deadlines, rate limits)
asks a Clock, never ``datetime.now`` directly, so tests can move time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class FixedClock:
    """A clock that stands still until a test moves it."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("FixedClock needs a timezone-aware start time")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta | None = None, **parts: float) -> datetime:
        """Move forward by ``delta`` or by keyword parts (``hours=25``); returns the new time."""
        self._now += (delta or timedelta()) + timedelta(**parts)
        return self._now

    def set(self, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError("FixedClock.set needs a timezone-aware time")
        self._now = when.astimezone(UTC)


def iso(when: datetime) -> str:
    """The one text form of a time in the database: ISO-8601 UTC, sortable as text."""
    return when.astimezone(UTC).isoformat(timespec="microseconds")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)
