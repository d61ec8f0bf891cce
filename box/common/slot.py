"""The accessibility slot: what the imp holds in mind now (mechanisms 84-89; subtle point 13). Pure.

Both sides import it, like ``box.common.laws``: the host applies these rules atomically when a box forms or
refreshes a construct (``memory.construct``, ``memory.slot.refresh``) and when it loads the slot
(``memory.slot``); the box renders what the host returns. The slot is kept per imp **and per scope**: a
thought formed in a DM is held in the DM's slot and never shown in a guild (docs/memory.md).

* Size 3 (``slot_size``; 0 disables the slot, an ablation). Decisions, goals and dreams share one reserved
  place: a newer one replaces the held one (84). Beliefs and thoughts use the free places: all of them while
  no act is held; an arriving act then displaces the oldest free entry.
* A free-place newcomer into a full set enters only if at least as strong as the weakest held free entry,
  and then displaces the oldest (not the weakest) (85).
* Re-activating a held construct only refreshes its activation time (86).
* On load, entries not activated for ``slot_days`` (7) or deleted from the store leave; a slot over size
  keeps the newest (87). The slot is ordered by activation time, oldest first.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from box.common.laws import DEFAULTS

RESERVED_KINDS = frozenset({"decision", "goal", "dream"})  # mechanism 84: one reserved place for the act


@dataclass(frozen=True)
class Held:
    """One construct in the slot: its id, kind, stored intensity and last activation."""

    id: str
    kind: str  # thought | belief | decision | goal | dream
    intensity: float
    activated_at: datetime

    @property
    def is_act(self) -> bool:
        return self.kind in RESERVED_KINDS


def ordered(held: Sequence[Held]) -> list[Held]:
    """By activation time, oldest first (ties keep their order)."""
    return sorted(held, key=lambda h: h.activated_at)


def activate(held: Sequence[Held], new: Held, size: int = DEFAULTS.slot_size) -> list[Held]:
    """Mechanisms 84-86: the slot after ``new`` is brought to mind (formed, recurring or recalled)."""
    if size <= 0:
        return []
    current = ordered(held)
    for i, h in enumerate(current):
        if h.id == new.id:  # mechanism 86: a re-activation refreshes the time only
            current[i] = replace(h, activated_at=max(h.activated_at, new.activated_at))
            return ordered(current)
    if new.is_act:  # mechanism 84: the newer act replaces the held one
        slot = [h for h in current if not h.is_act] + [new]
        while len(slot) > size:  # subtle point 13: the act displaces the oldest free entry
            oldest_free = next(h for h in slot if not h.is_act)
            slot.remove(oldest_free)
        return ordered(slot)
    acts = [h for h in current if h.is_act]
    free = [h for h in current if not h.is_act]
    places = size - len(acts)
    if places <= 0:
        return ordered(current)
    if len(free) < places:
        return ordered([*current, new])
    if new.intensity < min(h.intensity for h in free):  # mechanism 85: weaker than every held one
        return ordered(current)
    oldest = free[0]  # mechanism 85: displaces the oldest held, not the weakest
    return ordered([h for h in current if h is not oldest] + [new])


def loaded(
    held: Sequence[Held],
    now: datetime,
    existing: Collection[str] | None = None,
    size: int = DEFAULTS.slot_size,
    days: float = DEFAULTS.slot_days,
) -> list[Held]:
    """Mechanism 87 (subtle point 13): the slot as loaded — a week unrefreshed or deleted leaves; over size
    keeps the newest. ``existing``: the ids still in the store (None: do not check)."""
    if size <= 0:
        return []
    cutoff = now - timedelta(days=days)
    kept = [h for h in ordered(held) if h.activated_at >= cutoff and (existing is None or h.id in existing)]
    return kept[-size:] if len(kept) > size else kept
