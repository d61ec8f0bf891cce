"""Dispositions (issue 14; mechanisms 90-99): the rules an imp learns, per imp, shared by every scope, naming
no one — and the rule law that keeps them so (issue 32).

A rule is the imp's character, read by every scope's boxes, so the host applies the rule law
(``box.common.laws.rule_refusal``) twice: before keeping a rule (``rule_refused``, with what the session's
channel taught) and before serving one (``served_rules``, with the people the imp knows now:
``KnownPeople``). At most ``MAX_RULES`` are kept per imp; past it the weakest goes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection, RowMapping

from box.common import laws
from box.protocol.memory import MAX_RULE_CHARS, DispositionView, LearnParams, LearnResult
from impyard.clock import iso, parse_iso
from impyard.memory.departures import Taught, known_people, taught
from impyard.memory.errors import MemoryDenied, MemoryInvalid
from impyard.memory.records import new_id
from impyard.storage.db import Database
from impyard.storage.portable import bytewise
from impyard.storage.tables import memory_dispositions as _D

KNOWN_PEOPLE_S = 60.0  # how long the names checked as rules are served are kept (``KnownPeople``)
MAX_KNOWN_IMPS = 10_000  # imps whose known people are kept between reads
MAX_RULES = 1_000  # learned rules kept per imp: past it the weakest goes (dormant first, then oldest)

DISPOSITION_NAMES = ("id", "rule", "weight", "count", "created_at", "updated_at")
_DISPOSITIONS = {
    active_only: select(*(_D.c[name] for name in DISPOSITION_NAMES))
    .where(_D.c.imp == bindparam("imp"), *([func.abs(_D.c.weight) > bindparam("dormant")] if active_only else []))
    .order_by(
        func.abs(_D.c.weight).desc(), bytewise(_D.c.updated_at).desc(), bytewise(_D.c.created_at).desc(),
        bytewise(_D.c.id),
    )
    for active_only in (False, True)
}  # fmt: skip
_UPDATE_RULE = update(_D).where(_D.c.id == bindparam("rid"))
_NAMED_RULE = select(_D.c.id, _D.c.rule, _D.c.weight).where(
    _D.c.id == bindparam("rid"), _D.c.imp == bindparam("imp")
)
_RULES_OF = select(func.count()).select_from(_D).where(_D.c.imp == bindparam("imp"))
_weakest = (
    select(_D.c.id)
    .where(_D.c.imp == bindparam("imp"), _D.c.id != bindparam("rid"))
    .order_by(
        func.abs(_D.c.weight) > bindparam("dormant"), func.abs(_D.c.weight), bytewise(_D.c.updated_at),
        bytewise(_D.c.created_at), bytewise(_D.c.id),
    )
    .limit(bindparam("excess"))
)  # fmt: skip
_TRIM_RULES = delete(_D).where(_D.c.id.in_(_weakest))  # the weakest go: dormant first, then smallest |weight|


class RuleRefused(MemoryDenied):
    """Issue 32: a learned rule that could carry what a scope holds (the box is answered DENIED)."""

    rule = "memory-rule-law"


def clean_rule(rule: str) -> str:
    """A learned rule as kept (``laws.clean_rule``): one line, control and format characters out, the arrow
    written one way, at most ``MAX_RULE_CHARS``; refuses a rule left empty. Cleaning only: the rule law is
    ``rule_refused``."""
    text = laws.clean_rule(rule)[:MAX_RULE_CHARS].strip()
    if not text:
        raise MemoryInvalid("a learned rule needs some text")
    return text


def rule_refused(rule: str, lesson: Taught) -> None:
    """The rule law on the host (mechanism 90, issue 32; ``laws.rule_refusal``): raises ``RuleRefused`` for a
    rule holding a name the host knows, a number, an address, a link, a quotation or the conversation's words.

    A rule is the imp's character, read by every scope's boxes (``dispositions``), so only the host can be
    trusted to keep a DM's words out of it: the box that learned it may be hostile."""
    why = laws.rule_refusal(rule, names=lesson.names, said=lesson.said, speakers=lesson.speakers)
    if why is not None:
        raise RuleRefused(f"memory.dispositions.learn: rule refused by {RuleRefused.rule}: {why}")


