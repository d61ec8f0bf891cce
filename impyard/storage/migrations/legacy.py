"""The frozen legacy migrations (issue 21): the schema's history before Alembic, ten SQLite scripts numbered by
``PRAGMA user_version``. Kept to bring a home they built (user_version 1-9) to version 10, which is exactly
Alembic's baseline revision ``0001`` (tests/test_store_schema.py compares the two); the home is then stamped at
the baseline and only Alembic revisions run (``impyard.storage.migrate``).

Never edit them and append nothing: a schema change is an Alembic revision now (docs/storage.md).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

LEGACY_VERSION = 10  # the last legacy user_version: Alembic's baseline (impyard.storage.migrations.BASELINE)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


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
