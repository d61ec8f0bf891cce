"""The budget ledger (docs/security.md, docs/architecture.md): reserve before a model call, settle with its measured cost.

Check-and-debit is one step: a reservation reads what is spent and reserved
in the windows and inserts its own row inside one ``BEGIN IMMEDIATE``
transaction, so concurrent reservations (threads or processes) serialise on
SQLite's write lock and can never jointly overspend. Windows are the UTC day
and the UTC month, per imp and for all imps together. Limits come from the
policy's [budgets] unless the operator set an override (``impyard budget set``).
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from impyard.clock import Clock, iso
from impyard.db import Database, Store
from impyard.errors import ImpyardError
from impyard.liveness import Holder, alive, this_process
from impyard.policy import Policy
from impyard.policy_models import MAX_USD, BudgetLimit
from impyard.prices import micros_to_usd, usd_to_micros

ALL_IMPS = "*"  # the scope of the fleet-wide limit
# A reservation whose holder this machine cannot check (another host's, or written before holders were recorded)
# and that is this old was left by a crashed host; its holder's death is what settles the rest at once.
ABANDONED_AFTER = timedelta(hours=1)


class BudgetLimitError(ImpyardError, ValueError):
    """A budget limit that is not a number of USD from 0 to MAX_USD (inf, nan, negative)."""


class BudgetExhausted(ImpyardError):
    """Nothing (or not enough) left in a window; ``ledger`` names it, ``retry_after_s`` is when it resets."""

    def __init__(
        self, ledger: str, retry_after_s: int, limit_micros: int, spent_micros: int, estimate_micros: int
    ):
        self.ledger = ledger
        self.retry_after_s = retry_after_s
        self.limit_micros = limit_micros
        self.spent_micros = spent_micros
        self.estimate_micros = estimate_micros
        left = max(0, limit_micros - spent_micros)
        super().__init__(
            f"budget {ledger} has ${micros_to_usd(left):.4f} of ${micros_to_usd(limit_micros):.4f} left; this request "
            f"may cost up to ${micros_to_usd(estimate_micros):.4f}; it resets in {retry_after_s} s"
        )


@dataclass(frozen=True)
class Reservation:
    id: int
    imp: str
    reserved_micros: int


@dataclass(frozen=True)
class Orphan:
    """A reservation settled because its holder is gone: the host audits it (issue 19 #4)."""

    id: int
    imp: str
    reserved_micros: int
    method: str
    purpose: str
    model: str
    created_at: str
    holder: Holder | None
    why: str  # "holder-dead" | "too-old"

    @property
    def reason(self) -> str:
        if self.why == "holder-dead" and self.holder is not None:
            who = f"the impyard process (pid {self.holder.pid}) that made this call"
            return (
                f"interrupted: {who} stopped before it was settled; charged its reservation, since the model API "
                "may bill a request it received"
            )
        return (
            f"interrupted: in flight since {self.created_at} and never settled by its host; charged its "
            "reservation, since the model API may bill a request it received"
        )


@dataclass(frozen=True)
class Limits:
    """Effective limits in micro-USD (None = no limit) and where each came from."""

    daily: int | None
    monthly: int | None
    source: str  # "policy" | "override" | "policy+override"


@dataclass(frozen=True)
class BudgetRow:
    scope: str  # an imp, or "*" for all imps
    daily_limit: int | None
    daily_spent: int
    monthly_limit: int | None
    monthly_spent: int
    reserved: int  # reservations in flight (included in spent)
    source: str


def day_key(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%d")


def month_key(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m")


def seconds_to_next_day(now: datetime) -> int:
    now = now.astimezone(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1, int((midnight - now).total_seconds() + 0.999))


def seconds_to_next_month(now: datetime) -> int:
    now = now.astimezone(UTC)
    first = (now.replace(day=28) + timedelta(days=4)).replace(
        day=1, hour=0, minute=0, second=0, microsecond=0
    )
    return max(1, int((first - now).total_seconds() + 0.999))


_AMOUNT = "CASE WHEN state = 'reserved' THEN reserved_micros ELSE cost_micros END"


class Ledger(Store):
    def __init__(self, db: Database, policy: Policy, clock: Clock, holder: Holder | None = None) -> None:
        self.db = db
        self.policy = policy
        self.clock = clock
        self.holder = holder or this_process()  # written on each reservation (issue 19 #4)

    # ------------------------------------------------------------ limits

    def limits(self, scope: str, conn: sqlite3.Connection | None = None) -> Limits:
        base: BudgetLimit = self.policy.budgets.all if scope == ALL_IMPS else self.policy.budget_for(scope)
        row = (
            (conn or self.db.connection())
            .execute("SELECT daily_usd, monthly_usd FROM budget_limits WHERE scope = ?", (scope,))
            .fetchone()
        )
        daily, monthly, source = base.daily_usd, base.monthly_usd, "policy"
        if row is not None:
            overridden = [name for name in ("daily", "monthly") if row[f"{name}_usd"] is not None]
            daily = row["daily_usd"] if row["daily_usd"] is not None else daily
            monthly = row["monthly_usd"] if row["monthly_usd"] is not None else monthly
            if overridden:
                source = "override" if len(overridden) == 2 else f"policy, {overridden[0]} override"
        return Limits(
            usd_to_micros(daily) if daily is not None else None,
            usd_to_micros(monthly) if monthly is not None else None,
            source,
        )

    def set_limits(self, scope: str, *, daily_usd: float | None, monthly_usd: float | None) -> None:
        """Override the policy's limits for an imp (or ``*`` for all imps); None keeps the current value."""
        for value in (daily_usd, monthly_usd):  # issue 11 #10: inf or nan would overflow every later read
            if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_USD):
                raise BudgetLimitError(
                    f"a budget limit is a number of USD from 0 to {MAX_USD:g} (got {value!r})"
                )
        with self.db.transaction() as conn:
            conn.execute(
                """INSERT INTO budget_limits (scope, daily_usd, monthly_usd, updated_at) VALUES (?, ?, ?, ?)
                   ON CONFLICT (scope) DO UPDATE SET
                     daily_usd = COALESCE(excluded.daily_usd, budget_limits.daily_usd),
                     monthly_usd = COALESCE(excluded.monthly_usd, budget_limits.monthly_usd),
                     updated_at = excluded.updated_at""",
                (scope, daily_usd, monthly_usd, iso(self.clock.now())),
            )

    def clear_limits(self, scope: str) -> bool:
        return self.db.execute("DELETE FROM budget_limits WHERE scope = ?", (scope,)).rowcount > 0

    # ------------------------------------------------------------ reserve and settle

    def _spent(self, conn: sqlite3.Connection, *, imp: str | None, day: str | None, month: str) -> int:
        where, args = ["month = ?"], [month]
        if imp is not None:
            where.append("imp = ?")
            args.append(imp)
        if day is not None:
            where.append("day = ?")
            args.append(day)
        row = conn.execute(
            f"SELECT COALESCE(SUM({_AMOUNT}), 0) FROM ledger WHERE {' AND '.join(where)}", args
        ).fetchone()
        return int(row[0])

    def reserve(
        self, imp: str, estimate_micros: int, *, method: str = "", purpose: str = "", model: str = ""
    ) -> Reservation:
        """Atomically check every window and debit the estimate; raises BudgetExhausted (nothing debited)."""
        if estimate_micros < 0:
            raise ValueError("an estimate cannot be negative")
        now = self.clock.now()
        day, month = day_key(now), month_key(now)
        with self.db.transaction() as conn:
            self._check(conn, imp, estimate_micros, now)
            cursor = conn.execute(
                """INSERT INTO ledger
                     (imp, day, month, state, reserved_micros, method, purpose, model, created_at, owner)
                   VALUES (?, ?, ?, 'reserved', ?, ?, ?, ?, ?, ?)""",
                (imp, day, month, estimate_micros, method, purpose, model, iso(now), str(self.holder)),
            )
            assert cursor.lastrowid is not None
            return Reservation(cursor.lastrowid, imp, estimate_micros)

    def check_headroom(self, imp: str, estimate_micros: int) -> None:
        """Raise BudgetExhausted where ``reserve`` would, debiting nothing (a dry run; a read-only transaction)."""
        with self.db.transaction(immediate=False) as conn:
            self._check(conn, imp, estimate_micros, self.clock.now())

    def _check(self, conn: sqlite3.Connection, imp: str, estimate_micros: int, now: datetime) -> None:
        """Every window must take the estimate on top of what is spent and reserved, else BudgetExhausted."""
        day, month = day_key(now), month_key(now)
        mine, fleet = self.limits(imp, conn), self.limits(ALL_IMPS, conn)  # each scope's limits read once
        checks = (
            (f"imp:{imp}/day", mine.daily, dict(imp=imp, day=day), seconds_to_next_day(now)),
            (f"imp:{imp}/month", mine.monthly, dict(imp=imp, day=None), seconds_to_next_month(now)),
            ("all/day", fleet.daily, dict(imp=None, day=day), seconds_to_next_day(now)),
            ("all/month", fleet.monthly, dict(imp=None, day=None), seconds_to_next_month(now)),
        )
        for name, limit, where, retry_after in checks:
            if limit is None:
                continue
            spent = self._spent(conn, month=month, **where)
            if spent >= limit or spent + estimate_micros > limit:  # the hard stop: never overspend
                raise BudgetExhausted(name, retry_after, limit, spent, estimate_micros)

    def settle(self, reservation: Reservation | int, cost_micros: int) -> int:
        """Replace the reservation by the measured cost (0 when nothing was spent), and return what was charged.

        The charge never exceeds the reservation (issue 11 #3): the reserve step checked the limits against
        the reservation, so settling above it would overspend the hard stop. A caller whose measured cost is
        higher must say so loudly. Settling twice is a no-op (returns 0).
        """
        reservation_id = reservation.id if isinstance(reservation, Reservation) else reservation
        rows = self.db.execute(
            """UPDATE ledger SET state = 'settled', cost_micros = MIN(?, reserved_micros), settled_at = ?
               WHERE id = ? AND state = 'reserved' RETURNING cost_micros""",
            (max(0, int(cost_micros)), iso(self.clock.now()), reservation_id),
        ).fetchall()
        return int(rows[0][0]) if rows else 0

    def settle_orphans(self, older_than: timedelta = ABANDONED_AFTER) -> list[Orphan]:
        """Settle the reservations nobody will settle (fail closed: at their full estimate), and return them.

        A reservation whose holder process this machine finds dead is settled at once; one whose holder it
        cannot check (another machine's, or unrecorded) only once it is ``older_than`` old. A live holder's
        reservation is never touched: its call may still be running.
        """
        now = iso(self.clock.now())
        cutoff = iso(self.clock.now() - older_than)
        rows = self.db.query(
            "SELECT id, imp, reserved_micros, method, purpose, model, created_at, owner FROM ledger "
            "WHERE state = 'reserved'"
        )
        orphans: list[Orphan] = []
        for row in rows:
            holder = Holder.parse(row["owner"])
            living = alive(holder) if holder is not None else None
            if living is False:
                why = "holder-dead"
            elif living is None and row["created_at"] < cutoff:
                why = "too-old"
            else:
                continue
            settled = self.db.execute(
                """UPDATE ledger SET state = 'settled', cost_micros = reserved_micros, settled_at = ?
                   WHERE id = ? AND state = 'reserved'""",
                (now, row["id"]),
            ).rowcount
            if settled:
                orphans.append(
                    Orphan(
                        row["id"],
                        row["imp"],
                        row["reserved_micros"],
                        row["method"],
                        row["purpose"],
                        row["model"],
                        row["created_at"],
                        holder,
                        why,
                    )  # fmt: skip
                )
        return orphans

    # ------------------------------------------------------------ reporting

    def settled_total(self, imp: str | None = None) -> int:
        sql = "SELECT COALESCE(SUM(cost_micros), 0) FROM ledger WHERE state = 'settled'"
        rows = self.db.query(sql + (" AND imp = ?" if imp else ""), (imp,) if imp else ())
        return int(rows[0][0])

    def summary(self) -> list[BudgetRow]:
        """One row for all imps, then one per imp that has spent, has an override, or is named in the policy."""
        now = self.clock.now()
        day, month = day_key(now), month_key(now)
        conn = self.db.connection()
        imps = {row[0] for row in conn.execute("SELECT DISTINCT imp FROM ledger WHERE month = ?", (month,))}
        imps |= {
            row[0] for row in conn.execute("SELECT scope FROM budget_limits WHERE scope != ?", (ALL_IMPS,))
        }
        imps |= set(self.policy.budgets.imps)
        rows = []
        for scope in [ALL_IMPS, *sorted(imps)]:
            imp = None if scope == ALL_IMPS else scope
            limits = self.limits(scope, conn)
            reserved_sql = (
                "SELECT COALESCE(SUM(reserved_micros), 0) FROM ledger WHERE state = 'reserved' AND month = ?"
            )
            reserved_args: list[str] = [month]
            if imp is not None:
                reserved_sql += " AND imp = ?"
                reserved_args.append(imp)
            rows.append(
                BudgetRow(
                    scope=scope,
                    daily_limit=limits.daily,
                    daily_spent=self._spent(conn, imp=imp, day=day, month=month),
                    monthly_limit=limits.monthly,
                    monthly_spent=self._spent(conn, imp=imp, day=None, month=month),
                    reserved=int(conn.execute(reserved_sql, reserved_args).fetchone()[0]),
                    source=limits.source,
                )
            )
        return rows
