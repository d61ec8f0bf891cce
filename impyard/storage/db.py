"""The host's one database (docs/storage.md): SQLite under IMPYARD_HOME by default, or PostgreSQL when
``IMPYARD_DATABASE_URL`` names one (impyard.storage.urls); migrated at open.

Two ways in, side by side while the stores move over (issue 21):

* **The engine** (``db.engine``, ``db.write(fn)``, ``db.read(fn)``, ``db.begin()``): SQLAlchemy Core on either
  engine, for stores ported to portable SQL (the tables are in impyard.storage.tables). ``db.write(fn)`` runs
  ``fn(connection)`` in a transaction whose check-then-write is atomic: ``BEGIN IMMEDIATE`` on SQLite,
  SERIALIZABLE on PostgreSQL, where it is retried on a serialization failure or deadlock, so ``fn`` must do
  nothing but database work (it may run more than once).
* **The legacy sqlite3 connection** (``db.transaction()``, ``db.query``, ``db.execute``, ``db.connection()``):
  SQLite only, per thread, what the stores not yet ported use. On PostgreSQL it raises ``NotPortedError``.

The schema has one history for both engines: Alembic revisions in impyard/migrations. ``MIGRATIONS`` is the
frozen legacy list (append no more): a home it built (``PRAGMA user_version`` 1-10) is brought to 10 by it and
stamped at Alembic's baseline, all inside one ``BEGIN IMMEDIATE``; a fresh database is built by Alembic. Two
processes opening the same database never both migrate (SQLite: the write lock; PostgreSQL: an advisory lock).

Async code reaches the database through ``await db.run(fn, ...)``, which runs ``fn`` in one of the database's
worker threads: a transaction may wait on another writer and must never block the event loop. Bounded work — a
few indexed statements, as each phase of a turn does — goes through ``await db.quick(fn, ...)`` instead: on
SQLite it runs right on the event loop while the write lock is free, since such a transaction costs less than the
trip to a thread and back (issue 18), and on a worker like ``run`` when another writer holds the lock.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import anyio
import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from impyard.errors import ImpyardError
from impyard.paths import home
from impyard.storage import faults as storage_faults
from impyard.storage import migrations
from impyard.storage import urls as dburl
from impyard.storage.faults import CommitUncertain
from impyard.storage.urls import DB_FILENAME, DatabaseUrl, DatabaseUrlError

log = logging.getLogger("impyard.db")

BUSY_TIMEOUT_S = 15.0  # how long a writer waits for another writer's transaction
MAX_WORKERS = 16  # database worker threads at most: a new one only while every one is busy
CONNECT_TIMEOUT_S = 10  # PostgreSQL: how long opening a connection may take before it is an error
WRITE_ATTEMPTS = 8  # PostgreSQL: runs of a write function before a serialization failure is the caller's
RETRY_BASE_S = 0.005  # first backoff between runs; doubles, with full jitter, up to RETRY_MAX_S
RETRY_MAX_S = 0.25
RETRY_SQLSTATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
OUTAGE_PATIENCE_S = 30.0  # PostgreSQL: how long a transaction waits for a server that stopped answering
OUTAGE_PAUSE_MAX_S = 1.0  # between its tries, doubling from RETRY_BASE_S
MIGRATION_LOCK_KEY = 0x696D7079617264  # pg_advisory_xact_lock key of "the migrator": b"impyard"
LEGACY_VERSION = 10  # the last legacy user_version: Alembic's baseline (impyard.storage.migrations.BASELINE)
SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",  # safe with WAL; a crash loses at most the last commit
    "PRAGMA foreign_keys=ON",
)

QUICK_SLOW_S = 0.02  # quick work using more CPU than this on the event loop is logged (once per function)
CHECKPOINT_EVERY = 64  # write commits made on the event loop between two WAL checkpoints (run on a worker)

P = ParamSpec("P")
T = TypeVar("T")


class _Job:
    """One call on a worker thread, and its way back to the event loop."""

    __slots__ = ("loop", "done", "context", "fn", "result", "error", "finished", "after")

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> None:
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.context = contextvars.copy_context()
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.after: asyncio.Future[None] | None = None  # set when the caller was cancelled while it ran

    def __call__(self) -> None:  # on the worker thread
        try:
            self.result = self.context.run(self.fn)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            self.error = exc
        try:
            self.loop.call_soon_threadsafe(self._settle)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _settle(self) -> None:  # on the event loop
        self.finished = True
        for future in (self.done, self.after):
            if future is not None and not future.done():
                future.set_result(None)


class _Workers:
    """The database's worker threads, shared by every ``Database`` of the process (each keeps its own connection
    per thread). A call goes to an idle thread through a queue and its result comes back with one wakeup of the
    loop: about half what a general-purpose thread hop costs, paid about a dozen times a turn (issue 18). A
    thread is added only while every one is busy, so a long transaction never holds up the next call."""

    def __init__(self, limit: int = MAX_WORKERS) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._idle = (
            0  # workers done with a job and waiting for the next (a plain count: a Semaphore is Python)
        )
        self._lock = threading.Lock()
        self._limit = limit
        self.started = 0

    def submit(self, job: _Job) -> None:
        self._jobs.put(job)
        with self._lock:
            if self._idle:
                self._idle -= 1
                return  # an idle worker takes it
            if self.started < self._limit:
                self.started += 1
                threading.Thread(target=self._work, name=f"impyard-db-{self.started}", daemon=True).start()

    def _work(self) -> None:
        # A database's engine connection is kept on this thread between transactions (``Database._connect``).
        _WORKER.is_worker = True
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


_WORKERS = _Workers()
_WORKER = threading.local()
_INLINE = threading.local()  # ``call``: the quick call running on this thread's event loop, if any


class _Busy(BaseException):
    """Quick work on the event loop found SQLite's lock taken by another writer. Nothing of it was written (its
    one write is its last transaction): ``quick`` runs it again on a worker, which waits for the lock. A
    BaseException, like a cancellation, so that no store's ``except Exception`` keeps it from ``quick``."""


@dataclass
class _InlineCall:
    """The state of one quick call running on the event loop (``Database.quick``)."""

    db: Database
    wrote: bool = False  # its one write transaction committed: nothing may follow it
    busy: bool = False  # it met the lock: every later transaction of it is refused the same way


@dataclass
class QuickCounts:
    """How quick calls ran: on the event loop, or on a worker (PostgreSQL, or SQLite's lock taken)."""

    inline: int = 0
    on_worker: int = 0


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


