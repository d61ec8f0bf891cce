"""leases

Revision ID: 0002
Revises: 0001
Created: 2026-12-03 17:50:42.452553

Portable operations only: this runs on SQLite and on PostgreSQL (docs/storage.md). Use op.batch_alter_table for a
change SQLite cannot make in place. Never import impyard.tables here: a revision spells out its own change.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    raise NotImplementedError("impyard migrates forward only: restore a backup to go back")
