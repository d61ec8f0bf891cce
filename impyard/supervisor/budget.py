"""Whether an imp may start a task now, from the ledger's settled spending (a pure rule)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from impyard.gateway.ledger import ALL_IMPS, BudgetRow, seconds_to_next_day, seconds_to_next_month


def budget_wait(rows: Sequence[BudgetRow], imp: str, now: datetime) -> tuple[int, str] | None:
    """Seconds until ``imp`` may spend again (the longest exhausted window), and which window; None if it may now.

    Only settled spending counts here: reservations in flight may settle lower. A task that starts and
    then meets the hard stop inside its box is deferred after its run instead (``attest``).
    """
    waits: list[tuple[int, str]] = []
    for row in rows:
        if row.scope not in (imp, ALL_IMPS):
            continue
        name = "all imps" if row.scope == ALL_IMPS else f"imp {imp}"
        if row.monthly_limit is not None and row.monthly_spent - row.reserved >= row.monthly_limit:
            waits.append((seconds_to_next_month(now), f"{name}: monthly budget"))
        if row.daily_limit is not None and row.daily_spent - row.reserved >= row.daily_limit:
            waits.append((seconds_to_next_day(now), f"{name}: daily budget"))
    return max(waits) if waits else None
