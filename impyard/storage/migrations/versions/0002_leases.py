"""leases: one holder at a time (issue 21) — a shard, a terminal channel, a host's own registration

Revision ID: 0002
Revises: 0001
Created: 2026-12-03

One row per lease, kept when released (its expiry set to the release time) so that the next holder's fencing
token is one more than the last one ever given. ``holder`` is ``liveness.Holder`` as text (host/boot/pid/start),
times are ISO-8601 UTC text like every other table's, ``detail`` is JSON text: what the holder says about itself.

Portable operations only: this runs on SQLite and on PostgreSQL (docs/storage.md). Never import impyard.storage.tables
here: a revision spells out its own change.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("token", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("acquired_at", sa.Text(), nullable=False),
        sa.Column("renewed_at", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), server_default=sa.text("'{}'"), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    raise NotImplementedError("impyard migrates forward only: restore a backup to go back")
