"""Imps: each imp of the home, its day, its warm boxes, its channels and today's spend (issue 34; docs/console.md).

Every part is read from the store the CLI reads it from, with the CLI's rules:

* the imps: ``ImpStore.scan`` (``impyard imp ls``): an imp whose imp.toml does not load is listed with its error;
* its day: the supervisor's clock (``impyard.memory.stats.clock_of``, as ``impyard memory stats``);
* its warm boxes and their runtime: what each live host's ``host:`` record says of the imps it serves
  (``impyard.storage.cluster``, as ``impyard hosts``); its ``[box]`` settings when no host serves it;
* its channels: those holding its history (``History.channels_of``, as ``impyard history``), each with its mode and
  trust from the channel store (``impyard channel ls``'s words);
* its spend: the ledger's summary and limits (``impyard budget show``).

``/imps/<name>`` shows one imp in full; a name that is not an imp's is a 404 line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from impyard.channels.store import ChannelInfo, ChannelStore, audience_words, kind_words, trust_words
from impyard.clock import Clock
from impyard.console.context import ConsoleContext, context_of
from impyard.console.page import Page
from impyard.console.render import render
from impyard.conversation.history import History
from impyard.durations import relative_time
from impyard.gateway.ledger import ALL_IMPS, BudgetRow, Ledger
from impyard.gateway.policy import Policy, PolicyError, load_policy
from impyard.imps.config import ImpConfig, ImpError, ImpNotFound, validate_name
from impyard.memory.stats import ClockStats, days
from impyard.storage.cluster import Cluster, HostRow, read_cluster
from impyard.storage.db import Database
from impyard.storage.leases import ImpBoxes
from impyard.threads import in_thread

PAGE = Page("Imps", "/imps")
CHANNELS_LISTED = 5  # on the list: the latest few; the imp's own page shows more
CHANNELS_SHOWN = 200  # on the imp's own page; the rest are counted


@dataclass(frozen=True)
class ChannelView:
    """A channel of the imp, in ``impyard channel ls``'s words (``info`` None: no settings recorded yet)."""

    channel_id: str
    info: ChannelInfo | None

    @property
    def known(self) -> ChannelInfo:
        return self.info or ChannelInfo(self.channel_id, surface="", kind="")

    @property
    def mode(self) -> str:
        return self.known.mode

    @property
    def trusted(self) -> str:
        return trust_words(self.known) if self.info is not None else "no"

    @property
    def is_trusted(self) -> bool:
        return self.trusted.startswith("yes")

    @property
    def kind(self) -> str:
        return kind_words(self.info) if self.info is not None else "?"

    @property
    def audience(self) -> str:
        return audience_words(self.info) if self.info is not None else "-"


@dataclass(frozen=True)
class Spend:
    """The imp's budget row (``impyard budget show``), or why it could not be read (a broken policy)."""

    row: BudgetRow | None = None
    error: str | None = None

    @property
    def today_fraction(self) -> float | None:
        """How much of today's limit is spent (0 to 1, for the meter); None without a limit."""
        if self.row is None or self.row.daily_limit is None:
            return None
        if self.row.daily_limit <= 0:
            return 1.0
        return min(1.0, self.row.daily_spent / self.row.daily_limit)


@dataclass(frozen=True)
class ImpView:
    name: str
    config: ImpConfig | None = None
    error: str | None = None  # imp.toml does not load: its first line
    day: ClockStats | None = None
    serving: list[tuple[HostRow, ImpBoxes]] = field(default_factory=list)
    channels: list[ChannelView] = field(default_factory=list)
    channel_count: int = 0
    spend: Spend = field(default_factory=Spend)

    @property
    def warm(self) -> int:
        return sum(box.warm for _, box in self.serving)


def first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def policy_problem(error: PolicyError) -> str:
    """A broken policy in one line, as the CLI says it."""
    more = (
        f" (and {len(error.problems) - 1} more problems; run `impyard policy check`)"
        if len(error.problems) > 1
        else ""
    )
    return f"the policy is broken: {error.problems[0]}{more}"


