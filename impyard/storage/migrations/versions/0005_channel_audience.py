"""channel audience: who can read a channel, so that memory scopes follow it (issue 32 #4)

Revision ID: 0005
Revises: 0004
Created: 2026-12-06

``audience`` is ``guild`` (everyone in the server can read the channel), ``private`` (fewer can: Discord's
permission overwrites, a private thread, a thread of a private channel) or NULL: not known yet. Every row
written before this revision starts NULL; the Discord surface fills it in as the next message of the channel
arrives, and the first time a channel is found private its memories move to its own scope, once
(``impyard.memory.audience``: that is the data half of this upgrade, run by the host when it can know).
Portable operations only (docs/storage.md); never import impyard.storage.tables here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("channels", sa.Column("audience", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("channels", "audience")
