"""Trust for acts (docs/security.md, docs/architecture.md): the auto/gate/earned ladder, and the earned counts it reads.

The ladder is a pure function. Its one hard line: a send whose target is not
the session's own channel never goes out on the strength of the *target's*
trust; the target's trust is not even an input. Only a policy rule that says
``trust = "auto"`` (or earned trust for that very target) lets it go alone.

A channel's own trust is a setting of the channel (``impyard.channels``); the gateway is handed the channel
store and asks it only what ``ChannelTrust`` names.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal, Protocol

from impyard.channels import ALWAYS_TRUSTED_KINDS, ChannelInfo, ChannelStore, channel_is_trusted
from impyard.clock import Clock, iso
from impyard.db import Database, Store
from impyard.policy_models import TrustMode, TrustSettings

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
    """What the gateway asks about channels (``impyard.channels.ChannelStore`` answers it)."""

    def info(self, channel_id: str) -> ChannelInfo | None: ...

    def is_trusted(self, channel_id: str) -> bool: ...


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

    def count(self, imp: str, act: str, target: str) -> int:
        rows = self.db.query(
            "SELECT clean_approvals FROM earned_trust WHERE imp = ? AND act = ? AND target = ?",
            (imp, act, target),
        )
        return int(rows[0][0]) if rows else 0

    def record_approval(self, conn: sqlite3.Connection, imp: str, act: str, target: str) -> None:
        """Inside the caller's transaction (the gate decision and the count change together)."""
        conn.execute(
            """INSERT INTO earned_trust (imp, act, target, clean_approvals, updated_at) VALUES (?, ?, ?, 1, ?)
               ON CONFLICT (imp, act, target) DO UPDATE SET clean_approvals = clean_approvals + 1,
                 updated_at = excluded.updated_at""",
            (imp, act, target, iso(self.clock.now())),
        )

    def record_denial(self, conn: sqlite3.Connection, imp: str, act: str, target: str) -> None:
        conn.execute(
            """INSERT INTO earned_trust (imp, act, target, clean_approvals, updated_at) VALUES (?, ?, ?, 0, ?)
               ON CONFLICT (imp, act, target) DO UPDATE SET clean_approvals = 0, updated_at = excluded.updated_at""",
            (imp, act, target, iso(self.clock.now())),
        )