def budget_rows(db: Database, policy: Policy, clock: Clock, imps: Sequence[str]) -> dict[str, BudgetRow]:
    """``impyard budget show``'s rows by scope, with a row for each of ``imps`` that has none there (nothing spent
    this month, no override): its limits, nothing spent. Blocking."""
    ledger = Ledger(db, policy, clock)
    rows = {row.scope: row for row in ledger.summary()}
    for imp in imps:
        if imp not in rows:
            limits = ledger.limits(imp)
            rows[imp] = BudgetRow(imp, limits.daily, 0, limits.monthly, 0, 0, limits.source)
    return rows


def imp_channels(db: Database, clock: Clock, imp: str, limit: int) -> tuple[list[ChannelView], int]:
    """The channels holding ``imp``'s history, the latest first (at most ``limit``), and how many there are."""
    ids = History(db, clock).channels_of(imp)
    store = ChannelStore(db, clock)
    shown = db.read(lambda conn: [ChannelView(cid, store.info(cid, conn=conn)) for cid in ids[:limit]])
    return shown, len(ids)


def _scan(context: ConsoleContext) -> list[tuple[str, ImpConfig | ImpError]]:
    return context.imps.scan()


async def _policy() -> tuple[Policy | None, str | None]:
    try:
        return await in_thread(load_policy), None
    except PolicyError as exc:
        return None, policy_problem(exc)


async def gather(
    context: ConsoleContext, entries: Sequence[tuple[str, ImpConfig | ImpError]], channels: int
) -> tuple[list[ImpView], dict[str, BudgetRow], str | None, Cluster]:
    """Every view of ``entries`` (``channels``: how many of each imp's channels to list)."""
    db, clock = context.db, context.clock
    names = [name for name, item in entries if not isinstance(item, ImpError)]
    now = clock.now()
    cluster = await db.run(read_cluster, db, now)
    day = await db.run(days, db, names)
    policy, policy_error = await _policy()
    budgets = await db.run(budget_rows, db, policy, clock, names) if policy is not None else {}
    views: list[ImpView] = []
    for name, item in entries:
        if isinstance(item, ImpError):
            views.append(ImpView(name, error=first_line(item)))
            continue
        listed, count = await db.run(imp_channels, db, clock, name, channels)
        row = budgets.get(name)
        views.append(
            ImpView(
                name, config=item, day=day.get(name), serving=cluster.serving(name), channels=listed,
                channel_count=count, spend=Spend(row=row, error=policy_error if row is None else None),
            )
        )  # fmt: skip
    return views, budgets, policy_error, cluster


def _words(now: datetime) -> dict[str, Any]:
    """What the templates say times with: ``ago(when)`` as the CLI says it, beside the UTC time."""
    return {"now": now, "ago": lambda when: relative_time(when, now) if when is not None else "never"}


@PAGE.routes.get(PAGE.path)
async def imps_page(request: web.Request) -> web.Response:
    context = context_of(request)
    entries = await in_thread(_scan, context)
    views, budgets, policy_error, _ = await gather(context, entries, CHANNELS_LISTED)
    return render(
        request, "imps.html", title="Imps", views=views, everyone=budgets.get(ALL_IMPS),
        policy_error=policy_error, home=str(context.imps.root), **_words(context.clock.now()),
    )  # fmt: skip


def _one(context: ConsoleContext, name: str) -> list[tuple[str, ImpConfig | ImpError]]:
    """The imp of that name, its config or its error; ``ImpError`` when there is no such imp."""
    validate_name(name)
    if name not in context.imps.names():
        raise ImpNotFound(f"no imp {name!r} here: the imps are listed at /imps")
    try:
        return [(name, context.imps.get(name))]
    except ImpNotFound:
        raise
    except ImpError as exc:
        return [(name, exc)]


@PAGE.routes.get(PAGE.path + "/{name}")
async def imp_page(request: web.Request) -> web.Response:
    context = context_of(request)
    name = request.match_info["name"]
    try:
        entries = await in_thread(_one, context, name)
    except ImpError as exc:
        raise web.HTTPNotFound(text=first_line(exc) + "\n") from None
    views, budgets, policy_error, cluster = await gather(context, entries, CHANNELS_SHOWN)
    (view,) = views
    return render(
        request, "imp.html", title=view.name, view=view, policy_error=policy_error, cluster=cluster,
        **_words(context.clock.now()),
    )  # fmt: skip
