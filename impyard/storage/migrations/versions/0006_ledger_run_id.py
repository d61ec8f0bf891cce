"""ledger run id: each reservation names the box run that made the call, so spend is read per origin (issue 34)

Revision ID: 0006
Revises: 0005
Created: 2026-12-07

``run_id`` is the run of the box that asked (the audit row's ``run_id``): a task run's id (``task_runs.run_id``)
for a call a task made, a chat box's own id otherwise. The console's Budget page and ``impyard budget spend`` count
a call a task run made under "tasks". Rows written before this revision keep '' and count by their purpose alone.
Portable operations only (docs/storage.md); never import impyard.storage.tables here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ledger", sa.Column("run_id", sa.Text(), server_default=sa.text("''"), nullable=False))


def downgrade() -> None:
    op.drop_column("ledger", "run_id")
