"""Feelings and times in words (box/memory/words.py): bands at their edges, ages in pinned zones."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from box.memory.words import INTENSITY_SCALE, age_words, clock_line, local_zone, strength_words, valence_words

# 10:00 UTC is 11:00 in Berlin (UTC+1 in December) and 05:00 in New York (UTC−5).
NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("strength", "words"),
    [
        (1.0, "overwhelming"),
        (0.85, "overwhelming"),
        (0.849, "strong"),
        (0.6, "strong"),
        (0.599, "clearly there"),
        (0.4, "clearly there"),
        (0.399, "faint"),
        (0.2, "faint"),
        (0.199, "barely a trace"),
        (0.0, "barely a trace"),
    ],
)
def test_m12_strength_bands(strength: float, words: str) -> None:
    assert strength_words(strength) == words


@pytest.mark.parametrize(
    ("valence", "words"),
    [
        (-1.0, "deeply painful, hurting"),
        (-0.6, "deeply painful, hurting"),
        (-0.599, "unpleasant"),
        (-0.051, "unpleasant"),
        (-0.05, "neither good nor bad"),
        (0.0, "neither good nor bad"),
        (0.05, "neither good nor bad"),
        (0.051, "pleasant"),
        (0.599, "pleasant"),
        (0.6, "deeply good, warm"),
        (1.0, "deeply good, warm"),
    ],
)
def test_m12_valence_bands(valence: float, words: str) -> None:
    assert valence_words(valence) == words


@pytest.mark.parametrize("value", [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, -1.0, -0.6, 0.05])
def test_m12_words_carry_no_numbers(value: float) -> None:
    assert not re.search(r"\d", strength_words(abs(value)) + valence_words(value))


def test_m13_intensity_scale_anchors_zero_to_one() -> None:
    for anchor in ("0.0", "0.2", "0.4", "0.6", "0.8", "1.0"):
        assert f"\n{anchor} - " in f"\n{INTENSITY_SCALE}"
    assert "moderate" in INTENSITY_SCALE and "overwhelming" in INTENSITY_SCALE


@pytest.mark.parametrize(
    ("then", "tz", "words"),
    [
        (NOW - timedelta(seconds=30), "Europe/Berlin", "just now"),
        (NOW - timedelta(seconds=59), "Europe/Berlin", "just now"),
        (NOW + timedelta(minutes=5), "Europe/Berlin", "just now"),  # a clock skew is not the future
        (NOW - timedelta(seconds=60), "Europe/Berlin", "1 min ago"),
        (NOW - timedelta(minutes=59, seconds=59), "Europe/Berlin", "59 min ago"),
        (NOW - timedelta(hours=3), "Europe/Berlin", "3 h ago (today at 08:00)"),
        (NOW - timedelta(hours=3, minutes=58), "Europe/Berlin", "3 h ago (today at 07:02)"),
        # 23:30 UTC on 1 December is 00:30 on 2 December in Berlin, but still 1 December in UTC.
        (datetime(2026, 12, 1, 23, 30, tzinfo=UTC), "Europe/Berlin", "10 h ago (today at 00:30)"),
        (datetime(2026, 12, 1, 23, 30, tzinfo=UTC), "UTC", "yesterday at 23:30"),
        (datetime(2026, 12, 1, 22, 30, tzinfo=UTC), "Europe/Berlin", "yesterday at 23:30"),
        # 05:00 in New York: 03:00 UTC is 22:00 the day before there.
        (datetime(2026, 12, 2, 3, 0, tzinfo=UTC), "America/New_York", "yesterday at 22:00"),
        (datetime(2026, 11, 30, 10, 0, tzinfo=UTC), "Europe/Berlin", "2 days ago"),
        (NOW - timedelta(days=7), "Europe/Berlin", "7 days ago"),
        (NOW - timedelta(days=8), "Europe/Berlin", "1 week ago"),
        (NOW - timedelta(days=14), "Europe/Berlin", "2 weeks ago"),
        (NOW - timedelta(days=29), "Europe/Berlin", "4 weeks ago"),
        (NOW - timedelta(days=30), "Europe/Berlin", "1 month ago"),
        (NOW - timedelta(days=95), "Europe/Berlin", "3 months ago"),
        (NOW - timedelta(days=364), "Europe/Berlin", "12 months ago"),
        (NOW - timedelta(days=365), "Europe/Berlin", "1 year ago"),
        (NOW - timedelta(days=800), "Europe/Berlin", "2 years ago"),
    ],
)
def test_m9_age_words(then: datetime, tz: str, words: str) -> None:
    assert age_words(then, NOW, tz) == words


def test_m9_yesterday_across_a_year_boundary() -> None:
    now = datetime(2027, 1, 1, 9, 0, tzinfo=UTC)  # 10:00 on New Year's Day in Berlin
    assert age_words(datetime(2026, 12, 31, 8, 10, tzinfo=UTC), now, "Europe/Berlin") == "yesterday at 09:10"


def test_m9_two_days_across_a_year_boundary() -> None:
    now = datetime(2027, 1, 1, 9, 0, tzinfo=UTC)
    assert age_words(datetime(2026, 12, 30, 8, 10, tzinfo=UTC), now, "Europe/Berlin") == "2 days ago"


def test_m9_naive_times_are_read_as_utc() -> None:
    assert age_words(datetime(2026, 12, 2, 7, 0), NOW, "Europe/Berlin") == "3 h ago (today at 08:00)"


@pytest.mark.parametrize("tz", ["Nowhere/Atlantis", "", "../../etc/passwd", "/etc/localtime"])
def test_m9_unknown_timezone_falls_back_to_utc(tz: str) -> None:
    assert local_zone(tz) is UTC
    assert age_words(datetime(2026, 12, 1, 23, 30, tzinfo=UTC), NOW, tz) == "yesterday at 23:30"


def test_m9_clock_line_shows_date_time_zone_and_unix_time() -> None:
    assert clock_line(NOW, "Europe/Berlin") == (
        "Wednesday, 2 December 2026, 11:00 (Europe/Berlin, UTC+01:00); unix time 1796205600"
    )
    assert clock_line(NOW, "America/New_York") == (
        "Wednesday, 2 December 2026, 05:00 (America/New_York, UTC-05:00); unix time 1796205600"
    )


def test_m9_clock_line_in_an_unknown_zone_says_utc() -> None:
    assert clock_line(NOW, "Mars/Olympus") == (
        "Wednesday, 2 December 2026, 10:00 (UTC, UTC+00:00); unix time 1796205600"
    )


def test_m9_clock_line_in_summer_time() -> None:
    summer = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
    assert clock_line(summer, "Europe/Berlin") == (
        "Wednesday, 1 July 2026, 14:00 (Europe/Berlin, UTC+02:00); unix time 1782907200"
    )
