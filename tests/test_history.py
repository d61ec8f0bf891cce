"""The history store: persisted before routing, bounded per channel, outcomes recorded once."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Connection

from box.protocol.models import Author, Message, ReplyRef
from impyard.clock import FixedClock
from impyard.conversation.history import History
from impyard.conversation.history_surface import HistorySurface
from impyard.gateway.surfaces import OutgoingFile, Post, RecordingSurface
from impyard.storage.db import Database, open_database
from impyard.storage.tables import history as history_table


def msg(n: int, clock: FixedClock, content: str = "hi") -> Message:
    return Message(
        id=f"m{n}",
        author=Author(id="ann", name="ann"),
        content=content,
        created_at=clock.now() + timedelta(seconds=n),
    )


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


def test_retention_keeps_the_newest_messages_per_channel(any_engine_db: Database, clock: FixedClock) -> None:
    history = History(any_engine_db, clock, retention=5)
    for n in range(12):
        history.record("a", msg(n, clock))
    history.record("b", msg(0, clock))
    assert [entry.id for entry in history.recent("a")] == [f"m{n}" for n in range(7, 12)]
    assert history.count("b") == 1  # other channels are untouched


def test_recording_is_idempotent_and_outcomes_are_written_once(
    any_engine_db: Database, clock: FixedClock
) -> None:
    history = History(any_engine_db, clock)
    history.record("a", msg(1, clock))
    history.record("a", msg(1, clock, "edited?"))  # a re-delivered message is not stored twice
    assert history.count("a") == 1 and history.get("a", "m1").content == "hi"  # type: ignore[union-attr]
    history.record_wake("pip", "a", "m1")
    history.finish("pip", "a", ["m1"], "sent")
    history.finish("pip", "a", ["m1"], "failed")
    assert history.outcome("pip", "a", "m1") == "sent"


def test_a_wake_is_claimed_once_per_imp_on_either_engine(any_engine_db: Database, clock: FixedClock) -> None:
    """Issue 36: the wake row is the message's claim; a second claim of the same (imp, channel, message) is told so."""
    history = History(any_engine_db, clock)
    history.record("a", msg(1, clock))
    assert history.record_wake("pip", "a", "m1") is True
    assert history.record_wake("pip", "a", "m1") is False  # another host, or the same event delivered again
    assert any_engine_db.write(lambda conn: history.record_wake("pip", "a", "m1", conn=conn)) is False
    assert (
        history.record_wake("bee", "a", "m1") is True
    )  # another imp's bot got the message too: its own claim
    history.finish("pip", "a", ["m1"], "sent")
    assert history.record_wake("pip", "a", "m1") is False and history.outcome("pip", "a", "m1") == "sent"


def test_triage_answers_fresh_wakes_and_marks_stale_ones_missed(
    any_engine_db: Database, clock: FixedClock
) -> None:
    history = History(any_engine_db, clock)
    old = Message(
        id="old",
        author=Author(id="ann", name="ann"),
        content="?",
        created_at=clock.now() - timedelta(minutes=6),
    )
    new = Message(
        id="new",
        author=Author(id="ann", name="ann"),
        content="?",
        created_at=clock.now() - timedelta(minutes=4),
    )
    for message in (old, new):
        history.record("a", message)
        history.record_wake("pip", "a", message.id)
    assert [wake.message.id for wake in history.triage()] == ["new"]
    assert history.outcome("pip", "a", "old") == "missed"
    assert history.outcome("pip", "a", "new") is None  # still to be answered


def test_retention_must_keep_something(tmp_path: Path, clock: FixedClock) -> None:
    with pytest.raises(ValueError, match="at least one"):
        History(open_database(tmp_path / "db"), clock, retention=0)


@pytest.mark.parametrize(("raw", "expected"), [("", 1000), ("25", 25)])
def test_retention_from_the_environment(raw: str, expected: int) -> None:
    from impyard.conversation.history import retention_from_env

    assert retention_from_env({"IMPYARD_HISTORY_RETENTION": raw}) == expected


@pytest.mark.parametrize("raw", ["0", "-3", "lots", "1e3"])
def test_a_bad_retention_setting_is_a_clear_error(raw: str) -> None:
    from impyard.conversation.history import retention_from_env

    with pytest.raises(ValueError, match="IMPYARD_HISTORY_RETENTION"):
        retention_from_env({"IMPYARD_HISTORY_RETENTION": raw})


