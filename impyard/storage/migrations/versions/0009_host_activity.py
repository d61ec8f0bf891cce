"""host activity: what each running host is doing now, for the console's Now page (issue 34)

Revision ID: 0009
Revises: 0008
Created: 2026-12-07

``host_activity``: one row per running ``impyard chat`` / ``serve`` process, keyed by its lease record's name
(``host:<hostname>/<pid>``), holding a bounded JSON snapshot of its live sessions (turns in flight with their
stage, queued messages, warm boxes). The host rewrites it at most once a second and only when it changed, and
deletes it when it stops cleanly; readers show it only while the host lease of the same name and ``holder`` is
held (``impyard.conversation.activity``), so a killed host's row never shows as live.

``wakes_finished``: the index that lists the newest turn outcomes (the Now page's recent outcomes) without
reading every wake.

Portable operations only (docs/storage.md); never import impyard.storage.tables here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_activity",
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.Column("snapshot", sa.Text(), server_default=sa.text("'{}'"), nullable=False),
        sa.PrimaryKeyConstraint("host"),
    )
    op.create_index("wakes_finished", "wakes", ["finished_at"])


def downgrade() -> None:
    raise NotImplementedError("impyard migrates forward only: restore a backup to go back")
