"""Who may hold a lease, as pure rules (issue 21: one holder at a time).

A shard, a terminal channel and a due task run are each held through a lease
row: its name, the process that holds it (``liveness.Holder``), a fencing
token and an expiry. The holder renews it while it lives; anyone else is
refused with the holder's host and pid until the lease expired, or at once
where this machine can tell the holder is dead (``kill -9``, a reboot). Every
takeover raises the token, so a host that lost its lease and still tries to
act carries a stale token and is refused (``verify``). A task left ``running``
is reclaimed (requeued or ended) only by a host that may take its run's lease
over (``reclaims``): never while a live host holds it.

This module decides; ``impyard.storage.leases`` reads and writes the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from impyard.storage.liveness import Holder

HOST_PREFIX = "host:"  # a process's own record: host:<hostname>/<pid>
DEFAULT_TTL = timedelta(seconds=30)  # how long a lease lives without a renewal
RENEW_EVERY = timedelta(seconds=10)  # a holder renews this often: two renewals may fail before it expires
# What a holder says of itself (its warm boxes) is written as soon as it changed, at most this often.
DETAIL_EVERY = timedelta(seconds=1)


@dataclass(frozen=True)
class LeaseRow:
    """A lease as stored."""

    name: str
    holder: Holder | None  # None: garbled or unknown; only its expiry protects it
    token: int
    expires_at: datetime


class Outcome(StrEnum):
    FREE = "free"  # nobody ever held it: take it with token 1 (a released lease keeps its row and token)
    MINE = "mine"  # this process holds it already: renew, same token
    EXPIRED = "expired"  # its holder stopped renewing: take over with the next token
    DEAD = "dead"  # its holder is provably gone (same machine): take over with the next token
    HELD = "held"  # someone alive holds it: refuse, naming the holder


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    token: int  # the token the taker holds afterwards; for HELD the holder's token

    @property
    def granted(self) -> bool:
        return self.outcome is not Outcome.HELD


def granted(decision: Decision) -> bool:
    """Whether a claimant takes the lease: every outcome but HELD (what ``impyard serve`` and ``chat`` ask)."""
    return decision.granted


def reclaims(decision: Decision) -> bool:
    """Whether a host may take a running task's run lease over to reclaim the task (requeue or end it): the run
    holds no lease (FREE: it started before run leases, or its holder let go without ending it), its holder
    stopped renewing (EXPIRED) or is gone (DEAD). Never HELD (a live host runs it), and never MINE: a run of this
    very process is another supervisor's of it, still running."""
    return decision.outcome in (Outcome.FREE, Outcome.EXPIRED, Outcome.DEAD)


def lease_time(text: str) -> datetime:
    """A time as a lease row keeps it (ISO-8601 text; UTC when it names no zone): a garbled one counts as long
    expired, so it never holds anything."""
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


def decide(row: LeaseRow | None, me: Holder, now: datetime, alive: bool | None) -> Decision:
    """Whether ``me`` may take the lease ``row`` at ``now``.

    ``alive`` is what this machine knows of the row's holder (``liveness.alive``): True, False, or None for a
    holder on another machine, whose expiry alone decides.
    """
    if row is None:
        return Decision(Outcome.FREE, 1)
    if row.holder == me:
        return Decision(Outcome.MINE, row.token)
    if row.expires_at <= now:
        return Decision(Outcome.EXPIRED, row.token + 1)
    if alive is False:
        return Decision(Outcome.DEAD, row.token + 1)
    return Decision(Outcome.HELD, row.token)


def verify(row: LeaseRow | None, me: Holder, token: int, now: datetime) -> str | None:
    """Why an act under lease ``token`` must be refused, or None when ``me`` still holds it.

    An expired lease is refused even if nobody took it over yet: its holder could not renew, so it may already
    have been given away elsewhere by the time the act lands.
    """
    if row is None:
        return "the lease was released"
    if row.holder != me or row.token != token:
        who = f"{row.holder.host} pid {row.holder.pid}" if row.holder is not None else "another holder"
        return f"the lease passed to {who} (token {row.token}, this host held {token})"
    if row.expires_at <= now:
        return "the lease expired before it was renewed"
    return None


def refusal(name: str, row: LeaseRow, now: datetime) -> str:
    """One line for a process refused a lease: who holds it and when it frees itself."""
    left = max(0, int((row.expires_at - now).total_seconds() + 0.999))
    who = f"{row.holder.host} (pid {row.holder.pid})" if row.holder is not None else "an unknown holder"
    return f"{name} is held by {who}; it is free once that process stops, or in {left} s if it stops renewing"
