"""Approval gates (docs/security.md, docs/architecture.md): durable, frozen payload, deadline, approver policy, exactly once.

A gate moves ``pending`` → ``approved`` | ``denied`` | ``expired``, and an
approved gate ``approved`` → ``executing`` → ``executed`` | ``failed``. Every
move is one conditional UPDATE (``WHERE state = <expected>``) whose rowcount
is checked, inside ``Database.write`` (SQLite ``BEGIN IMMEDIATE``; PostgreSQL
SERIALIZABLE, run again on a conflict, when the loser's UPDATE then matches no
row): of two concurrent approvals exactly one wins, and of two executors, in
one process or on two hosts sharing the database, exactly one claims the gate
(issue 21, "Exactly once across hosts"). A crash between
``executing`` and the outcome leaves the gate ``executing`` (at most once,
visibly), never re-sent. Each transition writes its audit row in the same
transaction.

Who may decide (``may_decide``, a pure rule): the host operator on the CLI,
always; in chat only the imp's configured owners and admins of the guild the
message would be posted in (``deciding_guild``: the target channel's guild,
recorded when the gate opens, or learned from the surface just after), never
"anyone in a DM" and never the admins of the session's guild for a post into
another guild (issue 11 #5). A target whose guild the host does not know is
decided by owners and the operator only.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import re
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from box.protocol.models import DiscordSendParams
from impyard.clock import Clock, iso
from impyard.durations import format_duration
from impyard.errors import ImpyardError
from impyard.gateway.audit import AuditLog, AuditRecord
from impyard.gateway.trust import EarnedTrust
from impyard.storage.db import Database, Store
from impyard.storage.portable import bytewise
from impyard.storage.rows import RowMapper
from impyard.storage.tables import gates

GateState = Literal["pending", "approved", "denied", "expired", "executing", "executed", "failed"]
OPEN_STATES = ("pending", "approved", "executing")
FINAL_STATES = ("denied", "expired", "executed", "failed")
DECIDED_STATES = ("approved", "denied", "expired", "executing", "executed", "failed")
APPROVED_STATES = ("approved", "executing", "executed", "failed")  # what an approval became
GATE_ID = re.compile(r"g-[0-9a-f]{6,32}")  # what ``open`` makes (g- and 12 hex digits), with room to grow


@dataclass(frozen=True)
class Approver:
    """Who decides: the host operator (CLI), or a chat user with what the surface knows about them."""

    kind: Literal["operator", "user"]
    id: str
    is_guild_admin: bool = False
    guild_id: str | None = None  # the guild where the user is (or is not) an admin

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.id}"


@dataclass(frozen=True)
class Gate:
    id: str
    imp: str
    run_id: str
    session_channel: str
    origin_guild: str | None
    act: str
    target: str
    payload: dict[str, Any]
    payload_sha256: str
    reason: str
    state: GateState
    created_at: datetime
    deadline: datetime
    decided_at: datetime | None = None
    decided_by: str | None = None
    decision_note: str | None = None
    executed_at: datetime | None = None
    message_ids: list[str] = field(default_factory=list)
    error: str | None = None
    target_guild: str | None = None  # the target channel's guild (None: a DM, or not known to the host)

    @property
    def send(self) -> DiscordSendParams:
        """The frozen payload as the typed request it was (every gate holds a ``discord.send``)."""
        return DiscordSendParams.model_validate(self.payload)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "imp": self.imp,
            "run_id": self.run_id,
            "session_channel": self.session_channel,
            "origin_guild": self.origin_guild,
            "target_guild": self.target_guild,
            "act": self.act,
            "target": self.target,
            "payload": self.payload,
            "reason": self.reason,
            "state": self.state,
            "created_at": iso(self.created_at),
            "deadline": iso(self.deadline),
            "decided_at": iso(self.decided_at) if self.decided_at else None,
            "decided_by": self.decided_by,
            "decision_note": self.decision_note,
            "executed_at": iso(self.executed_at) if self.executed_at else None,
            "message_ids": self.message_ids,
            "error": self.error,
        }


def operator_name() -> str:
    """The host operator as every operator surface names them: the OS account that runs the command."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def operator_approver(name: str | None = None) -> Approver:
    """The host operator deciding (the CLI and the console alike): ``operator:<account>``, allowed on every gate."""
    return Approver(kind="operator", id=name or operator_name())


