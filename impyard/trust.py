"""Trust for acts (design.md §5, §6, §12): channel trust, the auto/gate/earned ladder, earned counts.

The ladder is a pure function. Its one hard line: a send whose target is not
the session's own channel never goes out on the strength of the *target's*
trust; the target's trust is not even an input. Only a policy rule that says
``trust = "auto"`` (or earned trust for that very target) lets it go alone.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal, Protocol

from impyard.clock import Clock, iso
from impyard.db import Database, Store
from impyard.policy_models import TrustMode, TrustSettings

ALWAYS_TRUSTED_KINDS = frozenset({"dm", "terminal"})  # DMs (design.md §6) and the operator's own terminal


@dataclass(frozen=True)
class ChannelInfo:
    channel_id: str
    surface: str = "discord"
    kind: str = "guild"  # dm | guild | terminal | task
    name: str = ""
    guild_id: str | None = None
    trusted: bool = False
    mode: str = "all"  # all | mention: the wake rule's per-channel setting (design.md §6)


def channel_is_trusted(info: ChannelInfo | None) -> bool:
    """Unknown channels are untrusted; DMs and the terminal always are trusted."""
    if info is None:
        return False
    return info.trusted or info.kind in ALWAYS_TRUSTED_KINDS


class ChannelTrust(Protocol):
    """What the gateway asks about channels. The channels issue owns the real thing."""

    def info(self, channel_id: str) -> ChannelInfo | None: ...

    def is_trusted(self, channel_id: str) -> bool: ...


class DbChannelTrust(Store):
    """Channel trust from the ``channels`` table."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    def info(self, channel_id: str) -> ChannelInfo | None:
        rows = self.db.query(
            "SELECT channel_id, surface, kind, name, guild_id, trusted, mode FROM channels WHERE channel_id = ?",
            (channel_id,),
        )
        if not rows:
            return None
        row = rows[0]
        return ChannelInfo(
            row["channel_id"],
            row["surface"],
            row["kind"],
            row["name"],
            row["guild_id"],
            bool(row["trusted"]),
            row["mode"],
        )

    def is_trusted(self, channel_id: str) -> bool:
        return channel_is_trusted(self.info(channel_id))

    def kind(self, channel_id: str) -> str | None:
        info = self.info(channel_id)
        return info.kind if info else None

    def upsert(self, info: ChannelInfo) -> None:
        self.db.execute(
            """INSERT INTO channels (channel_id, surface, kind, name, guild_id, trusted, updated_at)
               VALUES (?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (channel_id) DO UPDATE SET surface = excluded.surface, kind = excluded.kind,
                 name = excluded.name, guild_id = excluded.guild_id, trusted = excluded.trusted,
                 updated_at = excluded.updated_at""",
            (
                info.channel_id,
                info.surface,
                info.kind,
                info.name,
                info.guild_id,
                int(info.trusted),
                iso(self.clock.now()),
            ),
        )


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
