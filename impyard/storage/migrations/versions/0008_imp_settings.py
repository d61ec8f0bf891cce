"""imp settings: every imp's files in the shared store, with a revision (issue 36, "one source of truth for imps")

Revision ID: 0008
Revises: 0007
Created: 2026-12-07

One row per imp: its files (imp.toml, its persona, its news file) as one JSON object, their digest, and a revision
that grows by one at every change. Homes keep the files as a working copy (``impyard.imps.shared``). Portable
operations only (docs/storage.md); never import impyard.storage.tables here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "imp_settings",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("revision", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("files", sa.Text(), nullable=False),
        sa.Column("digest", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    raise NotImplementedError("impyard migrates forward only: restore a backup to go back")
