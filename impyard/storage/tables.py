"""The host database's tables as SQLAlchemy Core objects, for the stores' portable SQL (docs/storage.md).

This is the schema as it stands at the newest migration (impyard/storage/migrations/versions/); a test holds the two
together (tests/test_store_schema.py), so a store's ``select(ledger)`` names exactly the columns a migrated
database has, on SQLite and on PostgreSQL. Migrations never import this module: each revision spells out its own
change, so that history stays what it was when it shipped.

Portable types: ``Text`` times (ISO-8601 UTC) and ids; ``Integer`` flags (0/1) and small counts; ``BIG`` for
micro-USD amounts, row ids and counters that only grow (BIGINT on PostgreSQL, INTEGER on SQLite, where it is
the same 64-bit integer and an ``INTEGER PRIMARY KEY`` stays the rowid); ``DOUBLE`` for reals (double precision on
PostgreSQL, REAL on SQLite); ``LargeBinary`` for vectors (BYTEA / BLOB).
"""

from __future__ import annotations

from sqlalchemy import (
    REAL,
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.types import TypeEngine

BIG: TypeEngine[int] = BigInteger().with_variant(Integer(), "sqlite")
DOUBLE: TypeEngine[float] = Double().with_variant(REAL(), "sqlite")

metadata = MetaData()


def _key(name: str, type_: object = Text) -> Column[object]:
    """A one-column primary key, declared as the legacy SQLite schema did: without NOT NULL (PostgreSQL makes
    every key column NOT NULL anyway; on SQLite an INTEGER one stays the rowid)."""
    return Column(name, type_, primary_key=True, nullable=True)  # type: ignore[arg-type]


def _part(name: str) -> Column[str]:
    """A column of a composite primary key (declared NOT NULL, as the legacy schema did)."""
    return Column(name, Text, primary_key=True, nullable=False)


ZERO = text("0")
ONE = text("1")

# --- gateway (legacy migrations 1, 4, 9) --------------------------------------------------------------------

channels = Table(
    "channels", metadata,
    _key("channel_id"),
    Column("surface", Text, nullable=False, server_default=text("'discord'")),
    Column("kind", Text, nullable=False, server_default=text("'guild'")),
    Column("name", Text, nullable=False, server_default=text("''")),
    Column("guild_id", Text),
    Column("trusted", Integer, nullable=False, server_default=ZERO),
    Column("mode", Text, nullable=False, server_default=text("'all'")),
    Column("updated_at", Text, nullable=False),
    Column("audience", Text),  # guild | private | NULL: not known yet (revision 0005, issue 32 #4)
)  # fmt: skip

ledger = Table(
    "ledger", metadata,
    _key("id", BIG),
    Column("imp", Text, nullable=False),
    Column("day", Text, nullable=False),
    Column("month", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("reserved_micros", BIG, nullable=False),
    Column("cost_micros", BIG),
    Column("method", Text, nullable=False, server_default=text("''")),
    Column("purpose", Text, nullable=False, server_default=text("''")),
    Column("model", Text, nullable=False, server_default=text("''")),
    Column("created_at", Text, nullable=False),
    Column("settled_at", Text),
    Column("owner", Text),
    Column("run_id", Text, nullable=False, server_default=text("''")),  # the box run that asked (0006)
    Index("ledger_imp_day", "imp", "day"),
    Index("ledger_imp_month", "imp", "month"),
    Index("ledger_day", "day"),
    Index("ledger_month", "month"),
    Index("ledger_reserved", "state", "created_at"),
)  # fmt: skip

budget_limits = Table(
    "budget_limits", metadata,
    _key("scope"),
    Column("daily_usd", DOUBLE),
    Column("monthly_usd", DOUBLE),
    Column("updated_at", Text, nullable=False),
)  # fmt: skip

gates = Table(
    "gates", metadata,
    _key("id"),
    Column("imp", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("session_channel", Text, nullable=False),
    Column("origin_guild", Text),
    Column("act", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("payload", Text, nullable=False),
    Column("payload_sha256", Text, nullable=False),
    Column("reason", Text, nullable=False, server_default=text("''")),
    Column("state", Text, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("deadline", Text, nullable=False),
    Column("decided_at", Text),
    Column("decided_by", Text),
    Column("decision_note", Text),
    Column("executed_at", Text),
    Column("message_ids", Text),
    Column("error", Text),
    Column("target_guild", Text),
    Index("gates_state", "state", "deadline"),
)  # fmt: skip

earned_trust = Table(
    "earned_trust", metadata,
    _part("imp"),
    _part("act"),
    _part("target"),
    Column("clean_approvals", Integer, nullable=False, server_default=ZERO),
    Column("updated_at", Text, nullable=False),
)  # fmt: skip

audit = Table(
    "audit", metadata,
    _key("id", BIG),
    Column("at", Text, nullable=False),
    Column("imp", Text, nullable=False),
    Column("run_id", Text, nullable=False, server_default=text("''")),
    Column("channel_id", Text, nullable=False, server_default=text("''")),
    Column("method", Text, nullable=False),
    Column("purpose", Text, nullable=False, server_default=text("''")),
    Column("verdict", Text, nullable=False),
    Column("rule", Text, nullable=False, server_default=text("''")),
    Column("reason", Text, nullable=False, server_default=text("''")),
    Column("cost_micros", BIG, nullable=False, server_default=ZERO),
    Column("gate_id", Text),
    Column("latency_ms", DOUBLE),
    Column("detail", Text, nullable=False, server_default=text("''")),
    Index("audit_imp", "imp", "id"),
    Column("host", Text, nullable=False, server_default=text("''")),  # <hostname>/<pid> that wrote it (0004)
)  # fmt: skip

# --- conversation (legacy migration 2) ----------------------------------------------------------------------

history = Table(
    "history", metadata,
    _key("seq", BIG),
    Column("channel_id", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("author_id", Text, nullable=False),
    Column("author_name", Text, nullable=False),
    Column("author_bot", Integer, nullable=False, server_default=ZERO),
    Column("from_imp", Text),
    Column("content", Text, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("reply_to_id", Text),
    Column("attachments", Text, nullable=False, server_default=text("'[]'")),
    UniqueConstraint("channel_id", "message_id"),
    Index("history_channel", "channel_id", "seq"),
    sqlite_autoincrement=True,  # seq never reuses a trimmed row's number
)  # fmt: skip

wakes = Table(
    "wakes", metadata,
    _part("imp"),
    _part("channel_id"),
    _part("message_id"),
    Column("woken_at", Text, nullable=False),
    Column("outcome", Text),
    Column("error", Text),
    Column("finished_at", Text),
    Index("wakes_unfinished", "outcome", "woken_at"),
    Index("wakes_finished", "finished_at"),  # the newest outcomes first (revision 0009, the console's Now page)
)  # fmt: skip

# --- supervise (legacy migrations 3, 8) ---------------------------------------------------------------------

tasks = Table(
    "tasks", metadata,
    _key("id"),
    Column("imp", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("prompt", Text),
    Column("person", Text),
    Column("origin", Text, nullable=False),
    Column("channel_id", Text, nullable=False),
    Column("ceiling_s", DOUBLE, nullable=False),
    Column("wake_on_resolve", Integer, nullable=False, server_default=ZERO),
    Column("briefing", Integer, nullable=False, server_default=ZERO),
    Column("state", Text, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=ZERO),
    Column("deferrals", Integer, nullable=False, server_default=ZERO),
    Column("not_before", Text, nullable=False),
    Column("cancel_requested", Integer, nullable=False, server_default=ZERO),
    Column("run_id", Text),
    Column("outcome", Text),
    Column("box_outcome", Text),
    Column("box_summary", Text),
    Column("schedule_id", Text),
    Column("scheduled_for", Text),
    Column("parent_task", Text),
    Column("parent_gate", Text, unique=True),
    Column("created_at", Text, nullable=False),
    Column("updated_at", Text, nullable=False),
    Column("started_at", Text),
    Column("finished_at", Text),
    Column("scope", Text),
    Column("args", Text),
    UniqueConstraint("schedule_id", "scheduled_for"),
    Index("tasks_ready", "state", "not_before"),
    Index("tasks_imp", "imp", "finished_at"),
)  # fmt: skip

task_runs = Table(
    "task_runs", metadata,
    _key("run_id"),
    Column("task_id", Text, ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("backend", Text, nullable=False, server_default=text("''")),
    Column("box_pid", Integer),
    Column("started_at", Text, nullable=False),
    Column("finished_at", Text),
    Column("result", Text),
    Column("returncode", Integer),
    Column("detail", Text),
    Index("task_runs_task", "task_id", "attempt"),
)  # fmt: skip

schedules = Table(
    "schedules", metadata,
    _key("id"),
    Column("imp", Text, nullable=False),
    Column("kind", Text, nullable=False, server_default=text("'prompt'")),
    Column("prompt", Text),
    Column("channel_id", Text, nullable=False),
    Column("ceiling_s", DOUBLE, nullable=False),
    Column("wake_on_resolve", Integer, nullable=False, server_default=ZERO),
    Column("briefing", Integer, nullable=False, server_default=ZERO),
    Column("every_s", DOUBLE),
    Column("cron", Text),
    Column("tz", Text, nullable=False, server_default=text("'UTC'")),
    Column("missed", Text, nullable=False, server_default=text("'once'")),
    Column("anchor", Text, nullable=False),
    Column("next_run", Text, nullable=False),
    Column("paused", Integer, nullable=False, server_default=ZERO),
    Column("last_fired", Text),
    Column("fired", BIG, nullable=False, server_default=ZERO),
    Column("created_at", Text, nullable=False),
    Column("updated_at", Text, nullable=False),
    Index("schedules_due", "paused", "next_run"),
)  # fmt: skip

# --- memory (legacy migrations 5-8) -------------------------------------------------------------------------

memory_records = Table(
    "memory_records", metadata,
    _key("id"),
    Column("imp", Text, nullable=False),
    Column("scope", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("construct_kind", Text),
    Column("origin", Text, nullable=False),
    Column("author", Text, nullable=False),
    Column("author_id", Text),
    Column("feeling", Text, nullable=False),
    Column("conclusion", Text, nullable=False),
    Column("mention_text", Text, nullable=False),
    Column("valence", DOUBLE, nullable=False),
    Column("intensity", DOUBLE, nullable=False),
    Column("happened_at", Text, nullable=False),
    Column("last_felt", Text, nullable=False),
    Column("dims", Integer, nullable=False, server_default=ZERO),
    Column("vector", LargeBinary),
    Column("gen", BIG, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("statement", Text),
    Index("memory_records_felt", "imp", "scope", "last_felt", "gen"),
    Index("memory_records_constructs", "imp", "scope", "construct_kind", "last_felt", "gen"),
    Index("memory_records_gen", "imp", "scope", "dims", "gen"),
    Index("memory_records_author", "imp", "author_id"),
)  # fmt: skip

memory_episodes = Table(
    "memory_episodes", metadata,
    _key("id"),
    Column("record_id", Text, ForeignKey("memory_records.id", ondelete="CASCADE"), nullable=False),
    Column("imp", Text, nullable=False),
    Column("scope", Text, nullable=False),
    Column("channel_id", Text, nullable=False, server_default=text("''")),
    Column("message_id", Text),
    Column("author", Text, nullable=False),
    Column("author_id", Text),
    Column("as_happened", Text, nullable=False),
    Column("told", Text),
    Column("happened_at", Text, nullable=False),
    Column("dims", Integer, nullable=False, server_default=ZERO),
    Column("vector", LargeBinary),
    Column("gen", BIG, nullable=False),
    Index("memory_episodes_record", "record_id", "happened_at"),
    Index("memory_episodes_gen", "imp", "scope", "dims", "gen"),
    Index("memory_episodes_message", "channel_id", "message_id"),
    Index("memory_episodes_author", "imp", "author_id"),
)  # fmt: skip

memory_conversations = Table(
    "memory_conversations", metadata,
    _part("imp"),
    Column("scope", Text, nullable=False),
    _part("channel_id"),
    _part("person"),
    Column("state", Text, nullable=False),
    Column("updated_at", Text, nullable=False),
)  # fmt: skip

memory_generations = Table(
    "memory_generations", metadata,
    _part("imp"),
    _part("scope"),
    Column("version", BIG, nullable=False, server_default=ZERO),
    Column("deletes", BIG, nullable=False, server_default=ZERO),
)  # fmt: skip

memory_forgotten_messages = Table(
    "memory_forgotten_messages", metadata,
    _part("channel_id"),
    _part("message_id"),
    Column("forgotten_at", Text, nullable=False),
    Index("memory_forgotten_messages_at", "forgotten_at"),
)  # fmt: skip

memory_slots = Table(
    "memory_slots", metadata,
    _part("imp"),
    _part("scope"),
    Column("record_id", Text, ForeignKey("memory_records.id", ondelete="CASCADE"), primary_key=True, nullable=False),
    Column("activated_at", Text, nullable=False),
    Index("memory_slots_record", "record_id"),
)  # fmt: skip

memory_dispositions = Table(
    "memory_dispositions", metadata,
    _key("id"),
    Column("imp", Text, nullable=False),
    Column("rule", Text, nullable=False),
    Column("weight", DOUBLE, nullable=False),
    Column("count", Integer, nullable=False, server_default=ONE),
    Column("created_at", Text, nullable=False),
    Column("updated_at", Text, nullable=False),
    Index("memory_dispositions_imp", "imp"),
)  # fmt: skip

memory_departures = Table(
    "memory_departures", metadata,
    _part("imp"),
    _part("channel_id"),
    _part("person"),
    _part("last_input_at"),
    Column("task_id", Text),
    Column("queued_at", Text, nullable=False),
)  # fmt: skip

memory_wakefulness = Table(
    "memory_wakefulness", metadata,
    _key("imp"),
    Column("awake", Integer, nullable=False, server_default=ZERO),
    Column("woke_at", Text),
    Column("slept_at", Text),
    Column("last_activity_at", Text),
    Column("last_channel", Text),
    Column("wake_pending", Integer, nullable=False, server_default=ZERO),
    Column("introspected_idle", Integer, nullable=False, server_default=ZERO),
    Column("consolidated", Integer, nullable=False, server_default=ONE),
    Column("last_reflection_at", Text),
    Column("last_sleep_at", Text),
    Column("last_consolidation_at", Text),
    Column("updated_at", Text, nullable=False),
)  # fmt: skip

# --- the responder's own lines (legacy migration 10) --------------------------------------------------------

responder_lines = Table(
    "responder_lines", metadata,
    _key("seq", BIG),
    Column("imp", Text, nullable=False),
    Column("channel_id", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("author", Text, nullable=False),
    Column("content", Text, nullable=False),
    Column("at", Text, nullable=False),
    UniqueConstraint("imp", "channel_id", "message_id", "role"),
    Index("responder_lines_channel", "imp", "channel_id", "seq"),
    sqlite_autoincrement=True,
)  # fmt: skip

responder_counters = Table(
    "responder_counters", metadata,
    _part("imp"),
    _part("channel_id"),
    _part("outcome"),
    Column("count", BIG, nullable=False),
)  # fmt: skip

responder_imports = Table(
    "responder_imports", metadata,
    _part("imp"),
    _part("source"),
    Column("lines", Integer, nullable=False),
    Column("skipped", Integer, nullable=False),
    Column("imported_at", Text, nullable=False),
)  # fmt: skip

# --- one holder at a time (revision 0002) -------------------------------------------------------------------

leases = Table(
    "leases", metadata,
    Column("name", Text, primary_key=True, nullable=False),  # shard:I/N, channel:<id>, host:<hostname>/<pid>
    Column("holder", Text, nullable=False),  # liveness.Holder as text: host/boot/pid/start
    Column("token", BIG, nullable=False),  # the fencing token: one more at every change of holder, never less
    Column("acquired_at", Text, nullable=False),
    Column("renewed_at", Text, nullable=False),
    Column("expires_at", Text, nullable=False),  # a released lease keeps its row, expiring at its release
    Column("detail", Text, nullable=False, server_default=text("'{}'")),  # JSON: what the holder says of itself
)  # fmt: skip

# --- one shard layout per database (revision 0007, issue 36) ------------------------------------------------

shard_layout = Table(
    "shard_layout", metadata,
    Column("surface", Text, primary_key=True, nullable=False),  # discord
    Column("shards", Integer),  # N of `serve --shard I/N`; NULL: served by `serve` without --shard
    Column("fixed_by", Text, nullable=False),  # liveness.Holder as text: the host that fixed it
    Column("fixed_at", Text, nullable=False),
)  # fmt: skip

# --- the budget's running totals (revision 0003) ------------------------------------------------------------

ledger_totals = Table(
    "ledger_totals", metadata,
    _part("scope"),  # an imp, or "*": all imps together
    _part("period"),  # "day:YYYY-MM-DD" or "month:YYYY-MM" (UTC): the ledger row's own day and month
    Column("reserved_micros", BIG, nullable=False, server_default=ZERO),  # in flight
    Column("settled_micros", BIG, nullable=False, server_default=ZERO),  # charged
)  # fmt: skip

# --- every imp's settings, shared by the hosts of a database (revision 0008) -----------------------------------

imp_settings = Table(
    "imp_settings", metadata,
    Column("name", Text, primary_key=True, nullable=False),
    Column("revision", BIG, nullable=False),  # one more at every change, never less
    Column("files", Text, nullable=False),  # JSON: {"imp.toml": …, "persona.md": …}
    Column("digest", Text, nullable=False),  # sha256 of the files (impyard.imps.shared.digest)
    Column("updated_at", Text, nullable=False),
    Column("updated_by", Text, nullable=False),  # <hostname>/<pid> (<account>) that wrote it
)  # fmt: skip

# --- what each running host is doing now (revision 0009, issue 34: the console's Now page) --------------------

host_activity = Table(
    "host_activity", metadata,
    Column("host", Text, primary_key=True, nullable=False),  # its lease record's name: host:<hostname>/<pid>
    Column("holder", Text, nullable=False),  # liveness.Holder as text: shown only while it holds that lease
    Column("updated_at", Text, nullable=False),
    Column("snapshot", Text, nullable=False, server_default=text("'{}'")),  # JSON: conversation.activity
)  # fmt: skip