# Frozen (issue 21): the history before Alembic, kept to bring an older home to version 10 (then stamped at
# Alembic's baseline). Never edit it and append nothing: a schema change is an Alembic revision now.
MIGRATIONS: list[Migration] = [
    Migration(
        1,
        "gateway: channels, ledger, budgets, gates, earned trust, audit",
        """
        -- Channel trust (docs/conversation.md); the channels issue extends this table.
        CREATE TABLE channels (
            channel_id TEXT PRIMARY KEY,
            surface    TEXT NOT NULL DEFAULT 'discord',
            kind       TEXT NOT NULL DEFAULT 'guild',      -- dm | guild | terminal | task
            name       TEXT NOT NULL DEFAULT '',
            guild_id   TEXT,                              -- the origin guild, for approver policy
            trusted    INTEGER NOT NULL DEFAULT 0,
            mode       TEXT NOT NULL DEFAULT 'all',       -- all | mention
            updated_at TEXT NOT NULL
        );

        -- Budget ledger: one row per reservation; amounts in micro-USD (integers, no float drift).
        CREATE TABLE ledger (
            id              INTEGER PRIMARY KEY,
            imp             TEXT NOT NULL,
            day             TEXT NOT NULL,                -- UTC YYYY-MM-DD of the reservation
            month           TEXT NOT NULL,                -- UTC YYYY-MM
            state           TEXT NOT NULL,                -- reserved | settled
            reserved_micros INTEGER NOT NULL,
            cost_micros     INTEGER,                      -- measured; NULL while reserved
            method          TEXT NOT NULL DEFAULT '',
            purpose         TEXT NOT NULL DEFAULT '',
            model           TEXT NOT NULL DEFAULT '',
            created_at      TEXT NOT NULL,
            settled_at      TEXT
        );
        CREATE INDEX ledger_imp_day ON ledger (imp, day);
        CREATE INDEX ledger_imp_month ON ledger (imp, month);
        CREATE INDEX ledger_day ON ledger (day);
        CREATE INDEX ledger_month ON ledger (month);
        CREATE INDEX ledger_reserved ON ledger (state, created_at);

        -- Operator overrides of the policy's budget limits ('*' = all imps together).
        CREATE TABLE budget_limits (
            scope        TEXT PRIMARY KEY,
            daily_usd    REAL,
            monthly_usd  REAL,
            updated_at   TEXT NOT NULL
        );

        -- Approval gates: a frozen payload, a deadline, exactly-once execution.
        CREATE TABLE gates (
            id              TEXT PRIMARY KEY,
            imp             TEXT NOT NULL,
            run_id          TEXT NOT NULL,
            session_channel TEXT NOT NULL,
            origin_guild    TEXT,
            act             TEXT NOT NULL,                -- discord.send
            target          TEXT NOT NULL,                -- the target channel id
            payload         TEXT NOT NULL,                -- frozen JSON of the request
            payload_sha256  TEXT NOT NULL,
            reason          TEXT NOT NULL DEFAULT '',     -- why it was gated
            state           TEXT NOT NULL,                -- pending|approved|denied|expired|executing|executed|failed
            created_at      TEXT NOT NULL,
            deadline        TEXT NOT NULL,
            decided_at      TEXT,
            decided_by      TEXT,                         -- 'operator:NAME' or 'user:ID'
            decision_note   TEXT,
            executed_at     TEXT,
            message_ids     TEXT,                         -- JSON list
            error           TEXT
        );
        CREATE INDEX gates_state ON gates (state, deadline);

        -- Earned trust: clean approvals per imp + act + target; a denial resets it.
        CREATE TABLE earned_trust (
            imp             TEXT NOT NULL,
            act             TEXT NOT NULL,
            target          TEXT NOT NULL,
            clean_approvals INTEGER NOT NULL DEFAULT 0,
            updated_at      TEXT NOT NULL,
            PRIMARY KEY (imp, act, target)
        );

        -- One row per box request and per gate transition.
        CREATE TABLE audit (
            id          INTEGER PRIMARY KEY,
            at          TEXT NOT NULL,
            imp         TEXT NOT NULL,
            run_id      TEXT NOT NULL DEFAULT '',
            channel_id  TEXT NOT NULL DEFAULT '',
            method      TEXT NOT NULL,
            purpose     TEXT NOT NULL DEFAULT '',
            verdict     TEXT NOT NULL,
            rule        TEXT NOT NULL DEFAULT '',
            reason      TEXT NOT NULL DEFAULT '',
            cost_micros INTEGER NOT NULL DEFAULT 0,
            gate_id     TEXT,
            latency_ms  REAL,
            detail      TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX audit_imp ON audit (imp, id);
        """,
    ),
    Migration(
        2,
        "conversation: channel history and wakes",
        """
        -- Every non-bot message, persisted before it is routed (docs/conversation.md); trimmed per channel.
        CREATE TABLE history (
            seq         INTEGER PRIMARY KEY AUTOINCREMENT,
            channel_id  TEXT NOT NULL,
            message_id  TEXT NOT NULL,
            author_id   TEXT NOT NULL,
            author_name TEXT NOT NULL,
            author_bot  INTEGER NOT NULL DEFAULT 0,
            from_imp    TEXT,                               -- the imp that wrote it, for its own replies
            content     TEXT NOT NULL,
            created_at  TEXT NOT NULL,
            reply_to_id TEXT,
            attachments TEXT NOT NULL DEFAULT '[]',
            UNIQUE (channel_id, message_id)
        );
        CREATE INDEX history_channel ON history (channel_id, seq);

        -- Which imp a message woke, and what became of it (NULL outcome = not finished yet).
        CREATE TABLE wakes (
            imp         TEXT NOT NULL,
            channel_id  TEXT NOT NULL,
            message_id  TEXT NOT NULL,
            woken_at    TEXT NOT NULL,
            outcome     TEXT,                               -- sent | silent | pending | failed | missed | busy
            error       TEXT,
            finished_at TEXT,
            PRIMARY KEY (imp, channel_id, message_id)
        );
        CREATE INDEX wakes_unfinished ON wakes (outcome, woken_at);
        """,
    ),
    Migration(
        3,
        "supervise: tasks, their runs, schedules",
        """
        -- One-shot work for impyard supervise (docs/tasks.md); the state is attested by the host.
        CREATE TABLE tasks (
            id               TEXT PRIMARY KEY,
            imp              TEXT NOT NULL,
            kind             TEXT NOT NULL,                -- an open set: prompt, reflect, sleep, depart, ...
            prompt           TEXT,
            person           TEXT,
            origin           TEXT NOT NULL,                -- manual | schedule | continuation | event
            channel_id       TEXT NOT NULL,                -- the target channel: the task box's own channel
            ceiling_s        REAL NOT NULL,
            wake_on_resolve  INTEGER NOT NULL DEFAULT 0,   -- a decided gate of this task queues a follow-up
            briefing         INTEGER NOT NULL DEFAULT 0,   -- give the box its imp's journal of past tasks
            state            TEXT NOT NULL,                -- queued | running | done | failed | needs_review | cancelled
            attempts         INTEGER NOT NULL DEFAULT 0,   -- box runs started
            deferrals        INTEGER NOT NULL DEFAULT 0,   -- times moved to a later budget window
            not_before       TEXT NOT NULL,                -- not dispatched before this time
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            run_id           TEXT,                         -- the current or last run (box label, audit, gates)
            outcome          TEXT,                         -- what the host saw happen
            box_outcome      TEXT,                         -- what the box claimed: done | failed | pending
            box_summary      TEXT,                         -- the box's own report, never trusted for the state
            schedule_id      TEXT,
            scheduled_for    TEXT,
            parent_task      TEXT,
            parent_gate      TEXT UNIQUE,                  -- a continuation: at most one per decided gate
            created_at       TEXT NOT NULL,
            updated_at       TEXT NOT NULL,
            started_at       TEXT,
            finished_at      TEXT,
            UNIQUE (schedule_id, scheduled_for)
        );
        CREATE INDEX tasks_ready ON tasks (state, not_before);
        CREATE INDEX tasks_imp ON tasks (imp, finished_at);

        -- One row per box run of a task: its run id labels the box, the audit rows and the gates.
        CREATE TABLE task_runs (
            run_id      TEXT PRIMARY KEY,
            task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
            attempt     INTEGER NOT NULL,
            backend     TEXT NOT NULL DEFAULT '',
            box_pid     INTEGER,                           -- process backend: the box process, for orphan reclaim
            started_at  TEXT NOT NULL,
            finished_at TEXT,
            result      TEXT,                              -- done | failed | ceiling | died | interrupted | reclaimed | ...
            returncode  INTEGER,
            detail      TEXT
        );
        CREATE INDEX task_runs_task ON task_runs (task_id, attempt);

        -- Recurring tasks: every N seconds from an anchor, or a cron expression in a timezone.
        CREATE TABLE schedules (
            id              TEXT PRIMARY KEY,
            imp             TEXT NOT NULL,
            kind            TEXT NOT NULL DEFAULT 'prompt',
            prompt          TEXT,
            channel_id      TEXT NOT NULL,
            ceiling_s       REAL NOT NULL,
            wake_on_resolve INTEGER NOT NULL DEFAULT 0,
            briefing        INTEGER NOT NULL DEFAULT 0,
            every_s         REAL,                          -- exactly one of every_s and cron is set
            cron            TEXT,
            tz              TEXT NOT NULL DEFAULT 'UTC',
            missed          TEXT NOT NULL DEFAULT 'once',  -- skip | once | all
            anchor          TEXT NOT NULL,                 -- every: fire times are anchor + k * every_s
            next_run        TEXT NOT NULL,
            paused          INTEGER NOT NULL DEFAULT 0,
            last_fired      TEXT,
            fired           INTEGER NOT NULL DEFAULT 0,
            created_at      TEXT NOT NULL,
            updated_at      TEXT NOT NULL
        );
        CREATE INDEX schedules_due ON schedules (paused, next_run);
        """,
    ),
    Migration(
        4,
        "gates: the guild of the target channel, for the approver policy",
        """
        -- Admins of the guild a message would be posted in decide it, not those of the session's guild (issue 11 #5).
        ALTER TABLE gates ADD COLUMN target_guild TEXT;   -- NULL: not known to the host (no guild admin may decide)
        UPDATE gates SET target_guild = origin_guild WHERE target = session_channel;
        -- Approvals of sends to other channels may have come from admins of the wrong guild: earned trust starts over.
        UPDATE earned_trust SET clean_approvals = 0 WHERE EXISTS (
            SELECT 1 FROM gates WHERE gates.imp = earned_trust.imp AND gates.act = earned_trust.act
              AND gates.target = earned_trust.target AND gates.target != gates.session_channel
              AND gates.decided_by LIKE 'user:%'
        );
        """,
    ),
    Migration(
        5,
        "memory: records, episodes, conversations, generations (issue 23)",
        """
        -- The imps' memories (docs/memory.md): records and episodes apart (mechanism 116), each in a privacy scope.
        -- Portable SQL (docs/architecture.md): uuid4-hex ids, ISO-8601 UTC text times, REAL/INTEGER/BLOB columns.
        CREATE TABLE memory_records (
            id             TEXT PRIMARY KEY,
            imp            TEXT NOT NULL,
            scope          TEXT NOT NULL,                -- dm:<person> | guild:<guild> | terminal | ...
            kind           TEXT NOT NULL,                -- lived | construct
            construct_kind TEXT,                         -- thought | belief | decision | goal | dream
            origin         TEXT NOT NULL,                -- lived | given (mechanism 115)
            author         TEXT NOT NULL,
            author_id      TEXT,
            feeling        TEXT NOT NULL,
            conclusion     TEXT NOT NULL,
            mention_text   TEXT NOT NULL,                -- the record text lowercased, for name matches
            valence        REAL NOT NULL,                -- never updated (mechanism 117)
            intensity      REAL NOT NULL,                -- stored; felt strength is computed at read time
            happened_at    TEXT NOT NULL,
            last_felt      TEXT NOT NULL,
            dims           INTEGER NOT NULL DEFAULT 0,   -- 0: no vector (the embedding failed)
            vector         BLOB,                         -- float16 little-endian, L2-normalised
            gen            INTEGER NOT NULL,             -- the scope's generation of its last write
            created_at     TEXT NOT NULL
        );
        CREATE INDEX memory_records_felt ON memory_records (imp, scope, last_felt, gen);
        CREATE INDEX memory_records_constructs ON memory_records (imp, scope, construct_kind, last_felt, gen);
        CREATE INDEX memory_records_gen ON memory_records (imp, scope, dims, gen);
        CREATE INDEX memory_records_author ON memory_records (imp, author_id);

        CREATE TABLE memory_episodes (
            id          TEXT PRIMARY KEY,
            record_id   TEXT NOT NULL REFERENCES memory_records (id) ON DELETE CASCADE,
            imp         TEXT NOT NULL,
            scope       TEXT NOT NULL,                   -- always its record's scope
            channel_id  TEXT NOT NULL DEFAULT '',
            message_id  TEXT,                            -- deleting that message forgets this episode
            author      TEXT NOT NULL,
            author_id   TEXT,
            as_happened TEXT NOT NULL,
            told        TEXT,
            happened_at TEXT NOT NULL,
            dims        INTEGER NOT NULL DEFAULT 0,
            vector      BLOB,
            gen         INTEGER NOT NULL
        );
        CREATE INDEX memory_episodes_record ON memory_episodes (record_id, happened_at);
        CREATE INDEX memory_episodes_gen ON memory_episodes (imp, scope, dims, gen);
        CREATE INDEX memory_episodes_message ON memory_episodes (channel_id, message_id);
        CREATE INDEX memory_episodes_author ON memory_episodes (imp, author_id);

        -- One person's conversation with an imp in one channel: focus, living record, summary (JSON).
        CREATE TABLE memory_conversations (
            imp        TEXT NOT NULL,
            scope      TEXT NOT NULL,
            channel_id TEXT NOT NULL,
            person     TEXT NOT NULL,
            state      TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (imp, channel_id, person)
        );

        -- Bumped by every write (version) and delete (deletes too): every host's vector cache follows.
        CREATE TABLE memory_generations (
            imp     TEXT NOT NULL,
            scope   TEXT NOT NULL,
            version INTEGER NOT NULL DEFAULT 0,
            deletes INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (imp, scope)
        );
        """,
    ),
    Migration(
        6,
        "memory: messages deleted on their surface, so a turn still running keeps nothing of one (issue 23)",
        """
        -- A deleted message's mark: memory.encode refuses an episode of it, whenever its turn ends.
        CREATE TABLE memory_forgotten_messages (
            channel_id   TEXT NOT NULL,
            message_id   TEXT NOT NULL,
            forgotten_at TEXT NOT NULL,                  -- marks older than a week are dropped
            PRIMARY KEY (channel_id, message_id)
        );
        CREATE INDEX memory_forgotten_messages_at ON memory_forgotten_messages (forgotten_at);
        """,
    ),
    Migration(
        7,
        "memory II: construct statements, the slot, dispositions, departures (issue 14)",
        """
        -- A construct's statement (mechanism 83: "I believe: <statement>"); NULL for a lived record.
        ALTER TABLE memory_records ADD COLUMN statement TEXT;

        -- The accessibility slot (mechanisms 84-89), per imp and scope: what the imp holds in mind there.
        CREATE TABLE memory_slots (
            imp          TEXT NOT NULL,
            scope        TEXT NOT NULL,
            record_id    TEXT NOT NULL REFERENCES memory_records (id) ON DELETE CASCADE,
            activated_at TEXT NOT NULL,
            PRIMARY KEY (imp, scope, record_id)
        );
        CREATE INDEX memory_slots_record ON memory_slots (record_id);

        -- Learned rules (mechanisms 90-98): the imp's character, shared by every scope, naming no one.
        CREATE TABLE memory_dispositions (
            id         TEXT PRIMARY KEY,
            imp        TEXT NOT NULL,
            rule       TEXT NOT NULL,
            weight     REAL NOT NULL,
            count      INTEGER NOT NULL DEFAULT 1,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX memory_dispositions_imp ON memory_dispositions (imp);

        -- A person's departure from a conversation (mechanism 103), queued exactly once per stretch of talk:
        -- the key is the stretch's last input, so a restart or a second scanner inserts nothing new.
        CREATE TABLE memory_departures (
            imp           TEXT NOT NULL,
            channel_id    TEXT NOT NULL,
            person        TEXT NOT NULL,
            last_input_at TEXT NOT NULL,
            task_id       TEXT,
            queued_at     TEXT NOT NULL,
            PRIMARY KEY (imp, channel_id, person, last_input_at)
        );
        """,
    ),
    Migration(
        8,
        "memory III: the imp's day (wakefulness), a task's scope and arguments (issue 15)",
        """
        -- A memory task's privacy scope (a sleep task works in one scope) and its kind's own arguments (JSON).
        ALTER TABLE tasks ADD COLUMN scope TEXT;
        ALTER TABLE tasks ADD COLUMN args TEXT;

        -- Mechanisms 104-107, per imp: awake or asleep, and what is due (subtle point 18). New imps start asleep.
        CREATE TABLE memory_wakefulness (
            imp               TEXT PRIMARY KEY,
            awake             INTEGER NOT NULL DEFAULT 0,
            woke_at           TEXT,                  -- when the current (or last) awake period began
            slept_at          TEXT,                  -- when it last fell asleep
            last_activity_at  TEXT,                  -- the latest activity the clock has taken in
            last_channel      TEXT,                  -- where that activity was: an idle reflection's channel
            wake_pending      INTEGER NOT NULL DEFAULT 0,
            introspected_idle INTEGER NOT NULL DEFAULT 0,
            consolidated      INTEGER NOT NULL DEFAULT 1,
            last_reflection_at    TEXT,
            last_sleep_at         TEXT,
            last_consolidation_at TEXT,
            updated_at        TEXT NOT NULL
        );
        """,
    ),
    Migration(
        9,
        "faults: the process that holds a ledger reservation (issue 19 #4)",
        """
        -- impyard.storage.liveness.Holder of a reservation: a host that finds it dead settles the row at once.
        ALTER TABLE ledger ADD COLUMN owner TEXT;
        """,
    ),
    Migration(
        10,
        "the responder's own lines, kept by the host (issue 22: no file shared between boxes)",
        """
        -- A box's own account of its channel (SPEC-001 ENV-05/07/11/13), per imp and channel; trimmed per imp.
        CREATE TABLE responder_lines (
            seq         INTEGER PRIMARY KEY AUTOINCREMENT,  -- the order lines were kept in (ENV-11's "oldest")
            imp         TEXT NOT NULL,
            channel_id  TEXT NOT NULL,
            message_id  TEXT NOT NULL,
            role        TEXT NOT NULL,                      -- user | assistant | event
            author      TEXT NOT NULL,
            content     TEXT NOT NULL,
            at          TEXT NOT NULL,
            UNIQUE (imp, channel_id, message_id, role)
        );
        CREATE INDEX responder_lines_channel ON responder_lines (imp, channel_id, seq);

        -- Turns counted per channel and outcome (sent | silent | pending | failed | archived).
        CREATE TABLE responder_counters (
            imp         TEXT NOT NULL,
            channel_id  TEXT NOT NULL,
            outcome     TEXT NOT NULL,
            count       INTEGER NOT NULL,
            PRIMARY KEY (imp, channel_id, outcome)
        );

        -- The imp-wide history.json of an older home, imported once (impyard.conversation.responder_history.import_legacy).
        CREATE TABLE responder_imports (
            imp         TEXT NOT NULL,
            source      TEXT NOT NULL,
            lines       INTEGER NOT NULL,
            skipped     INTEGER NOT NULL,
            imported_at TEXT NOT NULL,
            PRIMARY KEY (imp, source)
        );
        """,
    ),
]


