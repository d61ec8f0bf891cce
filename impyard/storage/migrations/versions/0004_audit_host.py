"""audit host: each audit row names the host process that wrote it (issue 21, several hosts on one database)

Revision ID: 0004
Revises: 0003
Created: 2026-12-03

``host`` is ``<hostname>/<pid>`` of the impyard process that wrote the row; rows written before this revision
keep ''. Portable operations only (docs/storage.md); never import impyard.storage.tables here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit", sa.Column("host", sa.Text(), server_default=sa.text("''"), nullable=False))


def downgrade() -> None:
    op.drop_column("audit", "host")
