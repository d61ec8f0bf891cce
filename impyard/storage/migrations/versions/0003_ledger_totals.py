"""ledger totals: running sums per scope and window, so a reservation's check reads four rows (issue 21)

Revision ID: 0003
Revises: 0002
Created: 2026-12-03

One row per (scope, period): ``scope`` is an imp or ``*`` (all imps), ``period`` is ``day:YYYY-MM-DD`` or
``month:YYYY-MM`` (UTC, the ledger row's own ``day`` and ``month``). ``reserved_micros`` is what is in flight,
``settled_micros`` what was charged; their sum is what the window has spent. The ledger's rows stay the truth
(``budget show``, audit); these move with them in the same transaction. The data step fills them from the rows
an upgraded home already has, so its caps stay right.

Portable operations only: this runs on SQLite and on PostgreSQL (docs/storage.md). Never import impyard.storage.tables
here: a revision spells out its own change.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

BIG = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    totals = op.create_table(
        "ledger_totals",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("period", sa.Text(), nullable=False),
        sa.Column("reserved_micros", BIG, server_default=sa.text("0"), nullable=False),
        sa.Column("settled_micros", BIG, server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("scope", "period"),
    )
    ledger = sa.table(
        "ledger",
        sa.column("imp", sa.Text()),
        sa.column("day", sa.Text()),
        sa.column("month", sa.Text()),
        sa.column("state", sa.Text()),
        sa.column("reserved_micros", BIG),
        sa.column("cost_micros", BIG),
    )
    reserved = sa.case((ledger.c.state == "reserved", ledger.c.reserved_micros), else_=0)
    settled = sa.case((ledger.c.state == "reserved", 0), else_=sa.func.coalesce(ledger.c.cost_micros, 0))
    every = sa.literal("*", sa.Text())
    parts = [
        sa.select(
            scope.label("scope"),
            (sa.literal(prefix, sa.Text()) + key).label("period"),
            reserved.label("reserved"),
            settled.label("settled"),
        ).select_from(ledger)
        for scope in (ledger.c.imp, every)
        for prefix, key in (("day:", ledger.c.day), ("month:", ledger.c.month))
    ]
    rows = sa.union_all(*parts).subquery("amounts")
    op.execute(
        totals.insert().from_select(
            ["scope", "period", "reserved_micros", "settled_micros"],
            sa.select(
                rows.c.scope, rows.c.period, sa.func.sum(rows.c.reserved), sa.func.sum(rows.c.settled)
            ).group_by(rows.c.scope, rows.c.period),
        )
    )


def downgrade() -> None:
    raise NotImplementedError("impyard migrates forward only: restore a backup to go back")
