"""The imp's night in the box: consolidation, then forgetting (mechanisms 107-114; subtle points 16, 17, 20).

A ``sleep`` task runs one night over one scope (the host opens the box with writes = reads = that scope):

1. ``memory.night(since)``: the records that happened since the imp woke, newest first, 6 episodes each (107).
2. With ≥ 2 of them, one consolidation plan call (purpose "sleep", temperature 0.3, 108): the records
   numbered oldest first, each at its **stored** intensity in words (subtle point 20), with its age and what
   happened; constructs and given records are marked protected (113). The plan proposes groups
   ``{"anchor": n, "absorbed": [n, …], "summary_fact": "…"}``.
3. The code checks every group (subtle point 16): the anchor is not a construct and has stored intensity
   ≥ 0.4 (a given record may anchor); a member is not protected, not the anchor, not stronger than the
   anchor and not absorbed already. What passes goes to ``memory.consolidate``, where the host applies the
   same checks again, re-files the members' episodes under the anchor (109), combines the intensities
   (110) and deletes the members. ``summary_fact`` is read by no one (111).
4. ``memory.forget()``: the forgetting curve over the scope (112-113).

``consolidate=False`` (the manual night without the flag, 114) only forgets. A model failure folds nothing
and still forgets. A store that does not answer fails the night, after forgetting was still tried.

The idle reflection's scene (105-106) lives here too: the imp's day, as the box sees it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from box.common.laws import DEFAULTS, Params
from box.memory.calls import TEMPERATURE_SLEEP, MemoryModel
from box.memory.contexts import Scene, construct_statement
from box.memory.focus import cut
from box.memory.prompts import Prompts
from box.memory.store_client import StoreClient, StoreUnavailable
from box.memory.words import age_words, clock_line, strength_words, valence_words
from box.protocol.memory import MAX_GROUPS, MAX_MEMBERS, RecordView
from box.protocol.models import BoxInitParams, MemoryPurpose

log = logging.getLogger("box.memory.night")

HostLog = Callable[[str, str], Awaitable[None]]  # (level, message), as the engine's

PURPOSE: MemoryPurpose = "sleep"
NIGHT_EPISODES = 6  # seed 002: the sleep lists 6 episodes per record
MINIMUM_RECORDS = 2  # mechanism 108: a plan needs at least 2 records
FEELING_CHARS = 200
CONCLUSION_CHARS = 600
STATEMENT_CHARS = 400
EVENT_CHARS = 300
PLAN_CHARS = 120_000  # the plan's user text: fewer events per record until it fits
DM_PREFIX = "DM with "  # how the host names a direct-message channel (impyard/discord/inbound.py)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "groups": {
            "type": "array",
            "maxItems": 20,  # issue 33: a bounded plan (it folds the day's records, a few groups)
            "items": {
                "type": "object",
                "properties": {
                    "anchor": {"type": "integer"},
                    "absorbed": {"type": "array", "items": {"type": "integer"}, "maxItems": 20},
                    "summary_fact": {"type": "string", "maxLength": 300},  # asked for, never used (111)
                },
                "required": ["anchor", "absorbed", "summary_fact"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["groups"],
    "additionalProperties": False,
}


class NightFailed(Exception):
    """The memory store did not answer during a night; the task fails and says why."""


# ------------------------------------------------------------------ the plan (108, 111)


@dataclass(frozen=True)
class Proposed:
    """One group as the plan proposed it: 1-based numbers of the records shown."""

    anchor: int
    absorbed: tuple[int, ...]


def _number(value: object) -> int | None:
    """A record's number as the model wrote it: 3, 3.0, "3" or "[3]"; anything else is no number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip("[] ").isdigit():
        return int(value.strip("[] "))
    return None


def read_plan(answer: dict[str, Any] | None) -> list[Proposed]:
    """Mechanism 108: the proposed groups, in order; a group without a readable anchor is dropped, and
    ``summary_fact`` is not even read (111)."""
    if answer is None or not isinstance(answer.get("groups"), list):
        return []
    plan: list[Proposed] = []
    for group in answer["groups"]:
        if not isinstance(group, dict):
            continue
        anchor = _number(group.get("anchor"))
        absorbed = group.get("absorbed")
        if anchor is None or not isinstance(absorbed, list):
            continue
        members = tuple(n for n in (_number(a) for a in absorbed) if n is not None)
        plan.append(Proposed(anchor, members))
    return plan


# ------------------------------------------------------------------ the code's checks (subtle point 16)


def protected(record: RecordView) -> bool:
    """Mechanism 113: constructs and given records are never absorbed (nor forgotten); nor are kept
    records, what someone told the imp that lasts (issue 32, a departure from the seed)."""
    return record.kind == "construct" or record.origin in ("given", "kept")