def is_gate_id(text: str) -> bool:
    """Whether ``text`` has a gate id's form (checked before it is used anywhere)."""
    return GATE_ID.fullmatch(text) is not None


def who_may_decide(gate: Gate) -> str:
    """The approver policy for this gate, in words (``may_decide`` is the rule)."""
    guild = deciding_guild(gate)
    return f"the operator, owners of {gate.imp}" + (
        f", admins of guild {guild}"
        if guild
        else " (no guild admin: a DM, or a guild this host does not know)"
    )


def time_left(gate: Gate, now: datetime) -> str:
    """How long a pending gate may still be decided: ``3h12m left``, or ``past its deadline``."""
    seconds = int((gate.deadline - now).total_seconds())  # whole seconds left, never rounded up
    if seconds < 1:
        return "past its deadline"
    if seconds >= 3_600:
        seconds -= seconds % 60  # hours away: to the minute
    return f"{format_duration(seconds)} left"


def decision_line(gate: Gate) -> str:
    """What a decision did, in one line (``impyard approvals approve`` / ``deny`` and the console)."""
    if gate.state in APPROVED_STATES:
        return f"approved {gate.id}; the running impyard host sends it exactly once"
    if gate.state == "denied":
        return f"denied {gate.id}; it will not be sent"
    return f"{gate.id} is {gate.state}"


def already_decided(gate: Gate) -> str:
    """Why a gate can no longer be decided: who decided it first and when (``g-… was already approved by …``)."""
    when = f"{gate.decided_at:%Y-%m-%d %H:%M:%S} UTC" if gate.decided_at else "an unknown time"
    if gate.state == "pending":
        return f"{gate.id} is still pending"
    if gate.state == "expired":
        return f"{gate.id} already expired at {when}, its deadline; it can no longer be decided"
    verb = "approved" if gate.state in APPROVED_STATES else gate.state
    now = f" (now {gate.state})" if gate.state != verb else ""
    return f"{gate.id} was already {verb} by {gate.decided_by or 'someone'} at {when}{now}"


class GateError(ImpyardError):
    """A decision that cannot be taken; ``kind`` is not_found | not_authorised | not_pending | expired | tampered."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def deciding_guild(gate: Gate) -> str | None:
    """The guild whose admins may decide a gate: the one its message would be posted in (None: no guild admin)."""
    return gate.origin_guild if gate.target == gate.session_channel else gate.target_guild


def may_decide(approver: Approver, gate: Gate, owners: Collection[str]) -> tuple[bool, str]:
    """The approver policy. ``owners`` are the user ids configured as the imp's owners."""
    if approver.kind == "operator":
        return True, "the host operator"
    if approver.id in owners:
        return True, f"an owner of {gate.imp}"
    guild = deciding_guild(gate)
    if guild is not None and approver.is_guild_admin and approver.guild_id == guild:
        return True, "an admin of the guild the message would be posted in"
    unknown = (
        ""
        if guild is not None
        else " (its channel is a DM or in a guild this host does not know, so no guild admin may)"
    )
    return False, (
        f"only the host operator, an owner of {gate.imp}, or an admin of the guild the message would be posted in "
        f"may decide this gate{unknown}"
    )


def freeze(payload: dict[str, Any]) -> tuple[str, str]:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text, hashlib.sha256(text.encode()).hexdigest()


row_to_gate = RowMapper(Gate, payload=json.loads, message_ids=lambda text: json.loads(text) if text else [])


def _gate_row(conn: Connection, gate_id: str) -> Gate | None:
    return row_to_gate.first(conn, select(gates).where(gates.c.id == gate_id))


