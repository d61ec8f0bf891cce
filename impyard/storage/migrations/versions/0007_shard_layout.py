"""shard layout: one Discord shard layout per database (issue 36)

Revision ID: 0007
Revises: 0006
Created: 2026-12-07

One row per surface (``discord``): how many shards the database's ``impyard serve`` hosts split Discord into
(``shards``; NULL: served unsharded, by ``serve`` without ``--shard``), the process that fixed it (``fixed_by``,
``liveness.Holder`` as text) and when (ISO-8601 UTC text). The first serving host writes it, inside the
transaction that takes its shard's lease (``impyard.storage.shard_layout``); a host of another layout is refused
while any host holds a lease of this one. A new table: no existing row is touched, so an old home migrates as it
is. Portable operations only (docs/storage.md); never import impyard.storage.tables here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shard_layout",
        sa.Column("surface", sa.Text(), nullable=False),
        sa.Column("shards", sa.Integer(), nullable=True),
        sa.Column("fixed_by", sa.Text(), nullable=False),
        sa.Column("fixed_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("surface"),
    )


def downgrade() -> None:
    raise NotImplementedError("impyard migrates forward only: restore a backup to go back")
