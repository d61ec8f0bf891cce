"""``impyard budget``: what the imps may spend on the model API, and what they have spent."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import click

from impyard.cli.database import open_or_fail
from impyard.cli.errors import CliError
from impyard.cli.output import Col, Output, output_options
from impyard.cli.policy import load_policy_or_fail
from impyard.clock import SystemClock
from impyard.gateway.ledger import ALL_IMPS, BudgetLimitError, BudgetRow, Ledger
from impyard.gateway.policy_models import MAX_USD, NAME_PATTERN
from impyard.gateway.spending import DEFAULT_DAYS, GROUPS, MAX_DAYS, DaySpend, read_spend
from impyard.imps.store import ImpConfigError, ImpError, ImpStore

_POLICY_OPTION = click.option(
    "--policies", type=click.Path(path_type=Path, file_okay=False), default=None,
    help="Operator policy directory (default: $IMPYARD_POLICY_DIR or IMPYARD_HOME/policies).",
)  # fmt: skip


def _ledger(policies: Path | None) -> Ledger:
    policy = load_policy_or_fail(policies)
    return Ledger(open_or_fail(), policy, SystemClock())


def _usd(micros: int | None) -> str:
    return "no limit" if micros is None else f"{micros / 1_000_000:.4f}"


def _budget_json(row: BudgetRow) -> dict[str, object]:
    return {
        "scope": "all" if row.scope == ALL_IMPS else row.scope,
        "daily_limit_usd": None if row.daily_limit is None else row.daily_limit / 1_000_000,
        "daily_spent_usd": row.daily_spent / 1_000_000,
        "monthly_limit_usd": None if row.monthly_limit is None else row.monthly_limit / 1_000_000,
        "monthly_spent_usd": row.monthly_spent / 1_000_000,
        "reserved_usd": row.reserved / 1_000_000,
        "source": row.source,
    }


def _budget_row(row: BudgetRow) -> tuple[str, ...]:
    return (
        "all imps" if row.scope == ALL_IMPS else row.scope, _usd(row.daily_spent), _usd(row.daily_limit),
        _usd(row.monthly_spent), _usd(row.monthly_limit), _usd(row.reserved), row.source,
    )  # fmt: skip


@click.group("budget")
def budget_group() -> None:
    """Model spending limits per imp and for all imps (USD per UTC day and month).

    \b
    Example:
      impyard budget show
      impyard budget set pip --daily 1.50
    """


@budget_group.command("show")
@_POLICY_OPTION
@output_options
def show_command(policies: Path | None, out: Output) -> None:
    """Show limits and spending today and this month ("*" is all imps together).

    \b
    Example:
      impyard budget show
    """
    ledger = _ledger(policies)
    rows = ledger.summary()
    ledger.db.close()
    out.listing(
        [_budget_json(row) for row in rows],
        columns=(
            "imp",
            "today $",
            "daily limit $",
            "this month $",
            "monthly limit $",
            "in flight $",
            "limits from",
        ),
        rows=(_budget_row(row) for row in rows),
    )
    if out.as_json:
        return
    default = ledger.policy.budgets.per_imp
    click.echo(
        f"any other imp: daily {_usd(None if default.daily_usd is None else round(default.daily_usd * 1e6))}, "
        f"monthly {_usd(None if default.monthly_usd is None else round(default.monthly_usd * 1e6))} "
        "(policy [budgets.per_imp])"
    )


def _spend_json(scope: str, day: DaySpend) -> dict[str, object]:
    return {
        "scope": "all" if scope == ALL_IMPS else scope,
        "day": day.day,
        **{f"{group}_usd": day.group(group) / 1_000_000 for group in GROUPS},
        "in_flight_usd": day.in_flight / 1_000_000,
        "total_usd": day.total / 1_000_000,
    }


def _spend_row(scope: str, day: DaySpend) -> tuple[str, ...]:
    return (
        "all imps" if scope == ALL_IMPS else scope, day.day, *(_usd(day.group(group)) for group in GROUPS),
        _usd(day.in_flight), _usd(day.total),
    )  # fmt: skip


def _day(ctx: click.Context, param: click.Parameter, value: str | None) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a UTC day (YYYY-MM-DD)") from None


@budget_group.command("spend")
@click.option(
    "--days", type=click.IntRange(1, MAX_DAYS), default=DEFAULT_DAYS, show_default=True,
    help="How many UTC days, ending with --until.",
)  # fmt: skip
@click.option(
    "--until", "until", callback=_day, default=None, help="The last UTC day (YYYY-MM-DD; default today)."
)
@click.option("--imp", default=None, help="Only this imp (default: all imps together, then each imp).")
@output_options
def spend_command(days: int, until: date | None, imp: str | None, out: Output) -> None:
    """Spend per UTC day and purpose group: reply, memory, tasks, other (USD).

    Each day with any spend: what was charged per group, what is still in
    flight (reserved by calls under way) and the total its budget window
    counts. Tasks: every call a task run made; reply: the reply and its
    pictures; memory: every memory call and the embedding; other: the rest.
    The console's Budget page shows the same numbers.

    \b
    Examples:
      impyard budget spend
      impyard budget spend --imp pip --days 30
      impyard budget spend --until 2026-05-10 --json
    """
    if imp is not None and not re.fullmatch(NAME_PATTERN, imp):
        raise CliError(f"{imp!r} is not an imp name (letters, digits, _ . -)")
    db = open_or_fail()
    try:
        report = read_spend(db, last_day=until or SystemClock().now().date(), days=days, imp=imp)
    finally:
        db.close()
    spent = [(scope.scope, day) for scope in report.scopes for day in scope.spent_days]
    out.listing(
        [_spend_json(scope, day) for scope, day in spent],
        columns=(
            "imp",
            Col("day (UTC)", no_wrap=True),
            *(f"{group} $" for group in GROUPS),
            "in flight $",
            "total $",
        ),  # fmt: skip
        rows=(_spend_row(scope, day) for scope, day in spent),
        empty=f"no spend from {report.days[0]} to {report.days[-1]} (UTC)"
        + (f" for {imp}" if imp is not None else ""),
    )


def _require_imp(name: str) -> None:
    """Refuse a name that is not an imp here, listing the imps there are (as ``schedule add`` does)."""
    try:
        ImpStore().get(name)
    except ImpConfigError:
        return  # it exists; its broken imp.toml is `imp show`'s business, not the budget's
    except ImpError as exc:
        raise CliError(str(exc).splitlines()[0]) from exc


@budget_group.command("set")
@click.argument("imp")
@click.option("--daily", type=click.FloatRange(min=0, max=MAX_USD), default=None, help="USD per UTC day.")
@click.option("--monthly", type=click.FloatRange(min=0, max=MAX_USD), default=None, help="USD per UTC month.")
@click.option("--clear", is_flag=True, help="Drop the override; the policy's limits apply again.")
@_POLICY_OPTION
def set_command(
    imp: str, daily: float | None, monthly: float | None, clear: bool, policies: Path | None
) -> None:
    """Override the policy's budget for IMP ("all" for all imps together); kept in the database.

    IMP must be an imp here (`impyard imp ls`); --clear also drops a removed imp's override.

    \b
    Examples:
      impyard budget set pip --daily 1.50 --monthly 20
      impyard budget set all --monthly 100
      impyard budget set pip --clear
    """
    scope = ALL_IMPS if imp == "all" else imp
    if scope != ALL_IMPS and not re.fullmatch(NAME_PATTERN, imp):
        raise CliError(f"{imp!r} is not an imp name (letters, digits, _ . -); use 'all' for all imps")
    if not clear and daily is None and monthly is None:
        raise CliError("nothing to set: give --daily USD and/or --monthly USD (or --clear)")
    ledger = _ledger(policies)
    try:
        # a typo must not set a budget nobody spends; a removed imp's override may still be cleared
        if scope != ALL_IMPS and not (clear and "override" in ledger.limits(scope).source):
            _require_imp(imp)
        if clear:
            ledger.clear_limits(scope)
        else:
            ledger.set_limits(scope, daily_usd=daily, monthly_usd=monthly)
        limits = ledger.limits(scope)
    except BudgetLimitError as exc:  # nan passes click's range check; the ledger refuses it (issue 11 #10)
        raise CliError(str(exc)) from exc
    finally:
        ledger.db.close()
    who = "all imps" if scope == ALL_IMPS else imp
    click.echo(
        f"budget for {who}: daily {_usd(limits.daily)} USD, monthly {_usd(limits.monthly)} USD ({limits.source})"
    )
