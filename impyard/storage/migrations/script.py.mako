"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Created: ${create_date}

Portable operations only: this runs on SQLite and on PostgreSQL (docs/storage.md). Use op.batch_alter_table for a
change SQLite cannot make in place. Never import impyard.storage.tables here: a revision spells out its own change.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
revision = "${up_revision}"
down_revision = ${'"%s"' % down_revision if down_revision else "None"}
branch_labels = None
depends_on = None


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else 'raise NotImplementedError("impyard migrates forward only: restore a backup to go back")'}