class KnownPeople:
    """The names of the people each imp knows (``departures.known_people``), read again at most every
    ``KNOWN_PEOPLE_S`` seconds: serving rules checks them every turn, and reading them costs tens of ms over a
    large history. Learning a rule always reads them afresh (``taught``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, tuple[float, tuple[str, ...]]] = {}

    def of(self, conn: Connection, imp: str) -> tuple[str, ...]:
        now = time.monotonic()
        with self._lock:
            kept = self._names.get(imp)
        if kept is not None and now - kept[0] < KNOWN_PEOPLE_S:
            return kept[1]
        names = tuple(known_people(conn, imp, memories=False))
        with self._lock:
            self._names[imp] = (now, names)
            while len(self._names) > MAX_KNOWN_IMPS:
                self._names.pop(next(iter(self._names)))
        return names


def served_rules(rules: Sequence[DispositionView], names: Sequence[str]) -> list[DispositionView]:
    """The rules a box may be given: those the rule law keeps with the people the imp knows now. A rule kept
    before issue 32 (when only the box checked), or one naming someone the imp met since, is never served."""
    people = laws.people(tuple(names))
    return [rule for rule in rules if laws.rule_refusal(rule.rule, names=people) is None]


def _view(row: RowMapping) -> DispositionView:
    return DispositionView(
        id=row["id"], rule=row["rule"], weight=float(row["weight"]), count=int(row["count"]),
        updated_at=parse_iso(row["updated_at"]),
    )  # fmt: skip


def rules(conn: Connection, imp: str, limit: int | None, *, active_only: bool) -> list[DispositionView]:
    """Mechanisms 94, 98-99: the imp's rules, strongest |weight| first (ties: the most recently learned);
    ``active_only``: only |weight| above ``laws.DORMANT_WEIGHT``. Every rule kept: the operator's view."""
    statement = _DISPOSITIONS[active_only]
    if limit is not None:
        statement = statement.limit(bindparam("limit"))
    params = {"imp": imp, "dormant": laws.DORMANT_WEIGHT, "limit": limit}
    return [_view(row) for row in conn.execute(statement, params).mappings()]


def served(db: Database, people: KnownPeople, imp: str, k: int, active_only: bool) -> list[DispositionView]:
    """Mechanisms 94, 98-99: the ``k`` strongest rules a box may be given (``served_rules``, issue 32)."""

    def read(conn: Connection) -> list[DispositionView]:
        found = rules(conn, imp, k, active_only=active_only)
        return served_rules(found, people.of(conn, imp)) if found else []

    return db.read(read)


def learn(
    db: Database, imp: str, channel_id: str, params: LearnParams, clock: Callable[[], datetime]
) -> LearnResult:
    """Mechanisms 95-97, atomically: ``same`` is counted (and takes this text and weight only if this one
    pulls harder); else ``contradicts`` is weakened toward 0 by |weight| and this rule added; else added.
    A rule named must be this imp's (else ``MemoryDenied``). At most ``MAX_RULES`` are kept per imp.
    First the rule law (``rule_refused``, issue 32) with what ``channel_id`` taught: a refused rule changes
    nothing, not even the rules it names."""
    rule = clean_rule(params.rule)
    now = iso(clock())
    rule_refused(rule, db.read(lambda conn: taught(conn, imp, channel_id, clock())))

    def write(conn: Connection) -> LearnResult:
        def named(rule_id: str) -> RowMapping:
            row = conn.execute(_NAMED_RULE, {"rid": rule_id, "imp": imp}).mappings().first()
            if row is None:
                raise MemoryDenied(f"memory.dispositions.learn: no rule {rule_id[:40]!r} of this imp")
            return row

        if params.same is not None:  # mechanisms 95-96: counted; never summed
            old = named(params.same)
            text, weight, replaced = laws.same_rule(
                old["rule"], float(old["weight"]), rule, params.weight, params.avoidance_weight
            )
            conn.execute(
                _UPDATE_RULE.values(rule=text, weight=weight, count=_D.c.count + 1, updated_at=now),
                {"rid": params.same},
            )
            return LearnResult(id=params.same, action="replaced" if replaced else "counted")
        weakened: str | None = None
        if params.contradicts is not None:  # mechanism 97: toward 0 by |new w|, never past it
            old = named(params.contradicts)
            conn.execute(
                _UPDATE_RULE.values(
                    weight=laws.weakened(float(old["weight"]), params.weight), updated_at=now
                ),
                {"rid": params.contradicts},
            )
            weakened = params.contradicts
        rule_id = new_id()
        conn.execute(
            insert(_D),
            dict(
                id=rule_id, imp=imp, rule=rule, weight=params.weight, count=1, created_at=now, updated_at=now
            ),
        )
        excess = int(conn.execute(_RULES_OF, {"imp": imp}).scalar_one()) - MAX_RULES
        if excess > 0:  # the weakest go: dormant ones first, then the smallest |weight|, oldest first
            conn.execute(
                _TRIM_RULES, {"imp": imp, "rid": rule_id, "dormant": laws.DORMANT_WEIGHT, "excess": excess}
            )
        return LearnResult(id=rule_id, action="added", weakened=weakened)

    # SERIALIZABLE, not locking: rules are per imp, with no row of their own to lock (the count and the trim
    # read them all), and only a departure's box learns, once: never a hot spot.
    return db.write(write)