class GateStore(Store):
    def __init__(
        self, db: Database, clock: Clock, audit: AuditLog, earned: EarnedTrust | None = None
    ) -> None:
        self.db = db
        self.clock = clock
        self.audit = audit
        self.earned = earned or EarnedTrust(db, clock)

    # ------------------------------------------------------------ reading

    def get(self, gate_id: str) -> Gate:
        gate = self.db.read(lambda conn: _gate_row(conn, gate_id))
        if gate is None:
            raise GateError("not_found", f"no gate {gate_id!r}; `impyard approvals ls` lists them")
        return gate

    def latest(self, states: Collection[str] | None = None, limit: int = 100) -> list[Gate]:
        """The newest gates first (only those in ``states``, when given), at most ``limit``."""
        query = select(gates)
        if states:
            query = query.where(gates.c.state.in_(sorted(states)))
        query = query.order_by(bytewise(gates.c.created_at).desc(), bytewise(gates.c.id)).limit(max(0, limit))
        return self.db.read(lambda conn: row_to_gate.all(conn, query))

    # ------------------------------------------------------------ transitions (inside ``Database.write``)

    def _transition(
        self,
        conn: Connection,
        gate: Gate,
        expected: str,
        new: GateState,
        *,
        note: str = "",
        **columns: Any,
    ) -> bool:
        """``expected`` → ``new`` as one conditional UPDATE: its rowcount decides who moved it (exactly once)."""
        moved = conn.execute(
            update(gates).where(gates.c.id == gate.id, gates.c.state == expected).values(state=new, **columns)
        )
        if moved.rowcount != 1:
            return False
        self._audit(
            conn,
            AuditRecord(
                imp=gate.imp,
                method="gate",
                verdict=new,
                run_id=gate.run_id,
                channel_id=gate.session_channel,
                gate_id=gate.id,
                reason=note,
                detail=f"{gate.act} to {gate.target}",
            ),
        )
        return True

    def _audit(self, conn: Connection, record: AuditRecord) -> None:
        """The transition's audit row, in its transaction (redacted and bounded by ``AuditLog.row``)."""
        self.audit.write(record, conn)

    def _count_decision(self, conn: Connection, gate: Gate, *, approved: bool) -> None:
        """Earned trust, in the decision's transaction: one more clean approval, or back to zero on a denial."""
        record = self.earned.record_approval if approved else self.earned.record_denial
        record(conn, gate.imp, gate.act, gate.target)

    def open(
        self,
        *,
        imp: str,
        run_id: str,
        session_channel: str,
        origin_guild: str | None,
        act: str,
        target: str,
        payload: dict[str, Any],
        reason: str,
        deadline: timedelta,
        target_guild: str | None = None,
    ) -> Gate:
        """``target_guild``: the target channel's guild as the host knows it (the session's own is ``origin_guild``)."""
        now = self.clock.now()
        text, digest = freeze(payload)
        gate_id = f"g-{secrets.token_hex(6)}"
        if target == session_channel:
            target_guild = origin_guild
        row = insert(gates).values(
            id=gate_id, imp=imp, run_id=run_id, session_channel=session_channel, origin_guild=origin_guild,
            target_guild=target_guild, act=act, target=target, payload=text, payload_sha256=digest, reason=reason,
            state="pending", created_at=iso(now), deadline=iso(now + deadline),
        )  # fmt: skip
        self.db.write(lambda conn: conn.execute(row))
        return self.get(gate_id)

    def learn_target_guild(self, gate_id: str, guild_id: str) -> Gate:
        """Record the target channel's guild found after the gate opened (the surface's own view of the channel).

        Only fills a gap: a guild already recorded, or the session's own channel's, is never changed.
        """
        fill = (
            update(gates)
            .where(
                gates.c.id == gate_id,
                gates.c.target_guild.is_(None),
                gates.c.target != gates.c.session_channel,
            )
            .values(target_guild=guild_id)
        )
        self.db.write(lambda conn: conn.execute(fill))
        return self.get(gate_id)

    def expire_due(self) -> list[Gate]:
        """Move every pending gate past its deadline to ``expired``."""
        now = iso(self.clock.now())

        def expire(conn: Connection) -> list[str]:
            due = conn.execute(
                select(gates).where(gates.c.state == "pending", gates.c.deadline <= now)
                .order_by(bytewise(gates.c.deadline), bytewise(gates.c.id))
            ).mappings()  # fmt: skip
            return [
                gate.id
                for gate in map(row_to_gate, due.all())
                if self._transition(conn, gate, "pending", "expired", note="deadline passed", decided_at=now)
            ]

        return [self.get(gate_id) for gate_id in self.db.write(expire)]

    def decide(
        self, gate_id: str, approver: Approver, *, approve: bool, owners: Collection[str] = (), note: str = ""
    ) -> Gate:
        """Approve or deny a pending gate; raises GateError (nothing changes) when that is not possible."""
        now = self.clock.now()

        def decision(conn: Connection) -> Gate | None:  # None: it expired (committed); may run more than once
            gate = _gate_row(conn, gate_id)
            if gate is None:
                raise GateError("not_found", f"no gate {gate_id!r}; `impyard approvals ls` lists them")
            allowed, why = may_decide(approver, gate, owners)
            if not allowed:
                raise GateError("not_authorised", f"{approver.label} may not decide {gate_id}: {why}")
            if gate.state != "pending":
                raise GateError("not_pending", f"gate {already_decided(gate)}")
            if now >= gate.deadline:
                self._transition(
                    conn, gate, "pending", "expired", note="deadline passed", decided_at=iso(now)
                )
                return None
            new: GateState = "approved" if approve else "denied"
            if not self._transition(
                conn, gate, "pending", new, note=note or f"by {approver.label} ({why})",
                decided_at=iso(now), decided_by=approver.label, decision_note=note or None,
            ):  # fmt: skip
                raise GateError("not_pending", f"gate {gate_id} was decided by someone else first")
            self._count_decision(conn, gate, approved=approve)  # one denial resets earned trust
            return gate

        if (
            self.db.write(decision) is None
        ):  # committed: the deadline passing is a fact though the decision fails
            deadline = self.get(gate_id).deadline
            raise GateError(
                "expired", f"gate {gate_id} expired at {iso(deadline)}; it can no longer be decided"
            )
        return self.get(gate_id)

    def claim(self, gate_id: str) -> Gate | None:
        """approved → executing; None when another executor has it (or it is not approved)."""

        def claim_it(conn: Connection) -> Gate | None:
            gate = _gate_row(conn, gate_id)
            if gate is None or not self._transition(conn, gate, "approved", "executing", note="executing"):
                return None
            return gate

        gate = self.db.write(claim_it)
        if gate is None:
            return None
        text, digest = freeze(gate.payload)
        if digest != gate.payload_sha256:
            self.finish(gate_id, error="the frozen payload does not match its hash; not executed")
            raise GateError(
                "tampered", f"gate {gate_id}: the frozen payload was changed; it was not executed"
            )
        return self.get(gate_id)

    def finish(self, gate_id: str, *, message_ids: list[str] | None = None, error: str | None = None) -> Gate:
        now = iso(self.clock.now())

        def outcome(conn: Connection) -> None:
            gate = _gate_row(conn, gate_id)
            if gate is None:
                raise GateError("not_found", f"no gate {gate_id!r}; `impyard approvals ls` lists them")
            if error is None:
                self._transition(
                    conn, gate, "executing", "executed", note=f"message ids {message_ids or []}",
                    executed_at=now, message_ids=json.dumps(message_ids or []),
                )  # fmt: skip
            else:
                self._transition(conn, gate, "executing", "failed", note=error, executed_at=now, error=error)

        self.db.write(outcome)
        return self.get(gate_id)

    def decided_recently(self, limit: int = 20) -> list[Gate]:
        """The gates decided most recently (approved, denied or expired; then sent or failed), newest first."""
        query = (
            select(gates)
            .where(gates.c.state.in_(DECIDED_STATES), gates.c.decided_at.is_not(None))
            .order_by(bytewise(gates.c.decided_at).desc(), bytewise(gates.c.id))
            .limit(max(0, limit))
        )
        return self.db.read(lambda conn: row_to_gate.all(conn, query))

    def approved_waiting(self) -> list[Gate]:
        """Approved gates nobody has executed yet (e.g. approved on the CLI while the supervisor runs)."""
        return self.latest(states=("approved",))