def may_anchor(record: RecordView, intensity: float, params: Params = DEFAULTS) -> bool:
    """Mechanism 108: not a construct, stored intensity ≥ 0.4; a given record may anchor (113). A kept
    record may not (issue 32): folding small talk into it would keep the small talk for ever."""
    return record.kind != "construct" and record.origin != "kept" and intensity >= params.anchor_minimum


def may_join(member: RecordView, intensity: float, anchor: RecordView, anchor_intensity: float) -> bool:
    """Mechanism 108: a member is not protected, not the anchor and not stronger than the anchor."""
    return not protected(member) and member.id != anchor.id and intensity <= anchor_intensity


def combined(intensities: Sequence[float]) -> float:
    """Mechanism 110: 1 − Π(1 − I) over the anchor and its members."""
    rest = 1.0
    for intensity in intensities:
        rest *= 1.0 - intensity
    return 1.0 - rest


@dataclass
class Checked:
    """The groups that passed the checks, as (anchor id, member ids), and how many were refused."""

    groups: list[tuple[str, list[str]]] = field(default_factory=list)
    refused: int = 0  # members, and whole groups whose anchor failed


def check(plan: Sequence[Proposed], shown: Sequence[RecordView], params: Params = DEFAULTS) -> Checked:
    """Subtle point 16: the plan's groups through the code's rules, in order, as the store will apply them —
    a record absorbed by an earlier group is gone, and an anchor that took members is the stronger for it."""
    checked = Checked()
    strength = {r.id: r.intensity for r in shown}
    absorbed: set[str] = set()
    for group in plan[:MAX_GROUPS]:
        if not 1 <= group.anchor <= len(shown):
            checked.refused += 1
            continue
        anchor = shown[group.anchor - 1]
        if anchor.id in absorbed or not may_anchor(anchor, strength[anchor.id], params):
            checked.refused += 1
            continue
        members: list[str] = []
        for number in group.absorbed:
            member = shown[number - 1] if 1 <= number <= len(shown) else None
            if (
                member is None
                or member.id in absorbed
                or len(members) >= MAX_MEMBERS
                or not may_join(member, strength[member.id], anchor, strength[anchor.id])
            ):
                checked.refused += 1
                continue
            members.append(member.id)
            absorbed.add(member.id)
        if not members:
            continue  # a group left with no member changes nothing
        strength[anchor.id] = combined([strength[anchor.id], *(strength[m] for m in members)])
        checked.groups.append((anchor.id, members))
    return checked


# ------------------------------------------------------------------ the plan's context (subtle point 20)


def _mark(prompts: Prompts, model: str | None, record: RecordView) -> str:
    if record.kind == "construct":
        return " — " + prompts.render("night.protected_construct", model)
    if record.origin == "given":
        return " — " + prompts.render("night.protected_given", model)
    if record.origin == "kept":
        return " — " + prompts.render("night.protected_kept", model)
    return ""


def record_line(
    prompts: Prompts, model: str | None, index: int, record: RecordView, now: datetime, tz: str, episodes: int
) -> str:
    """One numbered record: raw stored intensity in words (subtle point 20), its age, what happened (retold)."""
    age = age_words(record.happened_at, now, tz)
    valence, strength = valence_words(record.valence), strength_words(record.intensity)
    if record.kind == "construct":
        return prompts.render(
            "night.construct", model, index=index, statement=cut(construct_statement(record), STATEMENT_CHARS),
            valence=valence, strength=strength, age=age, mark=_mark(prompts, model, record),
        )  # fmt: skip
    events = "".join(
        "\n"
        + prompts.render(
            "night.event",
            model,
            age=age_words(ep.happened_at, now, tz),
            text=cut(ep.told or ep.as_happened, EVENT_CHARS).replace("\n", "\n      "),
        )
        for ep in record.episodes[:episodes]
    )
    who = "" if record.origin == "given" else prompts.render("night.with", model, author=record.author) + "; "
    return prompts.render(
        "night.record", model, index=index, valence=valence, strength=strength,
        feeling=cut(record.feeling, FEELING_CHARS), conclusion=cut(record.conclusion, CONCLUSION_CHARS),
        who=who, age=age, mark=_mark(prompts, model, record), events=events,
    )  # fmt: skip


def plan_user(
    prompts: Prompts, model: str | None, shown: Sequence[RecordView], now: datetime, tz: str
) -> str:
    """The plan's user text: the records numbered oldest first; fewer events each when it runs too long."""
    text = ""
    for episodes in (NIGHT_EPISODES, 3, 1, 0):
        lines = [record_line(prompts, model, n, r, now, tz, episodes) for n, r in enumerate(shown, start=1)]
        text = prompts.render(
            "night.user", model, clock=clock_line(now, tz), count=len(shown), lines="\n".join(lines)
        )
        if len(text) <= PLAN_CHARS:
            break
    return text


