"""What the stores write per message (issue 18): a channel seen as it was is read, not written; one that
changed is written, keeping its trust and mode; the recent window reads back exactly what was recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from box.protocol.models import Author, Message
from impyard.channels.store import ChannelStore
from impyard.clock import FixedClock
from impyard.conversation.history import History
from impyard.storage.db import Database


def writes(db: Database) -> int:
    """How many write transactions ``db`` has run since the first call: each ``db.write`` is one (a read takes no
    write lock). Counted on the instance, so other databases of the process do not count."""
    counted = db.__dict__.get("_counted_writes")
    if counted is None:
        counted = [0]
        original = db.write

        def write(fn: Any, **options: Any) -> Any:
            counted[0] += 1
            return original(fn, **options)

        db.__dict__["_counted_writes"] = counted
        db.write = write  # type: ignore[method-assign]
    return counted[0]


def test_a_channel_seen_as_it_was_is_not_written_again(db: Database) -> None:
    channels = ChannelStore(db, FixedClock())
    first = channels.seen("c1", surface="discord", kind="guild", name="general", guild_id="g1")
    channels.set_mode("c1", "mention")
    channels.set_trusted("c1", True)
    before = writes(db)
    again = channels.seen("c1", surface="discord", kind="guild", name="general", guild_id="g1")
    assert writes(db) == before  # nothing new: nothing written
    assert (
        channels.seen("c1", surface="discord", kind="guild") == again
    )  # no name, no guild: the known ones stand
    assert writes(db) == before
    assert (again.mode, again.trusted, first.mode) == ("mention", True, "all")


def test_a_channel_that_changed_is_written_and_keeps_its_trust_and_mode(db: Database) -> None:
    channels = ChannelStore(db, FixedClock())
    channels.seen("c1", surface="discord", kind="guild", name="general", guild_id="g1")
    channels.set_trusted("c1", True)
    before = writes(db)
    renamed = channels.seen("c1", surface="discord", kind="guild", name="lounge")
    assert writes(db) > before
    assert (renamed.name, renamed.guild_id, renamed.trusted) == ("lounge", "g1", True)
    moved = channels.seen("c1", surface="discord", kind="dm")
    assert (moved.kind, moved.name, moved.trusted) == ("dm", "lounge", True)


def test_the_recent_window_reads_back_what_was_recorded(db: Database) -> None:
    clock = FixedClock()
    history = History(db, clock)
    start = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)
    for n in range(3):
        author = Author(id="u1", name="ann") if n != 1 else Author(id="imp:pip", name="pip", bot=True)
        created = start + timedelta(seconds=n)
        history.record("c1", Message(id=f"m{n}", author=author, content=f"ü {n}", created_at=created),
                       from_imp="pip" if n == 1 else None)  # fmt: skip
    entries = history.recent("c1", imp="pip")
    assert [(e.id, e.author.id, e.author.bot, e.content, e.from_imp) for e in entries] == [
        ("m0", "u1", False, "ü 0", False), ("m1", "imp:pip", True, "ü 1", True), ("m2", "u1", False, "ü 2", False),
    ]  # fmt: skip
    assert [e.created_at for e in entries] == [start + timedelta(seconds=n) for n in range(3)]
    assert entries[0].created_at.tzinfo is UTC
    assert [e.from_imp for e in history.recent("c1")] == [
        False,
        False,
        False,
    ]  # no imp asked: none is its own