def test_triage_never_answers_again_a_message_the_imp_had_answered(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """Issue 19 #2: the reply went out (it is in the history, answering the message) but the outcome write was
    lost: recovery marks the wake sent and does not answer it a second time. Another imp's reply does not count."""
    history = History(any_engine_db, clock)
    for n in (1, 2):
        history.record("a", msg(n, clock))
        history.record_wake("pip", "a", f"m{n}")
    reply = Message(id="r1", author=Author(id="pip-bot", name="pip", bot=True), content="hello",
                    created_at=clock.now() + timedelta(seconds=3), reply_to=ReplyRef(id="m1"))  # fmt: skip
    history.record("a", reply, from_imp="pip")
    other = Message(id="r2", author=Author(id="bee-bot", name="bee", bot=True), content="hi",
                    created_at=clock.now() + timedelta(seconds=4), reply_to=ReplyRef(id="m2"))  # fmt: skip
    history.record("a", other, from_imp="bee")
    assert [wake.message.id for wake in history.triage()] == ["m2"]
    assert history.outcome("pip", "a", "m1") == "sent" and history.outcome("pip", "a", "m2") is None


@pytest.mark.anyio
async def test_a_picture_only_post_is_kept_with_its_file_not_as_an_empty_message(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """Seed 003: the imp's own post is recorded with what it carried — a picture-only reply names its file."""
    history = History(any_engine_db, clock)
    surface = HistorySurface(RecordingSurface(), history, lambda imp: f"id-{imp}", clock)
    picture = OutgoingFile("owl.png", b"\x89PNG" + b"\x00" * 96)
    [sent] = await surface.send(Post("c1", "", "m1", (picture,), "reply", "pip"))
    [shown] = history.shown("pip", ["c1"], 10)
    assert (shown.message_id, shown.content, shown.attachments) == (sent, "", 1)
    kept = select(history_table.c.attachments).where(history_table.c.message_id == sent)
    stored = history.db.read(lambda conn: conn.execute(kept).scalar_one())
    assert json.loads(stored) == [{"filename": "owl.png", "content_type": "image/png", "size": 100}]


def test_retention_counts_each_channel_apart_and_never_reuses_a_trimmed_number(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """The trim keeps exactly the newest ``retention`` of a channel, by the order they were kept (``seq``), not
    by their ids or times; a message kept after a trim comes after the survivors."""
    history = History(any_engine_db, clock, retention=3)
    for n in (9, 1, 5, 3, 7):  # ids and times out of order: the order kept is what counts
        history.record("a", msg(n, clock))
    history.record("b", msg(2, clock))
    assert [entry.id for entry in history.recent("a")] == ["m5", "m3", "m7"]
    history.forget("a", "m7")
    history.record("a", msg(4, clock))
    assert [entry.id for entry in history.recent("a")] == ["m5", "m3", "m4"]
    assert history.count("a") == 3 and history.count("b") == 1
    assert history.clear("a") == 3 and history.recent("a") == [] and history.count("b") == 1


def test_the_operators_view_of_an_imps_channels(any_engine_db: Database, clock: FixedClock) -> None:
    history = History(any_engine_db, clock)
    history.record("a", msg(1, clock))
    history.record_wake("pip", "a", "m1")
    history.record_wake("Zed", "a", "m1")
    history.record_wake("bee-2", "a", "m1")
    history.record("b", msg(2, clock))
    history.record("c", msg(3, clock))
    history.record_wake("pip", "c", "m3")
    reply = Message(id="r1", author=Author(id="pip-bot", name="pip", bot=True), content="hello",
                    created_at=clock.now(), reply_to=ReplyRef(id="m1"))  # fmt: skip
    history.record("a", reply, from_imp="pip")
    assert history.channels_of("pip") == ["a", "c"]  # the latest message first
    assert history.imps_in("a") == ["Zed", "bee-2", "pip"]  # by code point, as SQLite orders text
    assert history.woke("pip", "a", "m1") and not history.woke("pip", "b", "m2")
    shown = history.shown("pip", ["a", "b"], 2)
    assert [(s.message_id, s.woke, s.author_bot, s.from_imp) for s in shown] == [
        ("m2", False, False, None), ("r1", False, True, "pip")
    ]  # fmt: skip
    [first] = history.shown("pip", ["a"], 2)[:1]
    assert (first.message_id, first.woke, first.outcome) == ("m1", True, None)
    assert history.shown("pip", [], 5) == []
    assert history.author_names("ann") == ["ann"] and history.author_ids("ann") == ["ann"]


def test_unfinished_wakes_come_in_the_order_they_woke(any_engine_db: Database, clock: FixedClock) -> None:
    """Ordered by the ISO time each woke, byte by byte on both engines (PostgreSQL's collation is not SQLite's),
    not by the order the messages came in."""
    history = History(any_engine_db, clock)
    for n in range(1, 5):
        history.record("a", msg(n, clock))
    for message_id, imp in (("m2", "pip"), ("m4", "bee"), ("m1", "pip"), ("m3", "pip")):
        clock.advance(seconds=1)
        history.record_wake(imp, "a", message_id)
    history.finish("pip", "a", ["m3"], "sent")
    assert [w.message.id for w in history.unfinished()] == ["m2", "m4", "m1"]
    assert [w.message.id for w in history.unfinished("pip")] == ["m2", "m1"]


def test_a_composed_job_keeps_a_message_and_its_wake_in_one_transaction(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """Given ``conn``, the store joins the caller's write (issue 18: one trip, one transaction), and a write that
    fails half-way leaves nothing."""
    history = History(any_engine_db, clock, retention=2)

    def both(conn: Connection) -> list[str]:
        history.record("a", msg(1, clock), conn=conn)
        history.record_wake("pip", "a", "m1", conn=conn)
        return [entry.id for entry in history.recent("a", conn=conn)]

    assert any_engine_db.write(both) == ["m1"]
    assert history.get("a", "m1") is not None and history.woke("pip", "a", "m1")

    def half(conn: Connection) -> None:
        history.record("a", msg(2, clock), conn=conn)
        raise RuntimeError("the wake failed")

    with pytest.raises(RuntimeError):
        any_engine_db.write(half)
    assert history.get("a", "m2") is None and history.count("a") == 1
