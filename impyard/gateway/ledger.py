"""The budget ledger (docs/security.md, docs/architecture.md): reserve before a model call, settle with its measured cost.

Check-and-debit is one step: a reservation reads what is spent and reserved
in the windows and inserts its own row in one write transaction (``db.write``:
``BEGIN IMMEDIATE`` on SQLite, SERIALIZABLE and retried on PostgreSQL), so
concurrent reservations — threads, processes, hosts sharing one database —
can never jointly overspend. Windows are the UTC day and the UTC month, per imp
and for all imps together. Limits come from the policy's [budgets] unless the
operator set an override (``impyard budget set``).

What a window has spent is kept as a running total (``ledger_totals``: reserved
and settled micro-USD per scope and period), moved in the same transaction as
every row it sums, so a check reads four rows however many calls the month has
had (issue 21). The rows stay the truth: ``summary`` (``budget show``) sums them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from impyard import metrics
from impyard.clock import Clock, iso
from impyard.errors import ImpyardError
from impyard.gateway.policy import Policy
from impyard.gateway.policy_models import MAX_USD, BudgetLimit
from impyard.gateway.prices import micros_to_usd, usd_to_micros
from impyard.storage.db import Database, Store
from impyard.storage.liveness import Holder, alive, this_process
from impyard.storage.portable import per_dialect, upsert
from impyard.storage.prepared import Prepared
from impyard.storage.rows import RowMapper
from impyard.storage.tables import budget_limits, ledger, ledger_totals

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


# The totals' two upserts, built once per dialect and run with one row of parameters per total (executemany).
# A multi-row VALUES statement has no cache key in SQLAlchemy: it would be compiled anew at every reservation
# (issue 18: three compiles, about 5 ms of host CPU, every warm turn).
@per_dialect
def _MAKE_TOTALS(dialect: str) -> Prepared:  # noqa: N802 - a statement
    return Prepared(
        upsert(dialect)(ledger_totals).on_conflict_do_nothing(
            index_elements=[ledger_totals.c.scope, ledger_totals.c.period]
        )
    )


@per_dialect
def _ADD_TO_TOTALS(dialect: str) -> Prepared:  # noqa: N802 - a statement
    stmt = upsert(dialect)(ledger_totals)
    return Prepared(
        stmt.on_conflict_do_update(
            index_elements=[ledger_totals.c.scope, ledger_totals.c.period],
            set_={
                "reserved_micros": ledger_totals.c.reserved_micros + stmt.excluded.reserved_micros,
                "settled_micros": ledger_totals.c.settled_micros + stmt.excluded.settled_micros,
            },
        )
    )


# A reservation's statements, built once (issue 18): building a statement and its cache key costs SQLAlchemy
# more than running it, and a warm turn runs these every time it calls the model. The hot ones are ``Prepared``:
# on SQLite they run straight on the driver.
_LIMITS = Prepared(
    sa.select(budget_limits.c.daily_usd, budget_limits.c.monthly_usd).where(
        budget_limits.c.scope == sa.bindparam("scope")
    )
)
_LIMITS_OF_TWO = Prepared(
    sa.select(budget_limits.c.scope, budget_limits.c.daily_usd, budget_limits.c.monthly_usd).where(
        budget_limits.c.scope.in_([sa.bindparam("scope_0"), sa.bindparam("scope_1")])
    )
)
_LOCK_TOTALS = (
    sa.select(ledger_totals.c.scope)
    .where(sa.tuple_(ledger_totals.c.scope, ledger_totals.c.period).in_(sa.bindparam("keys", expanding=True)))
    .order_by(ledger_totals.c.scope, ledger_totals.c.period)
    .with_for_update()
)
# Two scopes (the imp's and the fleet's) and two periods (the day and the month) at most: fixed parameters, so the
# statement runs on the lean path (an expanding IN is compiled at every run); one value is given twice for one.
_SPENT = Prepared(
    sa.select(
        ledger_totals.c.scope,
        ledger_totals.c.period,
        ledger_totals.c.reserved_micros + ledger_totals.c.settled_micros,
    ).where(
        ledger_totals.c.scope.in_([sa.bindparam("scope_0"), sa.bindparam("scope_1")]),
        ledger_totals.c.period.in_([sa.bindparam("period_0"), sa.bindparam("period_1")]),
    )
)
# PostgreSQL: the four totals a reservation moves, locked in one order and read in the same statement (issue 36:
# one round trip for the lock and what the check reads), when they are all there already (every reservation but a
# window's first).
_LOCK_WINDOWS = Prepared(
    sa.select(
        ledger_totals.c.scope,
        ledger_totals.c.period,
        ledger_totals.c.reserved_micros + ledger_totals.c.settled_micros,
    )
    .where(
        ledger_totals.c.scope.in_([sa.bindparam("scope_0"), sa.bindparam("scope_1")]),
        ledger_totals.c.period.in_([sa.bindparam("period_0"), sa.bindparam("period_1")]),
    )
    .order_by(ledger_totals.c.scope, ledger_totals.c.period)
    .with_for_update(),
    named=False,
)
_RESERVE = Prepared(sa.insert(ledger).returning(ledger.c.id))
_SETTLE = Prepared(
    sa.update(ledger)
    .where(ledger.c.id == sa.bindparam("reservation_id"), ledger.c.state == "reserved")
    .values(
        state="settled",
        cost_micros=sa.case(
            (ledger.c.reserved_micros < sa.bindparam("cost"), ledger.c.reserved_micros),
            else_=sa.bindparam("cost"),
        ),
        settled_at=sa.bindparam("at"),
    )
    .returning(ledger.c.imp, ledger.c.day, ledger.c.month, ledger.c.reserved_micros, ledger.c.cost_micros)
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


_ORPHAN = RowMapper(Orphan, id=int, reserved_micros=int)


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


def day_period(day: str) -> str:
    return f"day:{day}"


def month_period(month: str) -> str:
    return f"month:{month}"


# What a row counts against its windows: the reservation while in flight, then the measured cost.
_AMOUNT = sa.case((ledger.c.state == "reserved", ledger.c.reserved_micros), else_=ledger.c.cost_micros)
_Key = tuple[str, str]  # (scope, period) of ledger_totals


def _windows(imp: str, day: str, month: str) -> list[_Key]:
    """The four totals a ledger row of ``imp`` on ``day`` moves."""
    return [(scope, period) for scope in (imp, ALL_IMPS) for period in (day_period(day), month_period(month))]


class Ledger(Store):
    def __init__(self, db: Database, policy: Policy, clock: Clock, holder: Holder | None = None) -> None:
        self.db = db
        self.policy = policy
        self.clock = clock
        self.holder = holder or this_process()  # written on each reservation (issue 19 #4)

    # ------------------------------------------------------------ limits

    def limits(self, scope: str, conn: Connection | None = None) -> Limits:
        """The effective limits of ``scope`` (in the caller's transaction when ``conn`` is given)."""
        if conn is None:
            return self.db.read(lambda conn: self.limits(scope, conn))
        return self._effective(scope, _LIMITS.run(conn, {"scope": scope}).first())

    def _limits_of(self, conn: Connection, imp: str) -> tuple[Limits, Limits]:
        """The imp's limits and the fleet's, read in one statement (issue 36: one round trip on PostgreSQL)."""
        rows = {row[0]: row for row in _LIMITS_OF_TWO.run(conn, {"scope_0": imp, "scope_1": ALL_IMPS}).all()}
        return self._effective(imp, rows.get(imp)), self._effective(ALL_IMPS, rows.get(ALL_IMPS))

    def _effective(self, scope: str, row: Any) -> Limits:
        """``scope``'s limits: the policy's, each overridden by ``row``'s (its ``budget_limits`` row) where set."""
        base: BudgetLimit = self.policy.budgets.all if scope == ALL_IMPS else self.policy.budget_for(scope)
        daily, monthly, source = base.daily_usd, base.monthly_usd, "policy"
        if row is not None:
            overridden = [
                name
                for name, value in (("daily", row.daily_usd), ("monthly", row.monthly_usd))
                if value is not None
            ]
            daily = row.daily_usd if row.daily_usd is not None else daily
            monthly = row.monthly_usd if row.monthly_usd is not None else monthly
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
        updated_at = iso(self.clock.now())
        dialect = postgresql if self.db.dialect == "postgresql" else sqlite

        def txn(conn: Connection) -> None:
            stmt = dialect.insert(budget_limits).values(
                scope=scope, daily_usd=daily_usd, monthly_usd=monthly_usd, updated_at=updated_at
            )
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[budget_limits.c.scope],
                    set_={
                        "daily_usd": sa.func.coalesce(stmt.excluded.daily_usd, budget_limits.c.daily_usd),
                        "monthly_usd": sa.func.coalesce(
                            stmt.excluded.monthly_usd, budget_limits.c.monthly_usd
                        ),
                        "updated_at": stmt.excluded.updated_at,
                    },
                )
            )

        self.db.write(txn)

    def clear_limits(self, scope: str) -> bool:
        return self.db.write(
            lambda conn: (
                conn.execute(sa.delete(budget_limits).where(budget_limits.c.scope == scope)).rowcount > 0
            )
        )

    # ------------------------------------------------------------ the running totals

    def _move(self, conn: Connection, moves: Counter[tuple[_Key, str]]) -> None:
        """Add to the totals, in the caller's transaction: ``moves[((scope, period), column)]`` micro-USD each
        (one statement; a total not there yet starts at 0)."""
        deltas: dict[_Key, dict[str, int]] = {}
        for (key, column), amount in moves.items():
            deltas.setdefault(key, {"reserved_micros": 0, "settled_micros": 0})[column] += amount
        if deltas:  # one row of parameters per total, in one order (executemany: one cached statement)
            _ADD_TO_TOTALS(self.db.dialect).many(
                conn,
                [
                    dict(scope=scope, period=period, **amounts)
                    for (scope, period), amounts in sorted(deltas.items())
                ],
            )

    def _lock(self, conn: Connection, keys: list[_Key]) -> dict[_Key, int] | None:
        """Lock the windows' totals (made at 0 where new) in one order, before they are checked: on PostgreSQL a
        reservation runs at READ COMMITTED (``db.write(locking=True)``), so one of another process or host waits
        here for this one's commit and then reads what it left — never both passing a cap they share.

        On PostgreSQL, when every total is there already, one statement locks them and reads what each has spent
        and reserved (returned, for ``_check``); a window's first reservation makes its totals first, then locks
        them all (None: ``_check`` reads them). Either way the rows are locked in one order."""
        ordered = sorted(set(keys))
        if conn.dialect.name != "sqlite":
            scopes, periods = (
                sorted({scope for scope, _ in ordered}),
                sorted({period for _, period in ordered}),
            )
            if len(scopes) <= 2 and len(periods) <= 2 and len(ordered) == len(scopes) * len(periods):
                params = {
                    "scope_0": scopes[0], "scope_1": scopes[-1], "period_0": periods[0], "period_1": periods[-1],
                }  # fmt: skip
                rows = _LOCK_WINDOWS.run(conn, params).all()
                if len(rows) == len(ordered):
                    return {(scope, period): int(amount) for scope, period, amount in rows}
        _MAKE_TOTALS(self.db.dialect).many(
            conn,
            [
                dict(scope=scope, period=period, reserved_micros=0, settled_micros=0)
                for scope, period in ordered
            ],
        )
        if (
            conn.dialect.name != "sqlite"
        ):  # SQLite's BEGIN IMMEDIATE holds the whole database's write lock already
            conn.execute(_LOCK_TOTALS, {"keys": ordered}).all()
        return None

    @staticmethod
    def _spent(conn: Connection, keys: list[_Key]) -> dict[_Key, int]:
        """What each window has spent and reserved: four rows at most, however many calls it has had."""
        scopes, periods = sorted({scope for scope, _ in keys}), sorted({period for _, period in keys})
        if len(scopes) > 2 or len(periods) > 2:
            raise ValueError(f"a reservation has two scopes and two periods at most, not {keys}")
        params = {
            "scope_0": scopes[0], "scope_1": scopes[-1], "period_0": periods[0], "period_1": periods[-1],
        }  # fmt: skip
        rows = _SPENT.run(conn, params).all()
        found = {(scope, period): int(amount) for scope, period, amount in rows}
        return {key: found.get(key, 0) for key in keys}

    # ------------------------------------------------------------ reserve and settle

    def reserve(
        self,
        imp: str,
        estimate_micros: int,
        *,
        method: str = "",
        purpose: str = "",
        model: str = "",
        run_id: str = "",
    ) -> Reservation:
        """Atomically check every window and debit the estimate; raises BudgetExhausted (nothing debited).
        ``run_id``: the box run that asked (a task run's id counts the call under tasks: ``spending``)."""
        now = self.clock.now()
        return self.db.write(
            lambda conn: self.reserve_in(
                conn,
                imp,
                estimate_micros,
                now=now,
                method=method,
                purpose=purpose,
                model=model,
                run_id=run_id,
            ),
            locking=True,
        )

    def reserve_in(
        self,
        conn: Connection,
        imp: str,
        estimate_micros: int,
        *,
        now: datetime | None = None,
        method: str = "",
        purpose: str = "",
        model: str = "",
        run_id: str = "",
    ) -> Reservation:
        """``reserve`` in the caller's write transaction (``db.write``'s function), so that one transaction can
        cover the reservation and another store's write. Database work only: it may run again on PostgreSQL."""
        if estimate_micros < 0:
            raise ValueError("an estimate cannot be negative")
        now = now or self.clock.now()
        day, month = day_key(now), month_key(now)
        locked = self._lock(conn, _windows(imp, day, month))
        self._check(conn, imp, estimate_micros, now, locked)
        reservation_id = _RESERVE.run(
            conn,
            dict(
                imp=imp,
                day=day,
                month=month,
                state="reserved",
                reserved_micros=estimate_micros,
                method=method,
                purpose=purpose,
                model=model,
                created_at=iso(now),
                owner=str(self.holder),
                run_id=run_id,
            ),  # fmt: skip
        ).scalar_one()
        self._move(
            conn, Counter({(key, "reserved_micros"): estimate_micros for key in _windows(imp, day, month)})
        )
        return Reservation(int(reservation_id), imp, estimate_micros)

    def check_headroom(self, imp: str, estimate_micros: int) -> None:
        """Raise BudgetExhausted where ``reserve`` would, debiting nothing (a dry run; a read-only transaction)."""
        now = self.clock.now()
        self.db.read(lambda conn: self._check(conn, imp, estimate_micros, now))

    def _check(
        self,
        conn: Connection,
        imp: str,
        estimate_micros: int,
        now: datetime,
        locked: dict[_Key, int] | None = None,
    ) -> None:
        """Every window must take the estimate on top of what is spent and reserved, else BudgetExhausted.
        ``locked``: what the windows have spent and reserved, read already (by ``_lock``, with their locks)."""
        day, month = day_period(day_key(now)), month_period(month_key(now))
        mine, fleet = self._limits_of(conn, imp)  # each scope's limits read once
        checks = (
            (f"imp:{imp}/day", mine.daily, (imp, day), seconds_to_next_day(now)),
            (f"imp:{imp}/month", mine.monthly, (imp, month), seconds_to_next_month(now)),
            ("all/day", fleet.daily, (ALL_IMPS, day), seconds_to_next_day(now)),
            ("all/month", fleet.monthly, (ALL_IMPS, month), seconds_to_next_month(now)),
        )
        wanted = [key for _, limit, key, _ in checks if limit is not None]
        spent_in = locked if locked is not None else self._spent(conn, wanted) if wanted else {}
        for name, limit, key, retry_after in checks:
            if limit is None:
                continue
            spent = spent_in[key]
            if spent >= limit or spent + estimate_micros > limit:  # the hard stop: never overspend
                raise BudgetExhausted(name, retry_after, limit, spent, estimate_micros)

    def settle(self, reservation: Reservation | int, cost_micros: int) -> int:
        """Replace the reservation by the measured cost (0 when nothing was spent), and return what was charged.

        The charge never exceeds the reservation (issue 11 #3): the reserve step checked the limits against
        the reservation, so settling above it would overspend the hard stop. A caller whose measured cost is
        higher must say so loudly. Settling twice is a no-op (returns 0).
        """
        at = iso(self.clock.now())
        charged = self.db.write(
            lambda conn: self.settle_in(conn, reservation, cost_micros, at=at), locking=True
        )
        if isinstance(reservation, Reservation):  # counted once committed (a write may run again)
            metrics.spent(reservation.imp, charged)
        return charged

    def settle_in(
        self, conn: Connection, reservation: Reservation | int, cost_micros: int, *, at: str | None = None
    ) -> int:
        """``settle`` in the caller's write transaction (with another store's write). Database work only."""
        reservation_id = reservation.id if isinstance(reservation, Reservation) else reservation
        cost = max(0, int(cost_micros))
        row = _SETTLE.run(
            conn, {"reservation_id": reservation_id, "cost": cost, "at": at or iso(self.clock.now())}
        ).first()
        if row is None:
            return 0
        moves: Counter[tuple[_Key, str]] = Counter()
        self._settled(moves, row.imp, row.day, row.month, int(row.reserved_micros), int(row.cost_micros))
        self._move(conn, moves)
        return int(row.cost_micros)

    @staticmethod
    def _settled(
        moves: Counter[tuple[_Key, str]], imp: str, day: str, month: str, reserved: int, cost: int
    ) -> None:
        """A row of ``imp`` settled: its windows (the row's own day and month) move from reserved to charged."""
        for key in _windows(imp, day, month):
            moves[(key, "reserved_micros")] -= reserved
            moves[(key, "settled_micros")] += cost

    def settle_orphans(self, older_than: timedelta = ABANDONED_AFTER) -> list[Orphan]:
        """Settle the reservations nobody will settle (fail closed: at their full estimate), and return them.

        A reservation whose holder process this machine finds dead is settled at once; one whose holder it
        cannot check (another machine's, or unrecorded) only once it is ``older_than`` old. A live holder's
        reservation is never touched: its call may still be running.
        """
        now = iso(self.clock.now())
        cutoff = iso(self.clock.now() - older_than)
        rows = self.db.read(
            lambda conn: conn.execute(
                sa.select(
                    ledger.c.id,
                    ledger.c.imp,
                    ledger.c.reserved_micros,
                    ledger.c.method,
                    ledger.c.purpose,
                    ledger.c.model,
                    ledger.c.created_at,
                    ledger.c.owner,
                )
                .where(ledger.c.state == "reserved")
                .order_by(ledger.c.id)  # fmt: skip
            ).all()
        )
        candidates: dict[int, Orphan] = {}
        for row in rows:  # whose holder is gone: asked of this machine, outside any transaction
            holder = Holder.parse(row.owner)
            living = alive(holder) if holder is not None else None
            if living is False:
                why = "holder-dead"
            elif living is None and row.created_at < cutoff:
                why = "too-old"
            else:
                continue
            candidates[int(row.id)] = _ORPHAN(row._mapping, holder=holder, why=why)
        if not candidates:
            return []

        def txn(conn: Connection) -> list[int]:  # may run again on PostgreSQL: database work only
            settled = conn.execute(
                sa.update(ledger)
                .where(ledger.c.id.in_(list(candidates)), ledger.c.state == "reserved")
                .values(state="settled", cost_micros=ledger.c.reserved_micros, settled_at=now)
                .returning(ledger.c.id, ledger.c.imp, ledger.c.day, ledger.c.month, ledger.c.reserved_micros)
            ).all()
            moves: Counter[tuple[_Key, str]] = Counter()
            for row in settled:
                self._settled(
                    moves, row.imp, row.day, row.month, int(row.reserved_micros), int(row.reserved_micros)
                )
            self._move(conn, moves)
            return sorted(int(row.id) for row in settled)

        return [candidates[orphan_id] for orphan_id in self.db.write(txn, locking=True)]

    # ------------------------------------------------------------ reporting

    def settled_total(self, imp: str | None = None) -> int:
        query = sa.select(sa.func.coalesce(sa.func.sum(ledger.c.cost_micros), 0)).where(
            ledger.c.state == "settled"
        )
        if imp:
            query = query.where(ledger.c.imp == imp)
        return int(self.db.read(lambda conn: conn.execute(query).scalar_one()))

    def totals(self) -> dict[tuple[str, str], tuple[int, int]]:
        """The running totals as kept: ``{(scope, period): (reserved, settled)}`` (a check; ``summary`` sums rows)."""
        rows = self.db.read(lambda conn: conn.execute(sa.select(ledger_totals)).all())
        return {(row.scope, row.period): (int(row.reserved_micros), int(row.settled_micros)) for row in rows}

    def summary(self, also: Iterable[str] = ()) -> list[BudgetRow]:
        """One row for all imps, then one per imp that has spent, has an override, or is named in the policy (and
        one per name in ``also``: the console lists every imp of the home). Summed from the ledger's rows (the
        truth), in one read."""
        extra = set(also) - {ALL_IMPS}
        now = self.clock.now()
        day, month = day_key(now), month_key(now)
        reserved = sa.case((ledger.c.state == "reserved", ledger.c.reserved_micros), else_=0)

        def read(
            conn: Connection,
        ) -> tuple[list[tuple[str, str, int, int]], list[str], dict[str, Limits]]:
            grouped = conn.execute(
                sa.select(
                    ledger.c.imp,
                    ledger.c.day,
                    sa.func.coalesce(sa.func.sum(_AMOUNT), 0),
                    sa.func.coalesce(sa.func.sum(reserved), 0),
                )
                .where(ledger.c.month == month)
                .group_by(ledger.c.imp, ledger.c.day)
            ).all()
            spending = [(str(imp), str(on), int(amount), int(held)) for imp, on, amount, held in grouped]
            overridden = list(
                conn.execute(
                    sa.select(budget_limits.c.scope).where(budget_limits.c.scope != ALL_IMPS)
                ).scalars()
            )
            imps = {row[0] for row in spending} | set(overridden) | set(self.policy.budgets.imps) | extra
            return spending, sorted(imps), {scope: self.limits(scope, conn) for scope in [ALL_IMPS, *imps]}

        spending, imps, limits = self.db.read(read)
        daily: Counter[str] = Counter()
        monthly: Counter[str] = Counter()
        in_flight: Counter[str] = Counter()
        for imp, row_day, amount, held in spending:
            for scope in (imp, ALL_IMPS):
                monthly[scope] += int(amount)
                in_flight[scope] += int(held)
                if row_day == day:
                    daily[scope] += int(amount)
        return [
            BudgetRow(
                scope=scope,
                daily_limit=limits[scope].daily,
                daily_spent=daily[scope],
                monthly_limit=limits[scope].monthly,
                monthly_spent=monthly[scope],
                reserved=in_flight[scope],
                source=limits[scope].source,
            )
            for scope in [ALL_IMPS, *imps]
        ]