LEGACY_MIGRATIONS = MIGRATIONS


class DatabaseError(ImpyardError):
    """The database cannot be opened or migrated; the message says what to do."""


# What a failure of the host's own database can raise, from either engine or the disk under it (issue 19 #1,
# issue 21); impyard.storage.faults says which kind it was.
STORAGE_ERRORS = (sqlite3.Error, DBAPIError, sa.exc.TimeoutError, DatabaseError, OSError, CommitUncertain)


class NotPortedError(DatabaseError):
    """Code that speaks SQLite's own dialect (the legacy connection) was asked to run on PostgreSQL."""


def default_path() -> Path:
    return home() / DB_FILENAME


def split_statements(sql: str) -> list[str]:
    """Split a script into statements with SQLite's own completeness test (triggers included)."""
    statements: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip().strip(";").strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements


def _caller() -> str:
    """The function outside this module that reached for the legacy connection: named in NotPortedError."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "this command"
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"


def is_retryable(exc: BaseException) -> bool:
    """A PostgreSQL serialization failure or deadlock: the transaction did nothing and may simply run again."""
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) in RETRY_SQLSTATES


_SERIALIZABLE, _LOCKING, _READ = (
    psycopg.IsolationLevel.SERIALIZABLE,
    psycopg.IsolationLevel.READ_COMMITTED,
    psycopg.IsolationLevel.REPEATABLE_READ,
)


def _sqlite_engine(path: Path) -> Engine:
    """SQLAlchemy on the SQLite file, with the pysqlite recipe for real transactions: the driver's own BEGIN is
    off (isolation_level=None) and each transaction starts with our BEGIN (``_sqlite_begin``)."""
    engine = sa.create_engine(
        sa.URL.create("sqlite+pysqlite", database=str(path)),
        connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
        poolclass=sa.QueuePool,
        pool_size=4,
        max_overflow=MAX_WORKERS + 4,
    )

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        for pragma in SQLITE_PRAGMAS:
            dbapi_connection.execute(pragma)

    return engine


def _sqlite_begin(conn: Connection, read_only: bool) -> None:
    """Start ``conn``'s transaction on SQLite: ``BEGIN IMMEDIATE`` for a write (the write lock up front, so
    check-then-write is atomic), ``BEGIN DEFERRED`` with ``query_only`` for a read, which refuses to write as
    PostgreSQL's READ ONLY does (a store tested here behaves the same there).

    Straight on the driver's connection, and not in a ``begin`` event: an engine with a connection event
    dispatches events on every statement, which cost more than the statements (issue 18). SQLAlchemy's own
    begin is a no-op on pysqlite, and its commit or rollback ends this transaction. The pragma is set only when
    the mode changes on that connection."""
    fairy = conn.connection
    driver: Any = fairy.driver_connection
    if fairy.info.get("impyard_query_only") is not read_only:
        driver.execute(f"PRAGMA query_only = {1 if read_only else 0}")
        fairy.info["impyard_query_only"] = read_only
    driver.execute("BEGIN DEFERRED" if read_only else "BEGIN IMMEDIATE")


def _postgresql_begin(conn: Connection, read_only: bool, locking: bool) -> None:
    """Set ``conn``'s next transaction on PostgreSQL: SERIALIZABLE for a write (READ COMMITTED for one that locks
    what it checks), REPEATABLE READ, READ ONLY for a read. Set on the driver's connection, which puts them in the
    BEGIN it sends with the first statement: no round trip of their own, where SQLAlchemy's execution options
    cost one to set them and one to reset them (issue 18). Only what changed is set."""
    driver: Any = conn.connection.driver_connection
    level = _READ if read_only else _LOCKING if locking else _SERIALIZABLE
    if driver.isolation_level != level:
        driver.isolation_level = level
    if driver.read_only is not read_only:
        driver.read_only = read_only


def _postgresql_engine(target: DatabaseUrl) -> Engine:
    return sa.create_engine(
        target.url,
        pool_pre_ping=True,  # a server restart costs one failed ping, not a failed turn
        pool_size=4,
        max_overflow=MAX_WORKERS + 4,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "application_name": "impyard"},
    )


class Database:
    """The host database: a SQLAlchemy engine for ported stores, and (SQLite only) one legacy sqlite3 connection
    per thread with explicit transactions for the rest."""

    def __init__(
        self,
        path: Path | None = None,
        migrations: Sequence[Migration] = MIGRATIONS,
        *,
        url: DatabaseUrl | None = None,
        patience_s: float = OUTAGE_PATIENCE_S,
    ) -> None:
        if url is None:
            if path is None:
                raise TypeError("Database needs a path or a url")
            url = dburl.sqlite_url(Path(path))
        self.url = url
        self.dialect: dburl.Dialect = url.dialect
        self.patience_s = patience_s  # how long a transaction waits for a PostgreSQL server that went away
        self._path = url.path
        self._migrations = tuple(migrations)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._kept: list[Connection] = []  # the workers' engine connections (``_connect``)
        self._all_lock = threading.Lock()
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()
        self.quick_counts = QuickCounts()
        self._inline_writes = 0  # write commits on the event loop since the last checkpoint
        self._checkpointing = False
        self._closed = False  # a checkpoint still queued when the database closed does nothing
        self._quick_named: set[str] = set()  # quick functions called at least once
        self._slow_named: set[str] = set()  # quick functions already logged as slow

    @property
    def path(self) -> Path:
        """The SQLite file (a PostgreSQL database has none)."""
        if self._path is None:
            raise NotPortedError(f"{_caller()} needs a SQLite file, and the database is {self.url.where()}")
        return self._path

    # ------------------------------------------------------------ the engine (both dialects)

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (created on first use; its pool is shared by every thread)."""
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    self._engine = (
                        _sqlite_engine(self.path)
                        if self.dialect == "sqlite"
                        else _postgresql_engine(self.url)
                    )
                    self._closed = False  # in use (again)
        return self._engine

    @contextmanager
    def _connect(self, *, reading: bool = False) -> Iterator[Connection]:
        """An engine connection for one transaction. A database worker thread keeps its own between transactions:
        a pool checkout and check-in cost three times what a short SQLite transaction does, and on PostgreSQL they
        are round trips (the pool's ping before it lends a connection, its rollback when it is given back; issue
        18). A kept connection that the server dropped fails its next statement and is replaced: the transaction
        never reached its commit, so ``write`` runs it again (``_transact``). Any other thread, and a nested use,
        take one from the pool (which pings it first) and give it back. Quick work on the event loop has two
        connections of its own, one for reads (``reading``) and one for writes (``_inline_connection``)."""
        call: _InlineCall | None = getattr(_INLINE, "call", None)
        if call is not None and call.db is self:
            if getattr(self._local, "engine_busy", False):
                raise RuntimeError("quick database work opens one transaction at a time (no nested one)")
            self._local.engine_busy = True
            try:
                yield self._inline_connection(reading)
            finally:
                self._local.engine_busy = False
            return
        kept: Connection | None = None
        if getattr(_WORKER, "is_worker", False):
            kept = getattr(self._local, "engine_conn", None)
            if kept is None or kept.invalidated or kept.closed:
                dropped, kept = kept, self.engine.connect()
                self._local.engine_conn = kept
                with self._all_lock:
                    self._kept = [c for c in self._kept if c is not dropped] + [kept]
                if dropped is not None:
                    dropped.close()  # given back to the pool, which discards an invalidated one
            if getattr(self._local, "engine_busy", False):
                kept = None  # nested: this thread's connection is in a transaction already
        if kept is None:
            with self.engine.connect() as conn:
                yield conn
            return
        self._local.engine_busy = True
        try:
            yield kept
        finally:
            self._local.engine_busy = False

    def _inline_connection(self, reading: bool) -> Connection:
        """The event loop thread's own connection for quick reads, or for quick writes: it never waits for
        SQLite's lock (``busy_timeout`` 0: another writer sends the work to a worker instead) and never checkpoints
        the WAL on the loop (``_wrote_inline`` has a worker do it). Two, so that neither ever switches
        ``query_only`` (a statement of its own each time, issue 18). Kept for the thread and never given back to
        the pool (``close`` discards them), so that no setting of theirs reaches a connection another thread
        borrows."""
        name = "inline_reader" if reading else "inline_writer"
        conn: Connection | None = getattr(self._local, name, None)
        if conn is not None and not conn.invalidated and not conn.closed:
            return conn
        dropped, conn = conn, self.engine.connect()
        driver: Any = conn.connection.driver_connection
        driver.execute("PRAGMA busy_timeout = 0")
        driver.execute("PRAGMA wal_autocheckpoint = 0")
        setattr(self._local, name, conn)
        with self._all_lock:
            self._kept = [c for c in self._kept if c is not dropped] + [conn]
        if dropped is not None:
            dropped.invalidate()  # its settings never go back to the pool
            dropped.close()
        return conn

    @contextmanager
    def begin(self, *, read_only: bool = False, locking: bool = False) -> Iterator[Connection]:
        """One transaction on the engine, committed when the block ends (rolled back when it raises); no retry.

        A write (the default) is atomic check-then-write: SQLite ``BEGIN IMMEDIATE``; PostgreSQL SERIALIZABLE,
        where COMMIT may still fail with a serialization error: use ``write(fn)``, which runs it again (or, with
        ``locking``, READ COMMITTED for a caller that locks what it checks). A read is one consistent snapshot that
        refuses to write: SQLite ``BEGIN DEFERRED`` with ``query_only``; PostgreSQL REPEATABLE READ, READ ONLY."""
        call: _InlineCall | None = getattr(_INLINE, "call", None)
        if call is not None and call.db is self:
            with self._inline_begin(call, read_only) as conn:
                yield conn
            return
        with self._connect() as conn:
            if self.dialect == "postgresql":
                _postgresql_begin(conn, read_only, locking)
            else:
                _sqlite_begin(conn, read_only)
            with conn.begin():
                yield conn

    @contextmanager
    def _inline_begin(self, call: _InlineCall, read_only: bool) -> Iterator[Connection]:
        """``begin`` for quick work on the event loop (SQLite). Its rule: reads, then at most one write, which is
        its last transaction, so that work which meets the lock has written nothing and runs again whole on a
        worker. Breaking the rule is a bug in the caller, refused here every time (not only under contention)."""
        if call.busy:
            raise _Busy
        if call.wrote:
            raise RuntimeError(
                "quick database work runs reads, then at most one write, as its last transaction; "
                "use db.run for more"
            )
        try:
            with self._connect(reading=read_only) as conn:
                _sqlite_begin(conn, read_only)
                with conn.begin():
                    yield conn
        except (sqlite3.OperationalError, DBAPIError) as exc:
            if storage_faults.classify(exc).kind != "busy":
                raise
            call.busy = True
            raise _Busy from exc
        if not read_only:
            call.wrote = True
            self._wrote_inline()

    def _wrote_inline(self) -> None:
        """Count a write committed on the event loop; every ``CHECKPOINT_EVERY`` a worker checkpoints the WAL."""
        self._inline_writes += 1
        if self._inline_writes < CHECKPOINT_EVERY or self._checkpointing:
            return
        self._inline_writes, self._checkpointing = 0, True
        _WORKERS.submit(_Job(asyncio.get_running_loop(), self._checkpoint))

    def _checkpoint(self) -> None:
        """On a worker: copy the WAL's pages into the database file and start the WAL over, so that it is reused
        from its start instead of growing. RESTART, since a PASSIVE checkpoint under steady writes never catches
        up with them (each write lands while it copies); waiting for nobody (``busy_timeout`` 0 for it): with a
        writer or a reader in the way it copies what it can and the next one tries again. While it copies, it
        holds the write lock, and quick writes meet it and run on a worker. A failure is logged."""
        if self._closed:
            self._checkpointing = False
            return
        try:
            with self._connect() as conn:
                driver: Any = conn.connection.driver_connection
                driver.execute("PRAGMA busy_timeout = 0")
                try:
                    driver.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                finally:
                    driver.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        except (SQLAlchemyError, sqlite3.Error, OSError) as exc:
            log.warning("could not checkpoint %s: %s", self.url.where(), storage_faults.describe(exc))
        finally:
            self._checkpointing = False

    def write(
        self, fn: Callable[[Connection], T], *, attempts: int = WRITE_ATTEMPTS, locking: bool = False
    ) -> T:
        """``fn(conn)`` in a write transaction (``begin()``), committed; its result.

        On PostgreSQL a serialization failure or deadlock rolls it back and runs ``fn`` again on a fresh
        transaction (up to ``attempts`` runs, with a short random backoff): so ``fn`` must do nothing but database
        work through ``conn`` — no sending, no clock-dependent side effect, no state kept across runs. On SQLite
        the write lock is taken up front and ``fn`` runs once.

        ``locking``: ``fn`` locks what it checks itself (``SELECT … FOR UPDATE`` of a few hot rows, in one
        order), so PostgreSQL runs it at READ COMMITTED: writers of the same rows queue on their locks instead of
        failing to serialize and running again (the budget's totals, which every reservation of every host moves).

        A server that stops answering (issue 21) is waited for, up to ``patience_s``, and ``fn`` runs again once
        it answers — but only where the transaction never reached its commit. A connection lost during the
        commit raises ``CommitUncertain``: it may have been kept, so it is never done twice."""
        return self._transact(fn, read_only=False, attempts=attempts, locking=locking)

    def read(self, fn: Callable[[Connection], T]) -> T:
        """``fn(conn)`` in a read-only snapshot (``begin(read_only=True)``); its result. A server that stops
        answering is waited for as ``write`` waits."""
        return self._transact(fn, read_only=True, attempts=1, locking=False)

    def _transact(self, fn: Callable[[Connection], T], *, read_only: bool, attempts: int, locking: bool) -> T:
        collisions = 0
        give_up_at: float | None = None
        pause = RETRY_BASE_S
        while True:
            committing = False
            try:
                with self.begin(read_only=read_only, locking=locking) as conn:
                    result = fn(conn)
                    committing = True  # the block's end commits: a lost connection now leaves it uncertain
                return result
            except DBAPIError as exc:
                if committing and not read_only and storage_faults.waits_for(exc):
                    raise CommitUncertain(
                        storage_faults.describe(CommitUncertain(), self.url.where())
                    ) from exc
                if is_retryable(exc) and not read_only:
                    collisions += 1
                    if collisions >= attempts:
                        raise
                    time.sleep(random.uniform(0, min(RETRY_MAX_S, RETRY_BASE_S * 2**collisions)))
                    continue
                if self.dialect != "postgresql" or not storage_faults.waits_for(exc):
                    raise
                now = time.monotonic()
                give_up_at = give_up_at if give_up_at is not None else now + self.patience_s
                if now >= give_up_at:
                    raise
                if pause == RETRY_BASE_S:
                    log.warning(
                        "%s is not answering; waiting up to %.0f s", self.url.where(), self.patience_s
                    )
                time.sleep(min(pause, max(0.0, give_up_at - now)))
                pause = min(OUTAGE_PAUSE_MAX_S, pause * 2)

    # ------------------------------------------------------------ the legacy sqlite3 connection (SQLite only)

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (created on first use)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self.dialect != "sqlite":
                raise NotPortedError(
                    f"{_caller()} does not run on PostgreSQL yet (issue 21: its store still speaks SQLite's own "
                    f"SQL); unset {dburl.ENV} to use the SQLite file under IMPYARD_HOME"
                )
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            for pragma in SQLITE_PRAGMAS:
                conn.execute(pragma)
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def transaction(self, *, immediate: bool = True) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` (a write lock up front, so check-then-write is atomic) ... COMMIT or ROLLBACK."""
        conn = self.connection()
        if conn.in_transaction:
            raise RuntimeError("nested transaction on one connection")
        conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        return self.connection().execute(sql, params).fetchall()

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        """One statement in autocommit mode."""
        return self.connection().execute(sql, params)

    # ------------------------------------------------------------ both

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run blocking database work in a worker thread (that thread's own connection).

        A caller cancelled meanwhile still waits for the work to end (its transaction is committed or rolled
        back, never left running behind it), then is cancelled."""
        job = _Job(asyncio.get_running_loop(), (lambda: fn(*args, **kwargs)) if args or kwargs else fn)
        _WORKERS.submit(job)
        try:
            await job.done
        except BaseException:
            if not job.finished:
                job.after = job.loop.create_future()
                with anyio.CancelScope(shield=True):
                    await job.after
            raise
        if job.error is not None:
            raise job.error
        return job.result

    async def quick(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Bounded database work (a few indexed statements; reads, then at most one write as its last
        transaction): ``fn(*args, **kwargs)``, its result.

        On SQLite it runs right here on the event loop, on connections of its own that never wait for the
        write lock: a short transaction costs less than the trip to a worker thread and back, where each of its
        statements also fights the event loop for the GIL (issue 18). When another writer holds the lock, the
        work has written nothing, and it runs again whole on a worker (``run``), which waits for the lock. On
        PostgreSQL every statement is a round trip: it is ``run``."""
        if self.dialect == "sqlite" and getattr(_INLINE, "call", None) is None:
            call = _InlineCall(self)
            _INLINE.call = call
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                result = fn(*args, **kwargs)
            except _Busy:
                pass
            finally:
                _INLINE.call = None
            if not call.busy:  # (a function that swallowed the lock's refusal still goes to a worker)
                self.quick_counts.inline += 1
                self._note_slow(fn, time.thread_time() - cpu, time.perf_counter() - started)
                return result
        self.quick_counts.on_worker += 1
        return await self.run(fn, *args, **kwargs)

    def _note_slow(self, fn: Callable[..., Any], cpu_s: float, wall_s: float) -> None:
        """Log quick work too heavy for the loop, once per function, and never its first call (which may compile
        its statements). Heavy by its own CPU time: a busy machine that leaves the host waiting for a core makes
        any call slow on the clock, on a worker as much as on the loop."""
        inner = getattr(fn, "func", fn)  # a functools.partial: its function
        name = getattr(inner, "__qualname__", None) or type(inner).__name__
        if name not in self._quick_named:
            self._quick_named.add(name)
            return
        if cpu_s > QUICK_SLOW_S and name not in self._slow_named:
            self._slow_named.add(name)
            log.warning(
                "quick database work %s spent %.1f ms of CPU on the event loop (more than %.0f; %.1f ms in all): "
                "it should use db.run",
                name, cpu_s * 1000, QUICK_SLOW_S * 1000, wall_s * 1000,
            )  # fmt: skip

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            conns, self._all = self._all, []
            kept, self._kept = self._kept, []
        for engine_conn in kept:
            try:
                engine_conn.invalidate()  # closed, not pooled: the event loop's has settings of its own
                engine_conn.close()
            except SQLAlchemyError:
                pass
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()
        with self._engine_lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.dispose()

    # ------------------------------------------------------------ schema

    @property
    def version(self) -> int:
        """The schema version as a number: SQLite's ``user_version`` (10 at Alembic's baseline, one more for each
        revision past it, so an impyard from before Alembic refuses a newer file); the same count on PostgreSQL."""
        if self.dialect == "sqlite":
            return int(self.connection().execute("PRAGMA user_version").fetchone()[0])
        revision = self.revision
        known = migrations.position(revision) if revision else None
        return 0 if known is None else LEGACY_VERSION + known

    @property
    def revision(self) -> str | None:
        """The Alembic revision the database is at (None: not under Alembic yet)."""
        from alembic.runtime.migration import MigrationContext

        with self.begin(read_only=True) as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def migrate(self) -> int:
        """Bring the schema to the newest revision (see the module's docstring); returns ``version``."""
        expected = list(range(1, len(self._migrations) + 1))
        if [m.version for m in self._migrations] != expected:
            raise DatabaseError("migrations must be numbered 1, 2, 3, ... in order")
        if self.dialect == "sqlite":
            with self.begin() as conn:  # BEGIN IMMEDIATE, the write lock: one migrator at a time
                self._migrate_sqlite(conn)
        else:
            with self.engine.connect() as conn, conn.begin():
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
                self._migrate_postgresql(conn)
        return self.version

    def _migrate_sqlite(self, conn: Connection) -> None:
        version = int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())
        tables = set(sa.inspect(conn).get_table_names()) - {"sqlite_sequence"}
        managed = "alembic_version" in tables
        # A fresh file: Alembic builds it (unless the list given stops short of the baseline: a test's older impyard).
        if not tables and version == 0 and len(self._migrations) >= LEGACY_VERSION:
            _build_fresh_sqlite(conn)
            self._mirror_version(conn)
            version, managed = self._mirrored(), True
        if not managed and version > len(self._migrations):
            raise DatabaseError(
                f"{self._path} has schema version {version}, newer than this impyard knows "
                f"({len(self._migrations)}); upgrade impyard"
            )
        for migration in self._migrations[version:]:  # a legacy home, brought to 10 by the frozen list
            for statement in split_statements(migration.sql):
                conn.exec_driver_sql(statement)
            conn.exec_driver_sql(f"PRAGMA user_version = {int(migration.version)}")
            version = migration.version
        if not managed and version >= LEGACY_VERSION:
            migrations.stamp(conn, migrations.BASELINE)
            managed = True
        if managed and self._upgrade(conn):
            self._mirror_version(conn)

    def _migrate_postgresql(self, conn: Connection) -> None:
        tables = set(sa.inspect(conn).get_table_names())
        if not tables:
            migrations.upgrade(conn)
        elif "alembic_version" not in tables:
            raise DatabaseError(
                f"{self.url.where()} has tables but no impyard migration history: give impyard a database of "
                "its own (createdb impyard)"
            )
        else:
            self._upgrade(conn)

    def _upgrade(self, conn: Connection) -> bool:
        """Alembic from the database's revision to the head; True when it moved. Refuses a newer database."""
        from alembic.runtime.migration import MigrationContext

        current = MigrationContext.configure(conn).get_current_revision()
        head = migrations.head()
        if current == head:
            return False
        if current is not None and migrations.position(current) is None:
            raise DatabaseError(
                f"{self.url.where()} has schema revision {current}, newer than this impyard knows ({head}); "
                "upgrade impyard"
            )
        migrations.upgrade(conn)
        return True

    def _mirror_version(self, conn: Connection) -> None:
        """SQLite: user_version follows Alembic, so an impyard from before Alembic refuses a newer file."""
        conn.exec_driver_sql(f"PRAGMA user_version = {self._mirrored()}")

    @staticmethod
    def _mirrored() -> int:
        return LEGACY_VERSION + (migrations.position(migrations.head()) or 0)


# The statements Alembic ran to build a fresh SQLite file, by (history, head): the next fresh file of this process
# gets them again, as SQL. Building the revisions' SQLAlchemy objects is most of what a new file costs, and
# the tests make thousands.
_FRESH_SQLITE: dict[tuple[str, str], list[tuple[str, Any]]] = {}


def _build_fresh_sqlite(conn: Connection) -> None:
    key = (str(migrations.HERE), migrations.head())
    recorded = _FRESH_SQLITE.get(key)
    if recorded is not None:
        for statement, parameters in recorded:
            conn.exec_driver_sql(statement, parameters)
        return
    statements: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        statements.append((statement, parameters))

    sa.event.listen(conn, "before_cursor_execute", record)
    try:
        migrations.upgrade(conn)
    finally:
        sa.event.remove(conn, "before_cursor_execute", record)
    _FRESH_SQLITE[key] = statements


def open_database(path: Path | None = None, *, url: DatabaseUrl | str | None = None) -> Database:
    """Open (creating and migrating as needed) the host database: ``path`` (a SQLite file), else ``url``, else
    ``IMPYARD_DATABASE_URL``, else IMPYARD_HOME/impyard.db. Every store speaks the engine API, so either engine
    serves every command (issue 21)."""
    try:
        if path is not None:
            target = dburl.sqlite_url(Path(path))
        elif isinstance(url, str):
            target = dburl.parse(url)
        else:
            target = url if url is not None else dburl.from_env()
    except DatabaseUrlError as exc:
        raise DatabaseError(str(exc)) from None
    db = Database(url=target)
    try:
        if target.path is not None:
            target.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            _reach(db)
        db.migrate()
    except DatabaseError:
        db.close()
        raise
    except (OSError, sqlite3.Error, SQLAlchemyError) as exc:
        db.close()
        raise DatabaseError(f"cannot open {target.where()}: {_reason(target, exc)}") from None
    return db


def _reach(db: Database) -> None:
    """Open one connection to the server: a wrong password, host or database name is its own one-line error."""
    try:
        with db.engine.connect():
            pass
    except DBAPIError as exc:
        raise DatabaseError(dburl.connect_problem(db.url, exc)) from None


def _reason(target: DatabaseUrl, exc: BaseException) -> str:
    return dburl.scrub(str(getattr(exc, "orig", None) or exc), target.password)


class AsyncView:
    """A store's methods, awaited: each call runs on a database worker thread (``Database.run``)."""

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._store, name)
        if not callable(method) or name.startswith("_"):
            raise AttributeError(f"{type(self._store).__name__}.{name} is not a store method")

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._store.db.run(method, *args, **kwargs)

        call.__name__ = name
        return call


class Store:
    """The base of the host's stores (issue 12): blocking methods for the CLI, and ``aio`` for the event loop.

    ``await store.aio.get(gate_id)`` runs ``store.get(gate_id)`` on a worker thread: the store owns the
    hop, so an adapter never reaches for the database, and nothing blocking runs on the event loop.
    """

    db: Database

    @property
    def aio(self) -> AsyncView:
        return AsyncView(self)
