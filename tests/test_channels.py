"""The conversation's small stores on both engines (docs/storage.md): the channel store (first sight, mode, trust),
earned trust's counts, and the audit log (redacted rows, the tail). Through the stores' public methods only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from sqlalchemy.engine import Connection

from impyard.channels.store import ChannelError, ChannelInfo, ChannelModeError, ChannelStore
from impyard.clock import FixedClock
from impyard.gateway.audit import MAX_FIELD_CHARS, REDACTED, AuditLog, AuditRecord
from impyard.gateway.trust import EarnedTrust
from impyard.storage.db import Database

SECRET = "sk-test-0123456789abcdef"


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


# ------------------------------------------------------------------ channels


def test_a_channel_first_seen_is_untrusted_and_wakes_on_every_message(
    any_engine_db: Database, clock: FixedClock
) -> None:
    channels = ChannelStore(any_engine_db, clock)
    assert channels.info("c1") is None and channels.mode("c1") == "all" and not channels.is_trusted("c1")
    info = channels.seen("c1", surface="discord", kind="guild", name="general", guild_id="g1")
    assert info == ChannelInfo("c1", "discord", "guild", "general", "g1", False, "all")
    assert channels.info("c1") == info and channels.kind("c1") == "guild"


def test_seeing_a_channel_again_keeps_its_trust_mode_name_and_guild(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """What the operator set stays; a name or guild the surface does not say (empty, None) is not wiped."""
    channels = ChannelStore(any_engine_db, clock)
    channels.set_trusted("c1", True)  # set before impyard ever saw the channel
    channels.set_mode("c1", "mention")
    channels.seen("c1", surface="discord", kind="guild", name="general", guild_id="g1")
    again = channels.seen("c1", surface="discord", kind="thread", name="", guild_id=None)
    assert again == ChannelInfo("c1", "discord", "thread", "general", "g1", True, "mention")
    renamed = channels.seen("c1", surface="discord", kind="thread", name="lobby")
    assert (renamed.name, renamed.guild_id, renamed.trusted, renamed.mode) == ("lobby", "g1", True, "mention")


def test_dms_and_the_terminal_are_always_trusted(any_engine_db: Database, clock: FixedClock) -> None:
    channels = ChannelStore(any_engine_db, clock)
    channels.seen("d1", surface="discord", kind="dm")
    channels.seen("terminal:ann", surface="terminal", kind="terminal")
    channels.seen("g1", surface="discord", kind="guild")
    assert [channels.is_trusted(c) for c in ("d1", "terminal:ann", "g1")] == [True, True, False]
    assert channels.set_trusted("g1", True).trusted and channels.is_trusted("g1")
    assert not channels.set_trusted("g1", False).trusted


@pytest.mark.parametrize(("channel_id", "mode", "error"), [
    ("c1", "sometimes", ChannelModeError), ("", "all", ChannelError), (" ", "all", ChannelError),
    ("x" * 129, "all", ChannelError),
])  # fmt: skip
def test_a_bad_setting_is_refused_and_nothing_is_written(
    any_engine_db: Database, clock: FixedClock, channel_id: str, mode: str, error: type[Exception]
) -> None:
    channels = ChannelStore(any_engine_db, clock)
    with pytest.raises(error):
        channels.set_mode(channel_id, mode)
    assert channels.all() == []


def test_the_listing_is_by_surface_then_id_in_code_point_order(
    any_engine_db: Database, clock: FixedClock
) -> None:
    channels = ChannelStore(any_engine_db, clock)
    for channel_id, surface in (("b", "discord"), ("B", "discord"), ("a-2", "discord"), ("a1", "discord"),
                                ("terminal:ann", "terminal")):  # fmt: skip
        channels.upsert(ChannelInfo(channel_id, surface=surface))
    assert [c.channel_id for c in channels.all()] == ["B", "a-2", "a1", "b", "terminal:ann"]
    channels.upsert(ChannelInfo("b", surface="discord", kind="dm", name="ann", trusted=True))
    assert channels.info("b") == ChannelInfo("b", "discord", "dm", "ann", None, True, "all")


def test_a_composed_job_sees_a_channel_inside_its_own_write(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """Given ``conn``, ``seen`` joins the caller's transaction (issue 18: one trip, one transaction): rolled back
    with it."""
    channels = ChannelStore(any_engine_db, clock)

    def seen_then_fail(conn: Connection) -> None:
        seen = channels.seen("c1", surface="discord", kind="guild", name="x", conn=conn)
        assert channels.info("c1", conn=conn) == seen and channels.is_trusted("c1", conn=conn) is False
        raise RuntimeError("the message could not be kept")

    with pytest.raises(RuntimeError):
        any_engine_db.write(seen_then_fail)
    assert channels.info("c1") is None


# ------------------------------------------------------------------ earned trust


def test_clean_approvals_count_up_per_target_and_a_denial_resets_them(
    any_engine_db: Database, clock: FixedClock
) -> None:
    earned = EarnedTrust(any_engine_db, clock)
    assert earned.count("pip", "discord.send", "c1") == 0
    for _ in range(3):
        any_engine_db.write(lambda conn: earned.record_approval(conn, "pip", "discord.send", "c1"))
    any_engine_db.write(lambda conn: earned.record_approval(conn, "pip", "discord.send", "c2"))
    assert earned.count("pip", "discord.send", "c1") == 3 and earned.count("pip", "discord.send", "c2") == 1
    any_engine_db.write(lambda conn: earned.record_denial(conn, "pip", "discord.send", "c1"))
    assert earned.count("pip", "discord.send", "c1") == 0 and earned.count("pip", "discord.send", "c2") == 1
    assert earned.count("pix", "discord.send", "c2") == 0  # per imp
    any_engine_db.write(lambda conn: earned.record_denial(conn, "pix", "discord.send", "c9"))
    assert earned.count("pix", "discord.send", "c9") == 0
    assert any_engine_db.read(lambda conn: earned.count("pip", "discord.send", "c2", conn=conn)) == 1


# ------------------------------------------------------------------ audit


def test_audit_rows_are_redacted_bounded_and_tailed_oldest_first(
    any_engine_db: Database, clock: FixedClock
) -> None:
    audit = AuditLog(any_engine_db, clock, secrets=[SECRET])
    for n in range(5):
        audit.write(AuditRecord(imp="pip" if n % 2 else "pix", method="model.request", verdict="allowed",
                                reason=f"call {n} with {SECRET}", detail="x" * (MAX_FIELD_CHARS + 10),
                                cost_micros=10**12 + n, latency_ms=1.5))  # fmt: skip
    tail = audit.tail(3)
    assert [r.reason for r in tail] == [f"call {n} with {REDACTED}" for n in (2, 3, 4)]
    assert tail[0].id is not None and [r.id for r in tail] == sorted(r.id for r in tail if r.id is not None)
    assert (
        len(tail[0].detail) == MAX_FIELD_CHARS and tail[-1].cost_micros == 10**12 + 4
    )  # BIGINT on PostgreSQL
    assert tail[-1].at == clock.now() and tail[-1].latency_ms == 1.5
    assert [r.reason[:6] for r in audit.tail(10, imp="pip")] == ["call 1", "call 3"]
    assert audit.tail(0) == []


def test_an_audit_row_joins_the_callers_transaction(any_engine_db: Database, clock: FixedClock) -> None:
    audit = AuditLog(any_engine_db, clock, secrets=[])

    def write_then_fail(conn: Connection) -> None:
        audit.write(AuditRecord(imp="pip", method="gate", verdict="approved"), conn)
        raise RuntimeError("the gate's own write failed")

    with pytest.raises(RuntimeError):
        any_engine_db.write(write_then_fail)
    assert audit.tail() == []
    any_engine_db.write(
        lambda conn: audit.write(AuditRecord(imp="pip", method="gate", verdict="approved"), conn)
    )
    assert [r.verdict for r in audit.tail()] == ["approved"]


def test_an_audit_row_names_the_host_process_that_wrote_it(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """Issue 21: hosts sharing one database — each audit row says which process (host name and pid) wrote it;
    a row from another process names that one."""
    log = AuditLog(any_engine_db, clock, secrets=[])
    log.write(AuditRecord(imp="pip", method="model.request", verdict="allowed"))
    script = (
        "import sys; from impyard.gateway.audit import AuditLog, AuditRecord; from impyard.clock import FixedClock; "
        "from impyard.storage.db import open_database; db = open_database(url=sys.argv[1]); "
        "AuditLog(db, FixedClock(), secrets=[]).write(AuditRecord(imp='pip', method='discord.send', verdict='allowed'));"
        " print(__import__('os').getpid())"
    )
    url = any_engine_db.url.url.render_as_string(hide_password=False)
    other = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, check=True)
    mine, theirs = log.tail(2)
    assert mine.host == f"{socket.gethostname()}/{os.getpid()}"
    assert theirs.host == f"{socket.gethostname()}/{other.stdout.strip()}" != mine.host
    assert theirs.to_json()["host"] == theirs.host  # audit tail --json shows it
