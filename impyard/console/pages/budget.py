"""Budget: each imp's spend today and this month against its limits (``impyard budget show``: the same
``Ledger.summary``), its spend per UTC day stacked by purpose group (``impyard budget spend``: the same
``read_spend``), and the ledger's reservations in flight. Read-only: limits change with ``impyard budget set``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from aiohttp import web

from impyard.console.bars import Chart, stacked_bars
from impyard.console.context import context_of
from impyard.console.page import Page
from impyard.console.render import render, usd
from impyard.gateway.ledger import ALL_IMPS, BudgetRow, Ledger
from impyard.gateway.policy import Policy, PolicyError, load_policy
from impyard.gateway.policy_models import NAME_PATTERN
from impyard.gateway.prices import usd_to_micros
from impyard.gateway.spending import (
    DEFAULT_DAYS,
    GROUPS,
    MAX_DAYS,
    InFlight,
    ScopeSpend,
    read_in_flight,
    read_spend,
)
from impyard.threads import in_thread

PAGE = Page("Budget", "/budget")
DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
EARLIEST, LATEST = date(2000, 1, 1), date(9999, 1, 1)
COUNT = re.compile(r"[0-9]{1,3}")
SEGMENTS = (*GROUPS, "in flight")  # a bar's segments, bottom first: charged per group, then what is reserved


@dataclass(frozen=True)
class ScopeView:
    """One imp's (or all imps') part of the page: its name, chart and days with spend."""

    scope: str
    name: str
    anchor: str
    spend: ScopeSpend
    chart: Chart


def _days(request: web.Request) -> int:
    text = request.query.get("days", "").strip()
    if not text:
        return DEFAULT_DAYS
    if not COUNT.fullmatch(text) or not 1 <= int(text) <= MAX_DAYS:
        raise web.HTTPBadRequest(text=f"days is a whole number from 1 to {MAX_DAYS}, not {text[:20]!r}\n")
    return int(text)


def _until(request: web.Request, today: date) -> date:
    text = request.query.get("until", "").strip()
    if not text:
        return today
    try:
        if not DAY.fullmatch(text):
            raise ValueError(text)
        until = date.fromisoformat(text)
        if not EARLIEST <= until <= LATEST:  # the window and its neighbours stay real days
            raise ValueError(text)
        return until
    except ValueError:
        raise web.HTTPBadRequest(text=f"until is a UTC day (YYYY-MM-DD), not {text[:20]!r}\n") from None


def _describe(day: str, total: int, parts: Sequence[tuple[str, int]]) -> str:
    return f"{day}: ${usd(total)} (" + ", ".join(f"{name} ${usd(value)}" for name, value in parts) + ")"


def _chart(spend: ScopeSpend) -> Chart:
    columns = [
        (day.day, [*((g, day.group(g)) for g in GROUPS), ("in flight", day.in_flight)]) for day in spend.days
    ]
    return stacked_bars(columns, describe=_describe)


def _view(spend: ScopeSpend) -> ScopeView:
    name = "all imps" if spend.scope == ALL_IMPS else spend.scope
    anchor = "spend-all" if spend.scope == ALL_IMPS else f"spend-imp-{spend.scope}"
    return ScopeView(spend.scope, name, anchor, spend, _chart(spend))


@PAGE.routes.get(PAGE.path)
async def budget_page(request: web.Request) -> web.Response:
    context = context_of(request)
    today = context.clock.now().date()
    days, until = _days(request), _until(request, today)
    policy: Policy | None
    try:
        policy, broken = await in_thread(load_policy), None
    except PolicyError as exc:  # the spend is still worth showing; the limits are not known
        policy, broken = None, str(exc.problems[0]) if exc.problems else str(exc)
    rows: list[BudgetRow] = []
    if policy is not None:
        names = [name for name in await in_thread(context.imps.names) if re.fullmatch(NAME_PATTERN, name)]
        rows = await context.db.run(Ledger(context.db, policy, context.clock).summary, names)
    report = await context.db.run(read_spend, context.db, last_day=until, days=days)
    in_flight: list[InFlight] = await context.db.run(read_in_flight, context.db)
    scopes = [
        ALL_IMPS,
        *sorted(({row.scope for row in rows} | {s.scope for s in report.scopes}) - {ALL_IMPS}),
    ]
    views = [_view(report.of(scope)) for scope in scopes]
    per_imp = policy.budgets.per_imp if policy is not None else None
    return render(
        request, "budget.html", title="Budget", rows=rows, views=views, in_flight=in_flight, report=report,
        days=days, until=until, today=today, earlier=until.fromordinal(until.toordinal() - days),
        later=until.fromordinal(until.toordinal() + days), broken=broken, groups=GROUPS, segments=SEGMENTS,
        all_imps=ALL_IMPS, default_daily=_micros(per_imp.daily_usd if per_imp else None),
        default_monthly=_micros(per_imp.monthly_usd if per_imp else None), has_policy=policy is not None,
    )  # fmt: skip


def _micros(value: float | None) -> int | None:
    return None if value is None else usd_to_micros(value)