def plan_system(prompts: Prompts, model: str | None, imp: str) -> str:
    return prompts.render("night.system", model, imp=imp)


# ------------------------------------------------------------------ the night (107, 114)


@dataclass
class NightReport:
    """What came of one night, for the task's summary."""

    consolidate: bool
    records: int = 0  # records since waking
    planned: bool = False  # a plan call was made and answered
    groups: int = 0
    absorbed: int = 0
    episodes: int = 0  # episodes re-filed
    refused: int = 0
    forgotten: int = 0
    forgotten_episodes: int = 0
    failures: list[str] = field(default_factory=list)

    def account(self) -> str:
        """One line: "folded 3 records into 1; forgot 2 records"."""
        if not self.consolidate:
            fold = "no folding asked"
        elif self.records < MINIMUM_RECORDS:
            fold = f"nothing to fold ({_plural(self.records, 'record')} since waking)"
        elif not self.planned:
            fold = "nothing folded (no plan came back)"
        elif self.absorbed == 0:
            fold = f"nothing folded ({_plural(self.records, 'record')} since waking)"
        else:
            fold = f"folded {_plural(self.absorbed, 'record')} into {self.groups}"
        return f"{fold}; forgot {_plural(self.forgotten, 'record')}"


def _plural(count: int, one: str) -> str:
    return f"{count} {one}" if count == 1 else f"{count} {one}s"


class Night:
    """One night over the session's writes scope (the ``sleep`` task's box)."""

    def __init__(
        self,
        *,
        model: MemoryModel,
        store: StoreClient,
        prompts: Prompts,
        imp: str,
        timezone: str,
        params: Params = DEFAULTS,
        host_log: HostLog | None = None,
    ) -> None:
        self.model = model
        self.store = store
        self.prompts = prompts
        self.imp = imp
        self.timezone = timezone
        self.params = params
        self._host_log = host_log

    async def _log(self, level: str, message: str) -> None:
        log.log(logging.getLevelName(level.upper()), message)
        if self._host_log is not None:
            await self._host_log(level, message[:1000])

    async def run(self, *, now: datetime, since: datetime, consolidate: bool) -> NightReport:
        """Mechanism 107 (114 when asked by hand): fold the records since ``since`` if asked, then forget."""
        report = NightReport(consolidate=consolidate)
        if consolidate:
            try:
                await self._consolidate(report, now, since)
            except StoreUnavailable as exc:
                report.failures.append(f"consolidation: {exc}")
                await self._log("warning", f"the night folded nothing: the store did not answer: {exc}")
        try:
            forgotten = await self.store.forget()  # mechanisms 112-113
            report.forgotten, report.forgotten_episodes = forgotten.forgotten, forgotten.episodes
        except StoreUnavailable as exc:
            report.failures.append(f"forgetting: {exc}")
        if report.failures:
            raise NightFailed(
                f"the memory store did not answer ({'; '.join(report.failures)}); {report.account()}"[:2_000]
            )
        return report

    async def _consolidate(self, report: NightReport, now: datetime, since: datetime) -> None:
        night = await self.store.night(since, episodes=NIGHT_EPISODES)  # newest first (107)
        shown = list(reversed(night.records))  # numbered oldest first
        report.records = len(shown)
        if len(shown) < MINIMUM_RECORDS:  # mechanism 108: no call
            return
        routed = self.model.model_for(PURPOSE)  # mechanism 54
        answer = await self.model.chat_json(
            PURPOSE,
            plan_system(self.prompts, routed, self.imp),
            plan_user(self.prompts, routed, shown, now, self.timezone),
            temperature=TEMPERATURE_SLEEP,
            schema=SCHEMA,
        )
        if answer is None:  # a model failure folds nothing; forgetting still runs
            await self._log("info", "the consolidation plan did not come back; nothing folded tonight")
            return
        report.planned = True
        checked = check(read_plan(answer), shown, self.params)
        report.refused = checked.refused
        if not checked.groups:
            return
        result = await self.store.consolidate(checked.groups)  # the host checks every rule again
        report.groups, report.absorbed, report.episodes = result.groups, result.absorbed, result.episodes
        report.refused += result.refused


# ------------------------------------------------------------------ the idle reflection's scene (105-106)


def idle_scene(init: BoxInitParams, now: datetime) -> Scene:
    """Where an idle reflection happens: the channel of the imp's latest activity, nobody speaking."""
    session = init.session
    person = session.channel_name
    if session.channel_kind == "dm" and person.startswith(DM_PREFIX):
        person = person[len(DM_PREFIX) :]
    return Scene(
        imp=init.imp.name, person=person or "someone", person_id=None, now=now,
        timezone=init.imp.memory.timezone, channel_kind=session.channel_kind, channel_name=session.channel_name,
    )  # fmt: skip
