"""Feelings and times in words: what the model reads instead of numbers (mechanisms 9, 12, 13).

The model never sees a valence or an intensity as a number (mechanism 12): a fixed band turns each
into words, the same for every context. Ages are words too, local to the imp's timezone (mechanism
9, subtle point 21), and every reply context carries one absolute clock line. Pure functions: the
time ``now`` is always an argument (mechanism 122); the zone is an IANA name, and an unknown name
falls back to UTC so a typo in imp.toml never breaks a turn.

Aware datetimes are expected (the store speaks UTC); a naive one is read as UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# ------------------------------------------------------------------ mechanism 12: feeling bands

# (lower bound, words), strongest first: strength ≥ .85 / .6 / .4 / .2 / else.
STRENGTH_BANDS: tuple[tuple[float, str], ...] = (
    (0.85, "overwhelming"),
    (0.6, "strong"),
    (0.4, "clearly there"),
    (0.2, "faint"),
)
STRENGTH_BELOW = "barely a trace"


def strength_words(strength: float) -> str:
    """Mechanism 12: a strength (felt or raw intensity, 0–1) in words, by the fixed bands."""
    for floor, words in STRENGTH_BANDS:
        if strength >= floor:
            return words
    return STRENGTH_BELOW


def valence_words(valence: float) -> str:
    """Mechanism 12: a valence (−1–1) in words; bands ≤ −.6 / < −.05 / ≤ .05 / < .6 / else."""
    if valence <= -0.6:
        return "deeply painful, hurting"
    if valence < -0.05:
        return "unpleasant"
    if valence <= 0.05:
        return "neither good nor bad"
    if valence < 0.6:
        return "pleasant"
    return "deeply good, warm"


# Mechanism 13: the fixed anchor scale the reply and appraisal system texts carry, so that
# "0.4" means the same thing to every call that writes an intensity.
INTENSITY_SCALE = """\
Intensity runs from 0.0 to 1.0:
0.0 - nothing stirs at all
0.2 - a slight stir, easy to pass over
0.4 - moderate: clearly felt, but it does not take over
0.6 - strong: it colours what comes after
0.8 - very strong: hard to think past it
1.0 - overwhelming: the most that can be felt"""


# ------------------------------------------------------------------ mechanism 9: time in words

MINUTE_S = 60
HOUR_S = 3_600
WEEK_DAYS = 7  # above this, ages are given in weeks (subtle point 21)
MONTH_DAYS = 30  # months are 30-day units (subtle point 21)
YEAR_DAYS = 365


@lru_cache(maxsize=64)
def local_zone(name: str) -> tzinfo:
    """The IANA zone ``name``; UTC when the name is unknown or malformed (a typo never breaks a turn)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _plural(count: int, unit: str) -> str:
    return f"{count} {unit}" if count == 1 else f"{count} {unit}s"


def age_words(then: datetime, now: datetime, tz: str) -> str:
    """Mechanism 9: how long ago ``then`` was, in words local to ``tz``.

    Under a minute (or in the future): "just now"; under an hour: "N min ago"; on the same local
    day: "N h ago (today at HH:MM)"; on the previous local day — across a month or year boundary
    too — "yesterday at HH:MM"; up to 7 calendar days: "N days ago"; above that weeks, then months
    (30-day units), then years (subtle point 21).
    """
    zone = local_zone(tz)
    then_local, now_local = _aware(then).astimezone(zone), _aware(now).astimezone(zone)
    elapsed_s = (now_local - then_local).total_seconds()
    if elapsed_s < MINUTE_S:
        return "just now"
    if elapsed_s < HOUR_S:
        return f"{int(elapsed_s // MINUTE_S)} min ago"
    clock = then_local.strftime("%H:%M")
    if then_local.date() == now_local.date():
        return f"{int(elapsed_s // HOUR_S)} h ago (today at {clock})"
    if then_local.date() == now_local.date() - timedelta(days=1):
        return f"yesterday at {clock}"
    days = (now_local.date() - then_local.date()).days
    if days <= WEEK_DAYS:
        return f"{_plural(days, 'day')} ago"
    if days < MONTH_DAYS:
        return f"{_plural(days // WEEK_DAYS, 'week')} ago"
    if days < YEAR_DAYS:
        return f"{_plural(days // MONTH_DAYS, 'month')} ago"
    return f"{_plural(days // YEAR_DAYS, 'year')} ago"


def stamp_words(then: datetime, tz: str) -> str:
    """When ``then`` was, as a date and local clock time that do not change as time passes ("2 December 2026,
    14:02"): for a list the model reads again on later calls, so that the prompt cache can serve its start
    (issue 33); the call's clock line, last, says what now is."""
    local = _aware(then).astimezone(local_zone(tz))
    return f"{local.day} {_MONTHS[local.month - 1]} {local.year}, {local.strftime('%H:%M')}"


# English names, not strftime's %A/%B: those follow the process locale.
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December")  # fmt: skip


def clock_line(now: datetime, tz: str) -> str:
    """Mechanism 9: the absolute date, local clock time (with zone and UTC offset) and unix time.

    E.g. "Wednesday, 2 December 2026, 11:00 (Europe/Berlin, UTC+01:00); unix time 1796205600".
    An unknown zone shows as UTC, the zone actually used.
    """
    zone = local_zone(tz)
    local = _aware(now).astimezone(zone)
    offset = local.strftime("%z")
    zone_name = tz if zone is not UTC else "UTC"
    return (
        f"{_WEEKDAYS[local.weekday()]}, {local.day} {_MONTHS[local.month - 1]} {local.year}, "
        f"{local.strftime('%H:%M')} ({zone_name}, UTC{offset[:3]}:{offset[3:]}); "
        f"unix time {int(_aware(now).timestamp())}"
    )
