"""The history store: persisted before routing, bounded per channel, outcomes recorded once."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from box.protocol.models import Author, Message, ReplyRef
from impyard.clock import FixedClock
from impyard.db import open_database
from impyard.history import History
from impyard.history_surface import HistorySurface
from impyard.surfaces import OutgoingFile, RecordingSurface


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


def test_retention_keeps_the_newest_messages_per_channel(tmp_path: Path, clock: FixedClock) -> None:
    history = History(open_database(tmp_path / "db"), clock, retention=5)
    for n in range(12):
        history.record("a", msg(n, clock))
    history.record("b", msg(0, clock))
    assert [entry.id for entry in history.recent("a")] == [f"m{n}" for n in range(7, 12)]
    assert history.count("b") == 1  # other channels are untouched


def test_recording_is_idempotent_and_outcomes_are_written_once(tmp_path: Path, clock: FixedClock) -> None:
    history = History(open_database(tmp_path / "db"), clock)
    history.record("a", msg(1, clock))
    history.record("a", msg(1, clock, "edited?"))  # a re-delivered message is not stored twice
    assert history.count("a") == 1 and history.get("a", "m1").content == "hi"  # type: ignore[union-attr]
    history.record_wake("pip", "a", "m1")
    history.finish("pip", "a", ["m1"], "sent")
    history.finish("pip", "a", ["m1"], "failed")
    assert history.outcome("pip", "a", "m1") == "sent"


def test_triage_answers_fresh_wakes_and_marks_stale_ones_missed(tmp_path: Path, clock: FixedClock) -> None:
    history = History(open_database(tmp_path / "db"), clock)
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
    from impyard.history import retention_from_env

    assert retention_from_env({"IMPYARD_HISTORY_RETENTION": raw}) == expected


@pytest.mark.parametrize("raw", ["0", "-3", "lots", "1e3"])
def test_a_bad_retention_setting_is_a_clear_error(raw: str) -> None:
    from impyard.history import retention_from_env

    with pytest.raises(ValueError, match="IMPYARD_HISTORY_RETENTION"):
        retention_from_env({"IMPYARD_HISTORY_RETENTION": raw})


def test_triage_never_answers_again_a_message_the_imp_had_answered(tmp_path: Path, clock: FixedClock) -> None:
    """Issue 19 #2: the reply went out (it is in the history, answering the message) but the outcome write was
    lost: recovery marks the wake sent and does not answer it a second time. Another imp's reply does not count."""
    history = History(open_database(tmp_path / "db"), clock)
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
    tmp_path: Path, clock: FixedClock
) -> None:
    """Seed 003: the imp's own post is recorded with what it carried — a picture-only reply names its file."""
    history = History(open_database(tmp_path / "h.db"), clock)
    surface = HistorySurface(RecordingSurface(), history, lambda imp: f"id-{imp}", clock)
    picture = OutgoingFile("owl.png", b"\x89PNG" + b"\x00" * 96)
    [sent] = await surface.send("c1", "", "m1", [picture], "reply", imp="pip")
    [shown] = history.shown("pip", ["c1"], 10)
    assert (shown.message_id, shown.content, shown.attachments) == (sent, "", 1)
    [row] = history.db.query("SELECT attachments FROM history WHERE message_id = ?", (sent,))
    assert json.loads(row[0]) == [{"filename": "owl.png", "content_type": "image/png", "size": 100}]
