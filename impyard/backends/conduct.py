"""How much noise one box may make on the host: log lines and refused requests (issue 11 #8).

A box is hostile until proven otherwise, and the operator's terminal, the host's
log and the audit table are shared by every box. So each box gets a budget per
kind of noise — a burst, then a steady rate — identical lines in a row are
folded into one count, what is over the budget is dropped and counted, and a
box that keeps going past the budget is killed. Box text that does reach the
host's log is made printable first: no newline or control character in it can
forge a line of the host's own.

The rules here are pure (a clock is passed in); ``RunningBox`` applies them.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

MAX_SHOWN_CHARS = 2000  # a box's log line as the host shows it, at most


@dataclass(frozen=True)
class NoiseLimits:
    """One kind of noise: ``burst`` at once, then ``per_s``; killed after ``kill_after`` suppressed."""

    burst: int
    per_s: float
    kill_after: int


LOG_LIMITS = NoiseLimits(burst=200, per_s=10.0, kill_after=2000)
REFUSAL_LIMITS = NoiseLimits(burst=30, per_s=1.0, kill_after=200)


@dataclass(frozen=True)
class HeldBack:
    """What a meter did not show since its last shown event: ``repeats`` of that event (``key``), and
    ``dropped`` events over the budget (of any key)."""

    key: str | None
    repeats: int
    dropped: int

    def __bool__(self) -> bool:
        return bool(self.repeats or self.dropped)


@dataclass(frozen=True)
class Admission:
    """What to do with one event: show it (after ``summary``, if any: what was held back before it, ``held``),
    or not; kill the box or not."""

    show: bool
    summary: str | None = None
    kill: bool = False
    held: HeldBack | None = None


def times(count: int, one: str, many: str | None = None) -> str:
    """``1 time``, ``2 times``: a count with its noun in the right number."""
    return f"{count} {one if count == 1 else many or one + 's'}"


class NoiseMeter:
    """A token bucket with repeat folding for one box and one kind of noise."""

    def __init__(self, limits: NoiseLimits, now: Callable[[], float], what: str = "line") -> None:
        """``what``: one event, in words (``log line``); the plural adds an s."""
        self.limits = limits
        self.now = now
        self.what = what
        self._tokens = float(limits.burst)
        self._refilled_at = now()
        self._last: str | None = None
        self._repeats = 0  # the last shown line came again this often, not shown
        self._dropped = 0  # over the budget since the last shown line, not shown
        self.suppressed = 0  # repeats + dropped over the box's whole life
        self.killed = False

    def admit(self, key: str) -> Admission:
        """One event whose identity is ``key`` (the text of a log line, the kind of a refusal)."""
        if self.killed:
            return Admission(show=False)
        if key == self._last:
            self._repeats += 1
            return self._suppress()
        self._refill()
        if self._tokens < 1.0:
            self._dropped += 1
            return self._suppress()
        self._tokens -= 1.0
        held = self.take_held()
        self._last = key
        return Admission(show=True, summary=self.words(held), held=held or None)

    @property
    def held(self) -> HeldBack:
        return HeldBack(self._last, self._repeats, self._dropped)

    def words(self, held: HeldBack) -> str | None:
        """What was not shown since the last shown line, in words; None when nothing was held back."""
        parts = []
        if held.repeats:
            parts.append(f"the previous one repeated {times(held.repeats, 'more time')}")
        if held.dropped:
            parts.append(f"{times(held.dropped, self.what)} dropped ({self.budget()})")
        return "; ".join(parts) or None

    def budget(self) -> str:
        return f"over {self.limits.burst} at once, then {self.limits.per_s:g}/s"

    def summary(self) -> str | None:
        return self.words(self.held)

    def take_held(self) -> HeldBack:
        """What is held back now, counted once: the counts start again from nothing."""
        held = self.held
        self._repeats = self._dropped = 0
        return held

    def flush(self) -> str | None:
        """At the box's end: the summary of what is still held back, once."""
        return self.words(self.take_held())

    def _suppress(self) -> Admission:
        self.suppressed += 1
        if self.suppressed > self.limits.kill_after:
            self.killed = True  # what was held back is told once, by ``flush`` at the box's end
            return Admission(show=False, kill=True)
        return Admission(show=False)

    def _refill(self) -> None:
        now = self.now()
        elapsed = max(0.0, now - self._refilled_at)
        self._refilled_at = now
        self._tokens = min(float(self.limits.burst), self._tokens + elapsed * self.limits.per_s)


def folded_refusals(held: HeldBack, budget: str) -> str | None:
    """The reason of a ``(folded)`` audit row: the refusals held back since the last one recorded, counted and
    named (issue 38: not "the previous one", which is no row of the audit table); None when none were."""
    parts = []
    if held.repeats and held.key is not None:
        method, _, code = held.key.rpartition(":")
        parts.append(f"{method} refused {times(held.repeats, 'more time')} the same way ({code})")
    if held.dropped:
        parts.append(f"{times(held.dropped, 'more refusal')} over the budget ({budget})")
    return f"refusals not recorded one by one: {'; '.join(parts)}" if parts else None


def printable(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """Box text made safe for one line of the host's log: control and format characters escaped, bounded.

    Newlines, carriage returns, escape sequences, and invisible format characters (bidi overrides, line
    separators) become visible ``\\xNN`` / ``\\uNNNN`` escapes, so a box can neither start a forged line nor
    repaint the operator's terminal.
    """
    out: list[str] = []
    size = 0
    for char in text:
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            code = ord(char)
            piece = (
                f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
        else:
            piece = char
        size += len(piece)
        if size > limit:
            out.append("…")
            break
        out.append(piece)
    return "".join(out)
