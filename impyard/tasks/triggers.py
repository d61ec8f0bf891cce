"""Schedule triggers (issue 8): when a recurring task fires, as pure functions of plain values, so their tests are
tables on a fixed clock.

A schedule fires ``every`` a fixed interval (counted from its anchor) or on a ``cron`` expression in a timezone
(croniter, zoneinfo):

* ``first_run``: no immediate first fire unless asked (``--now``).
* ``next_after``: the next fire time is computed from the *scheduled* time,
  never from when the last run finished, so a slow run does not drift the
  schedule.
* ``due_runs``: after downtime, the missed-run policy decides what still runs:
  ``skip`` (only a run that is due right now), ``once`` (one run for the lot;
  the default) or ``all`` (every missed run, bounded).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from impyard.durations import DurationError, format_duration, parse_duration
from impyard.errors import ImpyardError

MissedPolicy = Literal["skip", "once", "all"]
MISSED_POLICIES: tuple[MissedPolicy, ...] = ("skip", "once", "all")
DEFAULT_MISSED: MissedPolicy = "once"
MIN_EVERY = timedelta(minutes=1)
MAX_EVERY = timedelta(days=366)
ON_TIME = timedelta(
    seconds=60
)  # a fire this late still counts as "now", not as missed (the loop ticks every second)
MAX_CATCH_UP = 100  # ``all`` runs at most this many missed fires; the older ones are dropped (and logged)
MAX_QUEUED_PER_SCHEDULE = 10  # a schedule whose tasks cannot keep up stops piling more onto the queue

_CRON_ALIASES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})


class ScheduleError(ImpyardError, ValueError):
    """A schedule that cannot be accepted (or found); the message is one line that says what to do."""


# ------------------------------------------------------------------ parsing (pure)


def parse_every(text: str) -> timedelta:
    try:
        every = parse_duration(text, what="--every")
    except DurationError as exc:
        raise ScheduleError(str(exc)) from None
    if not MIN_EVERY <= every <= MAX_EVERY:
        raise ScheduleError(
            f"--every {text!r} is out of range: a schedule fires at most every {format_duration(MIN_EVERY)} "
            f"and at least every {format_duration(MAX_EVERY)}"
        )
    return every


def parse_timezone(name: str) -> ZoneInfo:
    """An IANA timezone; an unknown one is refused (never silently UTC)."""
    text = str(name).strip()
    if not text or len(text) > 64 or text.startswith(("/", ".")) or ".." in text:
        raise ScheduleError(
            f"unknown timezone {name!r}: use an IANA name such as Europe/Oslo, America/New_York or UTC"
        )
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"unknown timezone {name!r}: use an IANA name such as Europe/Oslo, America/New_York or UTC"
        ) from None


def parse_cron(expression: str) -> str:
    """Five fields (minute hour day-of-month month day-of-week) or an alias like ``@daily``."""
    text = " ".join(str(expression).split())
    fields = text.split(" ")
    if text.lower() in _CRON_ALIASES:
        return text.lower()
    if len(fields) != 5:
        raise ScheduleError(
            f"cron expression {expression!r} does not parse: it needs 5 fields (minute hour day month weekday), "
            'e.g. "0 9 * * 1-5" for 09:00 on weekdays'
        )
    try:
        croniter(text, datetime(2000, 1, 1, tzinfo=UTC))
    except (CroniterBadCronError, CroniterError, ValueError, KeyError) as exc:
        raise ScheduleError(
            f"cron expression {expression!r} does not parse ({str(exc)[:120]}): "
            'write 5 fields, e.g. "0 9 * * 1-5" for 09:00 on weekdays'
        ) from None
    return text


def parse_missed(value: str) -> MissedPolicy:
    text = str(value).strip().lower()
    if text not in MISSED_POLICIES:
        raise ScheduleError(f"unknown missed-run policy {value!r}: use skip, once (the default) or all")
    return text


# ------------------------------------------------------------------ the trigger and its rules (pure)


@dataclass(frozen=True)
class Trigger:
    """When a schedule fires: ``every`` (from ``anchor``) xor ``cron`` (in ``tz``)."""

    every: timedelta | None = None
    cron: str | None = None
    tz: str = "UTC"
    anchor: datetime | None = None  # every: fire times are anchor + k * every

    def __post_init__(self) -> None:
        if (self.every is None) == (self.cron is None):
            raise ScheduleError("a schedule needs exactly one of --every and --cron")
        if self.every is not None and self.anchor is None:
            raise ScheduleError("an every-schedule needs an anchor time")

    def describe(self) -> str:
        if self.every is not None:
            return f"every {format_duration(self.every)}"
        return f"cron {self.cron}" + ("" if self.tz == "UTC" else f" ({self.tz})")


def _is_second_occurrence(local: datetime, zone: ZoneInfo) -> bool:
    """True for the repeat of a wall-clock time when DST ends (the hour that happens twice)."""
    naive = local.replace(tzinfo=None)
    first = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    return first != local.astimezone(UTC)


def next_after(trigger: Trigger, after: datetime) -> datetime:
    """The first fire time strictly after ``after`` (UTC in, UTC out).

    cron: in the trigger's timezone; a wall time skipped when DST starts fires at
    the first moment after the jump, and one that happens twice when DST ends
    fires once, at its first occurrence.
    """
    after = after.astimezone(UTC)
    if trigger.every is not None:
        assert trigger.anchor is not None
        anchor = trigger.anchor.astimezone(UTC)
        if after < anchor:
            return anchor
        periods = int((after - anchor) / trigger.every) + 1
        return anchor + periods * trigger.every
    assert trigger.cron is not None
    zone = parse_timezone(trigger.tz)
    iterator = croniter(trigger.cron, after.astimezone(zone))
    for _ in range(4):  # at most one repeat to skip; the bound is only a guard
        try:
            candidate: datetime = iterator.get_next(datetime)
        except CroniterBadDateError:
            raise ScheduleError(
                f"cron expression {trigger.cron!r} never fires (e.g. a day that does not exist)"
            ) from None
        if not _is_second_occurrence(candidate, zone):
            return candidate.astimezone(UTC)
    raise ScheduleError(
        f"cron expression {trigger.cron!r}: no next fire time could be found"
    )  # pragma: no cover


def first_run(trigger: Trigger, created: datetime, *, now: bool = False) -> datetime:
    """When a new schedule first fires: at ``created`` only if asked, else its first fire time after it."""
    return created.astimezone(UTC) if now else next_after(trigger, created)


def recent_fires(
    trigger: Trigger, after: datetime, until: datetime, limit: int
) -> tuple[list[datetime], bool]:
    """The newest ``limit`` fire times in (after, until], oldest first, and whether that is all of them.

    Bounded work however long the downtime: arithmetic for ``every``, a walk
    backwards from ``until`` for cron.
    """
    after, until = after.astimezone(UTC), until.astimezone(UTC)
    if until <= after or limit <= 0:
        return [], until <= after
    if trigger.every is not None:
        assert trigger.anchor is not None
        anchor = trigger.anchor.astimezone(UTC)
        if until < anchor:
            return [], True
        last = (until - anchor) // trigger.every
        first = 0 if after < anchor else (after - anchor) // trigger.every + 1
        if first > last:
            return [], True
        start = max(first, last - limit + 1)
        return [anchor + k * trigger.every for k in range(start, last + 1)], start == first
    assert trigger.cron is not None
    zone = parse_timezone(trigger.tz)
    iterator = croniter(trigger.cron, (until + timedelta(seconds=1)).astimezone(zone))
    newest_first: list[datetime] = []
    while len(newest_first) <= limit:
        try:
            candidate: datetime = iterator.get_prev(datetime)
        except CroniterBadDateError:
            return list(reversed(newest_first)), True
        if _is_second_occurrence(candidate, zone):
            continue
        when = candidate.astimezone(UTC)
        if when > until:
            continue
        if when <= after:
            return list(reversed(newest_first)), True
        newest_first.append(when)
    return list(reversed(newest_first[:limit])), False


@dataclass(frozen=True)
class DueRuns:
    """What a due schedule does now: enqueue a task per ``fire`` time, then wait for ``next_run``."""

    fire: tuple[datetime, ...]
    next_run: datetime
    missed: (
        int  # fire times that passed without a run (dropped by the policy); a lower bound after long downtime
    )


def due_runs(
    trigger: Trigger, next_run: datetime, now: datetime, policy: MissedPolicy, *, on_time: timedelta = ON_TIME
) -> DueRuns:
    """Apply the missed-run policy to the fire times from ``next_run`` up to ``now``.

    A fire time at most ``on_time`` old is due now and runs under every policy;
    older ones were missed (downtime): ``skip`` drops them, ``once`` runs one
    (attributed to the latest) for the lot, ``all`` runs each (the newest
    MAX_CATCH_UP). The next run is the first fire time after ``now``: counted
    from the schedule, never from when a run finished.
    """
    next_run, now = next_run.astimezone(UTC), now.astimezone(UTC)
    if next_run > now:
        return DueRuns((), next_run, 0)
    later, complete = recent_fires(trigger, next_run, now, MAX_CATCH_UP)
    times = (
        [next_run] if complete else []
    ) + later  # next_run is a fire time by definition (or the --now fire)
    total = len(times) if complete else len(times) + 1
    times = times[-MAX_CATCH_UP:]
    if policy == "skip":
        fire = [when for when in times if now - when <= on_time][-1:]
    elif policy == "once":
        fire = times[-1:]
    else:
        fire = times
    return DueRuns(tuple(fire), next_after(trigger, now), total - len(fire))
