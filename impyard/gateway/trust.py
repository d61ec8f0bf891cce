"""Trust for acts (docs/security.md, docs/architecture.md): the auto/gate/earned ladder, and the earned counts it reads.

The ladder is a pure function. Its one hard line: a send whose target is not
the session's own channel never goes out on the strength of the *target's*
trust; the target's trust is not even an input. Only a policy rule that says
``trust = "auto"`` (or earned trust for that very target) lets it go alone.

A channel's own trust is a setting of the channel (``impyard.channels.store``); the gateway is handed the channel
store and asks it only what ``ChannelTrust`` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, Protocol

from sqlalchemy import bindparam, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from impyard.channels.store import ALWAYS_TRUSTED_KINDS, ChannelInfo, ChannelStore, channel_is_trusted
from impyard.clock import Clock, iso
from impyard.gateway.policy_models import TrustMode, TrustSettings
from impyard.storage.db import Database, Store
from impyard.storage.prepared import Prepared
from impyard.storage.tables import earned_trust

__all__ = [
    "ALWAYS_TRUSTED_KINDS",
    "ChannelInfo",
    "ChannelTrust",
    "DbChannelTrust",
    "EarnedTrust",
    "TrustDecision",
    "channel_is_trusted",
    "decide_trust",
]


class ChannelTrust(Protocol):
    """What the gateway asks about channels (``impyard.channels.store.ChannelStore`` answers it). ``conn``: inside the
    caller's transaction (the gateway reads a send's facts in one, issue 18), else in a read of its own."""

    def info(self, channel_id: str, *, conn: Connection | None = None) -> ChannelInfo | None: ...

    def is_trusted(self, channel_id: str, *, conn: Connection | None = None) -> bool:
        """Must agree with ``channel_is_trusted(info(channel_id))``: the gateway judges a send from the row alone."""
        ...


DbChannelTrust = ChannelStore  # the name earlier callers use for the channel store


# ------------------------------------------------------------------ the ladder


@dataclass(frozen=True)
class TrustDecision:
    mode: Literal["auto", "gate"]  # what happens now
    ladder: TrustMode  # the rung that applied
    why: str


def decide_trust(
    *,
    target_is_own: bool,
    own_trusted: bool,
    rule_trust: TrustMode | None,
    settings: TrustSettings,
    clean_approvals: int,
) -> TrustDecision:
    """auto, gate or earned for one act. The target channel's own trust is deliberately not a parameter."""
    if rule_trust is not None:
        rung, source = rule_trust, "the matching rule says"
    elif target_is_own and own_trusted:
        rung, source = settings.own_channel, "the session's own channel is trusted:"
    elif target_is_own:
        rung, source = settings.untrusted, "the session's own channel is not trusted:"
    else:
        rung, source = settings.other_channel, "the target is not the session's own channel:"
    if rung == "earned":
        if clean_approvals >= settings.earned_after:
            return TrustDecision("auto", rung, f"{source} earned ({clean_approvals} clean approvals)")
        return TrustDecision(
            "gate",
            rung,
            f"{source} earned ({clean_approvals} of {settings.earned_after} clean approvals so far)",
        )
    return TrustDecision(rung, rung, f"{source} {rung}")


# ------------------------------------------------------------------ earned counts


class EarnedTrust(Store):
    """Clean approvals per imp + act + target channel; one denial resets the count.

    Counted only by ``GateStore.decide`` after the approver policy accepted the approver *for that target*
    (an owner, the operator, or an admin of the target's guild), so nobody earns an imp the right to post
    where they could not approve a post (issue 11 #5).
    """

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    def count(self, imp: str, act: str, target: str, *, conn: Connection | None = None) -> int:
        """Clean approvals so far; ``conn``: inside the caller's transaction (a job composing reads, issue 18)."""
        params = {"imp": imp, "act": act, "target": target}
        if conn is None:
            found = self.db.read(lambda conn: _COUNT.run(conn, params).scalar_one_or_none())
        else:
            found = _COUNT.run(conn, params).scalar_one_or_none()
        return int(found or 0)

    def record_approval(self, conn: Connection, imp: str, act: str, target: str) -> None:
        """Inside the caller's write transaction (the gate decision and the count change together)."""
        self._record(conn, imp, act, target, approved=True)

    def record_denial(self, conn: Connection, imp: str, act: str, target: str) -> None:
        self._record(conn, imp, act, target, approved=False)

    def _record(self, conn: Connection, imp: str, act: str, target: str, *, approved: bool) -> None:
        now = iso(self.clock.now())
        row = {"imp": imp, "act": act, "target": target, "clean_approvals": int(approved), "updated_at": now}
        conn.execute(_upserts(conn.dialect.name)[approved], row)


_e = earned_trust.c
_COUNT = Prepared(  # a send's decision reads it: the lean path (issue 18)
    select(_e.clean_approvals).where(
        _e.imp == bindparam("imp"), _e.act == bindparam("act"), _e.target == bindparam("target")
    )
)


@cache
def _upserts(dialect: str) -> dict[bool, Any]:
    """One more clean approval (True), or back to zero (False): INSERT ... ON CONFLICT DO UPDATE, built once."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    approved, denied = insert(earned_trust), insert(earned_trust)
    key = [_e.imp, _e.act, _e.target]
    return {
        True: approved.on_conflict_do_update(
            index_elements=key,
            set_={"clean_approvals": _e.clean_approvals + 1, "updated_at": approved.excluded.updated_at},
        ),
        False: denied.on_conflict_do_update(
            index_elements=key, set_={"clean_approvals": 0, "updated_at": denied.excluded.updated_at}
        ),
    }
