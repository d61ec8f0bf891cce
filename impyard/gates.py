"""Approval gates (docs/security.md, docs/architecture.md): durable, frozen payload, deadline, approver policy, exactly once.

A gate moves ``pending`` → ``approved`` | ``denied`` | ``expired``, and an
approved gate ``approved`` → ``executing`` → ``executed`` | ``failed``. Every
move is one conditional UPDATE (``WHERE state = <expected>``) whose rowcount
is checked, inside ``BEGIN IMMEDIATE``: of two concurrent approvals exactly
one wins, and of two executors exactly one claims the gate. A crash between
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

import hashlib
import json
import secrets
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from box.protocol.models import DiscordSendParams
from impyard.audit import AuditLog, AuditRecord
from impyard.clock import Clock, iso, parse_iso
from impyard.db import Database, Store
from impyard.errors import ImpyardError
from impyard.trust import EarnedTrust

GateState = Literal["pending", "approved", "denied", "expired", "executing", "executed", "failed"]
OPEN_STATES = ("pending", "approved", "executing")
FINAL_STATES = ("denied", "expired", "executed", "failed")


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


def _row_to_gate(row: sqlite3.Row) -> Gate:
    def when(name: str) -> datetime | None:
        return parse_iso(row[name]) if row[name] else None

    return Gate(
        id=row["id"],
        imp=row["imp"],
        run_id=row["run_id"],
        session_channel=row["session_channel"],
        origin_guild=row["origin_guild"],
        act=row["act"],
        target=row["target"],
        payload=json.loads(row["payload"]),
        payload_sha256=row["payload_sha256"],
        reason=row["reason"],
        state=row["state"],
        created_at=parse_iso(row["created_at"]),
        deadline=parse_iso(row["deadline"]),
        decided_at=when("decided_at"),
        decided_by=row["decided_by"],
        decision_note=row["decision_note"],
        executed_at=when("executed_at"),
        message_ids=json.loads(row["message_ids"]) if row["message_ids"] else [],
        error=row["error"],
        target_guild=row["target_guild"],
    )


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
        rows = self.db.query("SELECT * FROM gates WHERE id = ?", (gate_id,))
        if not rows:
            raise GateError("not_found", f"no gate {gate_id!r}; `impyard approvals ls` lists them")
        return _row_to_gate(rows[0])

    def latest(self, states: Collection[str] | None = None, limit: int = 100) -> list[Gate]:
        """The newest gates first (only those in ``states``, when given), at most ``limit``."""
        sql = "SELECT * FROM gates"
        args: list[object] = []
        if states:
            sql += f" WHERE state IN ({', '.join('?' for _ in states)})"
            args.extend(states)
        sql += " ORDER BY created_at DESC, id LIMIT ?"
        args.append(limit)
        return [_row_to_gate(row) for row in self.db.query(sql, args)]

    # ------------------------------------------------------------ transitions

    def _transition(
        self,
        conn: sqlite3.Connection,
        gate: Gate,
        expected: str,
        new: GateState,
        *,
        note: str = "",
        **columns: Any,
    ) -> bool:
        sets = ", ".join(["state = ?", *(f"{name} = ?" for name in columns)])
        cursor = conn.execute(
            f"UPDATE gates SET {sets} WHERE id = ? AND state = ?", [new, *columns.values(), gate.id, expected]
        )
        if cursor.rowcount != 1:
            return False
        self.audit.write(
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
            conn,
        )
        return True

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
        with self.db.transaction() as conn:
            conn.execute(
                """INSERT INTO gates (id, imp, run_id, session_channel, origin_guild, target_guild, act, target,
                     payload, payload_sha256, reason, state, created_at, deadline)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)""",
                (gate_id, imp, run_id, session_channel, origin_guild, target_guild, act, target, text, digest,
                 reason, iso(now), iso(now + deadline)),
            )  # fmt: skip
        return self.get(gate_id)

    def learn_target_guild(self, gate_id: str, guild_id: str) -> Gate:
        """Record the target channel's guild found after the gate opened (the surface's own view of the channel).

        Only fills a gap: a guild already recorded, or the session's own channel's, is never changed.
        """
        self.db.execute(
            "UPDATE gates SET target_guild = ? WHERE id = ? AND target_guild IS NULL AND target != session_channel",
            (guild_id, gate_id),
        )
        return self.get(gate_id)

    def expire_due(self) -> list[Gate]:
        """Move every pending gate past its deadline to ``expired``."""
        now = iso(self.clock.now())
        expired = []
        with self.db.transaction() as conn:
            rows = conn.execute(
                "SELECT * FROM gates WHERE state = 'pending' AND deadline <= ?", (now,)
            ).fetchall()
            for row in rows:
                gate = _row_to_gate(row)
                if self._transition(conn, gate, "pending", "expired", note="deadline passed", decided_at=now):
                    expired.append(gate.id)
        return [self.get(gate_id) for gate_id in expired]

    def decide(
        self, gate_id: str, approver: Approver, *, approve: bool, owners: Collection[str] = (), note: str = ""
    ) -> Gate:
        """Approve or deny a pending gate; raises GateError (nothing changes) when that is not possible."""
        now = self.clock.now()
        with self.db.transaction() as conn:
            row = conn.execute("SELECT * FROM gates WHERE id = ?", (gate_id,)).fetchone()
            if row is None:
                raise GateError("not_found", f"no gate {gate_id!r}; `impyard approvals ls` lists them")
            gate = _row_to_gate(row)
            allowed, why = may_decide(approver, gate, owners)
            if not allowed:
                raise GateError("not_authorised", f"{approver.label} may not decide {gate_id}: {why}")
            if gate.state != "pending":
                raise GateError("not_pending", f"gate {gate_id} is already {gate.state}")
            if now >= gate.deadline:
                self._transition(
                    conn, gate, "pending", "expired", note="deadline passed", decided_at=iso(now)
                )
                expired = True
            else:
                expired = False
                new: GateState = "approved" if approve else "denied"
                if not self._transition(
                    conn, gate, "pending", new, note=note or f"by {approver.label} ({why})",
                    decided_at=iso(now), decided_by=approver.label, decision_note=note or None,
                ):  # fmt: skip
                    raise GateError("not_pending", f"gate {gate_id} was decided by someone else first")
                if approve:
                    self.earned.record_approval(conn, gate.imp, gate.act, gate.target)
                else:
                    self.earned.record_denial(
                        conn, gate.imp, gate.act, gate.target
                    )  # one denial resets earned trust
        if expired:  # committed above: the deadline passing is a fact even though the decision fails
            raise GateError(
                "expired", f"gate {gate_id} expired at {iso(gate.deadline)}; it can no longer be decided"
            )
        return self.get(gate_id)

    def claim(self, gate_id: str) -> Gate | None:
        """approved → executing; None when another executor has it (or it is not approved)."""
        with self.db.transaction() as conn:
            row = conn.execute("SELECT * FROM gates WHERE id = ?", (gate_id,)).fetchone()
            if row is None:
                return None
            gate = _row_to_gate(row)
            if not self._transition(conn, gate, "approved", "executing", note="executing"):
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
        with self.db.transaction() as conn:
            gate = _row_to_gate(conn.execute("SELECT * FROM gates WHERE id = ?", (gate_id,)).fetchone())
            if error is None:
                self._transition(
                    conn, gate, "executing", "executed", note=f"message ids {message_ids or []}",
                    executed_at=now, message_ids=json.dumps(message_ids or []),
                )  # fmt: skip
            else:
                self._transition(conn, gate, "executing", "failed", note=error, executed_at=now, error=error)
        return self.get(gate_id)

    def approved_waiting(self) -> list[Gate]:
        """Approved gates nobody has executed yet (e.g. approved on the CLI while the supervisor runs)."""
        return self.latest(states=("approved",))
