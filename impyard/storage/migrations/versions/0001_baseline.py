"""baseline: exactly the schema of the ten legacy SQLite migrations (impyard.storage.migrations.legacy.MIGRATIONS, user_version 10)

Revision ID: 0001
Revises:
Created: 2026-12-03

23 tables, their columns in the legacy order (columns added later by ALTER TABLE come last), defaults, keys,
unique constraints and indexes: a home built by the legacy list and stamped here, and a database built here, are
the same (tests/test_store_schema.py). Portable: micro-USD amounts, row ids and counters are BIGINT on PostgreSQL
and INTEGER on SQLite (where an INTEGER PRIMARY KEY stays the rowid, AUTOINCREMENT where the legacy said so);
reals are double precision there and REAL here; vectors BYTEA / BLOB.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("at", sa.Text(), nullable=False),
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("channel_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("method", sa.Text(), nullable=False),
        sa.Column("purpose", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("verdict", sa.Text(), nullable=False),
        sa.Column("rule", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("reason", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column(
            "cost_micros",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            server_default=sa.text("0"),
            nullable=False,
        ),
        sa.Column("gate_id", sa.Text(), nullable=True),
        sa.Column("latency_ms", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=True),
        sa.Column("detail", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("audit_imp", "audit", ["imp", "id"], unique=False)

    op.create_table(
        "budget_limits",
        sa.Column("scope", sa.Text(), nullable=True),
        sa.Column("daily_usd", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=True),
        sa.Column("monthly_usd", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=True),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("scope"),
    )
    op.create_table(
        "channels",
        sa.Column("channel_id", sa.Text(), nullable=True),
        sa.Column("surface", sa.Text(), server_default=sa.text("'discord'"), nullable=False),
        sa.Column("kind", sa.Text(), server_default=sa.text("'guild'"), nullable=False),
        sa.Column("name", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("guild_id", sa.Text(), nullable=True),
        sa.Column("trusted", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("mode", sa.Text(), server_default=sa.text("'all'"), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("channel_id"),
    )
    op.create_table(
        "earned_trust",
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("act", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("clean_approvals", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("imp", "act", "target"),
    )
    op.create_table(
        "gates",
        sa.Column("id", sa.Text(), nullable=True),
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("session_channel", sa.Text(), nullable=False),
        sa.Column("origin_guild", sa.Text(), nullable=True),
        sa.Column("act", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("payload_sha256", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("deadline", sa.Text(), nullable=False),
        sa.Column("decided_at", sa.Text(), nullable=True),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("decision_note", sa.Text(), nullable=True),
        sa.Column("executed_at", sa.Text(), nullable=True),
        sa.Column("message_ids", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("target_guild", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("gates_state", "gates", ["state", "deadline"], unique=False)

    op.create_table(
        "history",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("channel_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("author_id", sa.Text(), nullable=False),
        sa.Column("author_name", sa.Text(), nullable=False),
        sa.Column("author_bot", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("from_imp", sa.Text(), nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("reply_to_id", sa.Text(), nullable=True),
        sa.Column("attachments", sa.Text(), server_default=sa.text("'[]'"), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("channel_id", "message_id"),
        sqlite_autoincrement=True,
    )
    op.create_index("history_channel", "history", ["channel_id", "seq"], unique=False)

    op.create_table(
        "ledger",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("day", sa.Text(), nullable=False),
        sa.Column("month", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("reserved_micros", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cost_micros", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("method", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("purpose", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("model", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("settled_at", sa.Text(), nullable=True),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ledger_day", "ledger", ["day"], unique=False)
    op.create_index("ledger_imp_day", "ledger", ["imp", "day"], unique=False)
    op.create_index("ledger_imp_month", "ledger", ["imp", "month"], unique=False)
    op.create_index("ledger_month", "ledger", ["month"], unique=False)
    op.create_index("ledger_reserved", "ledger", ["state", "created_at"], unique=False)

    op.create_table(
        "memory_conversations",
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("channel_id", sa.Text(), nullable=False),
        sa.Column("person", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("imp", "channel_id", "person"),
    )
    op.create_table(
        "memory_departures",
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("channel_id", sa.Text(), nullable=False),
        sa.Column("person", sa.Text(), nullable=False),
        sa.Column("last_input_at", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("queued_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("imp", "channel_id", "person", "last_input_at"),
    )
    op.create_table(
        "memory_dispositions",
        sa.Column("id", sa.Text(), nullable=True),
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("rule", sa.Text(), nullable=False),
        sa.Column("weight", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=False),
        sa.Column("count", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("memory_dispositions_imp", "memory_dispositions", ["imp"], unique=False)

    op.create_table(
        "memory_forgotten_messages",
        sa.Column("channel_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("forgotten_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("channel_id", "message_id"),
    )
    op.create_index(
        "memory_forgotten_messages_at", "memory_forgotten_messages", ["forgotten_at"], unique=False
    )

    op.create_table(
        "memory_generations",
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column(
            "version",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            server_default=sa.text("0"),
            nullable=False,
        ),
        sa.Column(
            "deletes",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            server_default=sa.text("0"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("imp", "scope"),
    )
    op.create_table(
        "memory_records",
        sa.Column("id", sa.Text(), nullable=True),
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("construct_kind", sa.Text(), nullable=True),
        sa.Column("origin", sa.Text(), nullable=False),
        sa.Column("author", sa.Text(), nullable=False),
        sa.Column("author_id", sa.Text(), nullable=True),
        sa.Column("feeling", sa.Text(), nullable=False),
        sa.Column("conclusion", sa.Text(), nullable=False),
        sa.Column("mention_text", sa.Text(), nullable=False),
        sa.Column("valence", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=False),
        sa.Column("intensity", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=False),
        sa.Column("happened_at", sa.Text(), nullable=False),
        sa.Column("last_felt", sa.Text(), nullable=False),
        sa.Column("dims", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=True),
        sa.Column("gen", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("statement", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("memory_records_author", "memory_records", ["imp", "author_id"], unique=False)
    op.create_index(
        "memory_records_constructs",
        "memory_records",
        ["imp", "scope", "construct_kind", "last_felt", "gen"],
        unique=False,
    )
    op.create_index(
        "memory_records_felt", "memory_records", ["imp", "scope", "last_felt", "gen"], unique=False
    )
    op.create_index("memory_records_gen", "memory_records", ["imp", "scope", "dims", "gen"], unique=False)

    op.create_table(
        "memory_wakefulness",
        sa.Column("imp", sa.Text(), nullable=True),
        sa.Column("awake", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("woke_at", sa.Text(), nullable=True),
        sa.Column("slept_at", sa.Text(), nullable=True),
        sa.Column("last_activity_at", sa.Text(), nullable=True),
        sa.Column("last_channel", sa.Text(), nullable=True),
        sa.Column("wake_pending", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("introspected_idle", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("consolidated", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("last_reflection_at", sa.Text(), nullable=True),
        sa.Column("last_sleep_at", sa.Text(), nullable=True),
        sa.Column("last_consolidation_at", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("imp"),
    )
    op.create_table(
        "responder_counters",
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("channel_id", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("count", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.PrimaryKeyConstraint("imp", "channel_id", "outcome"),
    )
    op.create_table(
        "responder_imports",
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("imported_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("imp", "source"),
    )
    op.create_table(
        "responder_lines",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("channel_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("author", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("imp", "channel_id", "message_id", "role"),
        sqlite_autoincrement=True,
    )
    op.create_index("responder_lines_channel", "responder_lines", ["imp", "channel_id", "seq"], unique=False)

    op.create_table(
        "schedules",
        sa.Column("id", sa.Text(), nullable=True),
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), server_default=sa.text("'prompt'"), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=True),
        sa.Column("channel_id", sa.Text(), nullable=False),
        sa.Column("ceiling_s", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=False),
        sa.Column("wake_on_resolve", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("briefing", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("every_s", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=True),
        sa.Column("cron", sa.Text(), nullable=True),
        sa.Column("tz", sa.Text(), server_default=sa.text("'UTC'"), nullable=False),
        sa.Column("missed", sa.Text(), server_default=sa.text("'once'"), nullable=False),
        sa.Column("anchor", sa.Text(), nullable=False),
        sa.Column("next_run", sa.Text(), nullable=False),
        sa.Column("paused", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_fired", sa.Text(), nullable=True),
        sa.Column(
            "fired",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            server_default=sa.text("0"),
            nullable=False,
        ),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("schedules_due", "schedules", ["paused", "next_run"], unique=False)

    op.create_table(
        "tasks",
        sa.Column("id", sa.Text(), nullable=True),
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=True),
        sa.Column("person", sa.Text(), nullable=True),
        sa.Column("origin", sa.Text(), nullable=False),
        sa.Column("channel_id", sa.Text(), nullable=False),
        sa.Column("ceiling_s", sa.Double().with_variant(sa.REAL(), "sqlite"), nullable=False),
        sa.Column("wake_on_resolve", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("briefing", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("deferrals", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("not_before", sa.Text(), nullable=False),
        sa.Column("cancel_requested", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("box_outcome", sa.Text(), nullable=True),
        sa.Column("box_summary", sa.Text(), nullable=True),
        sa.Column("schedule_id", sa.Text(), nullable=True),
        sa.Column("scheduled_for", sa.Text(), nullable=True),
        sa.Column("parent_task", sa.Text(), nullable=True),
        sa.Column("parent_gate", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.Column("started_at", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.Text(), nullable=True),
        sa.Column("scope", sa.Text(), nullable=True),
        sa.Column("args", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("parent_gate"),
        sa.UniqueConstraint("schedule_id", "scheduled_for"),
    )
    op.create_index("tasks_imp", "tasks", ["imp", "finished_at"], unique=False)
    op.create_index("tasks_ready", "tasks", ["state", "not_before"], unique=False)

    op.create_table(
        "wakes",
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("channel_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("woken_at", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("imp", "channel_id", "message_id"),
    )
    op.create_index("wakes_unfinished", "wakes", ["outcome", "woken_at"], unique=False)

    op.create_table(
        "memory_episodes",
        sa.Column("id", sa.Text(), nullable=True),
        sa.Column("record_id", sa.Text(), nullable=False),
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("channel_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("author", sa.Text(), nullable=False),
        sa.Column("author_id", sa.Text(), nullable=True),
        sa.Column("as_happened", sa.Text(), nullable=False),
        sa.Column("told", sa.Text(), nullable=True),
        sa.Column("happened_at", sa.Text(), nullable=False),
        sa.Column("dims", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=True),
        sa.Column("gen", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.ForeignKeyConstraint(["record_id"], ["memory_records.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("memory_episodes_author", "memory_episodes", ["imp", "author_id"], unique=False)
    op.create_index("memory_episodes_gen", "memory_episodes", ["imp", "scope", "dims", "gen"], unique=False)
    op.create_index("memory_episodes_message", "memory_episodes", ["channel_id", "message_id"], unique=False)
    op.create_index("memory_episodes_record", "memory_episodes", ["record_id", "happened_at"], unique=False)

    op.create_table(
        "memory_slots",
        sa.Column("imp", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("record_id", sa.Text(), nullable=False),
        sa.Column("activated_at", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["record_id"], ["memory_records.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("imp", "scope", "record_id"),
    )
    op.create_index("memory_slots_record", "memory_slots", ["record_id"], unique=False)

    op.create_table(
        "task_runs",
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("backend", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("box_pid", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.Text(), nullable=False),
        sa.Column("finished_at", sa.Text(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("returncode", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_index("task_runs_task", "task_runs", ["task_id", "attempt"], unique=False)


def downgrade() -> None:
    raise NotImplementedError("the baseline is not undone: start from an empty database instead")
