"""Which scopes a session writes and reads, from the host's channels and history; presence (issue 23, m10)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from box.protocol.models import Author, Message
from impyard.channels.store import ChannelStore
from impyard.clock import FixedClock
from impyard.conversation.history import History
from impyard.memory.scopes import SessionScopes, decide, presence, resolve, scopes_of
from impyard.storage.db import Database
from tests.memory.conftest import IMP, T0

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("kind", "guild_id", "partner", "guilds", "writes", "reads"),
    [
        ("guild", "G1", None, [], "guild:G1", ("guild:G1",)),
        ("guild", None, None, [], "guild:channel:c1", ("guild:channel:c1",)),
        ("guild", "G1", "p1", ["G2"], "guild:G1", ("guild:G1",)),  # a guild reads only its guild
        ("dm", None, "p1", ["G2", "G1", "G1"], "dm:p1", ("dm:p1", "guild:G1", "guild:G2")),
        ("dm", None, None, [], "dm:channel:c1", ("dm:channel:c1",)),
        ("terminal", None, None, [], "terminal", ("terminal",)),
        ("task", "G1", "p1", ["G1"], "terminal", ("terminal",)),
    ],
)
def test_decide(
    kind: str,
    guild_id: str | None,
    partner: str | None,
    guilds: list[str],
    writes: str,
    reads: tuple[str, ...],
) -> None:
    assert decide(kind, "c1", guild_id, partner, guilds) == SessionScopes(writes, reads)


@pytest.mark.parametrize("kind", [None, "", "voice"])
def test_an_unknown_channel_gets_no_scopes(kind: str | None) -> None:
    assert decide(kind, "c1", "G1", "p1", ["G1"]) is None


def test_the_writes_scope_is_always_read_first() -> None:
    assert SessionScopes("dm:p1", ("guild:G1",)).reads == ("dm:p1", "guild:G1")
    assert SessionScopes("t", ("t", "t")).session_memory().model_dump() == {"writes": "t", "reads": ["t"]}
    with pytest.raises(ValueError):
        SessionScopes("", ())


def _say(
    history: History, channel: str, mid: str, who: str, at: datetime, *, from_imp: str | None = None
) -> None:
    history.record(
        channel,
        Message(id=mid, author=Author(id=who, name=who.upper()), content="hi", created_at=at),
        from_imp=from_imp,
    )


@pytest.fixture
def world(db: Database, clock: FixedClock) -> History:
    channels = ChannelStore(db, clock)
    channels.seen("g1", surface="discord", kind="guild", name="general", guild_id="G1")
    channels.seen("g2", surface="discord", kind="guild", name="games", guild_id="G1")
    channels.seen("h1", surface="discord", kind="guild", name="hobby", guild_id="G2")
    channels.seen("x1", surface="discord", kind="guild", name="other", guild_id="G3")
    channels.seen("d1", surface="discord", kind="dm", name="")
    channels.seen("t1", surface="terminal", kind="terminal", name="terminal")
    history = History(db, clock)
    _say(history, "g1", "m1", "p1", T0)
    _say(history, "h1", "m2", "p1", T0)
    _say(history, "x1", "m3", "q1", T0)  # someone else's guild
    _say(history, "d1", "m4", "p1", T0)
    _say(history, "d1", "m5", IMP, T0, from_imp=IMP)  # the imp's own reply is not the partner
    return history


async def test_resolve_reads_channels_and_history(db: Database, world: History) -> None:
    assert await resolve(db, IMP, "d1") == SessionScopes("dm:p1", ("dm:p1", "guild:G1", "guild:G2"))
    assert await resolve(db, IMP, "g2") == SessionScopes("guild:G1", ("guild:G1",))
    assert await resolve(db, IMP, "t1") == SessionScopes("terminal", ("terminal",))
    assert await resolve(db, IMP, "never-seen") is None
    assert scopes_of(db, IMP, "x1") == SessionScopes("guild:G3", ("guild:G3",))


def test_m10_presence_lists_fresh_readable_conversations_only(
    db: Database, clock: FixedClock, world: History
) -> None:
    now = T0 + timedelta(hours=2)
    talk = [
        ("g1", "a0", "q1", now - timedelta(minutes=70)),  # an earlier stretch: over 30 min before the next
        ("g1", "a1", "q1", now - timedelta(minutes=10)),
        ("g1", "a2", "q1", now - timedelta(minutes=2)),
        ("d1", "a3", "p1", now - timedelta(minutes=1)),  # a DM going on
        ("g2", "a4", "r1", now - timedelta(minutes=31)),  # stale
        ("h1", "a5", "s1", now - timedelta(minutes=3)),  # another guild
    ]
    history = world
    for channel, mid, who, at in talk:
        _say(history, channel, mid, who, at)
        history.record_wake(IMP, channel, mid)
    guild_view = presence(
        db, IMP, channel_id="g2", person_id="u9", scopes=SessionScopes("guild:G1", ()), now=now
    )
    assert [(e.person, e.channel, e.joined_at, e.last_input_at, e.turns) for e in guild_view] == [
        ("Q1", "#general", now - timedelta(minutes=10), now - timedelta(minutes=2), 2)
    ]
    assert all("direct" not in e.channel and e.person != "P1" for e in guild_view)  # never the DM partner
    dm_view = presence(
        db,
        IMP,
        channel_id="d1",
        person_id="p1",
        scopes=SessionScopes("dm:p1", ("guild:G1", "guild:G2")),
        now=now,
    )
    assert [(e.person, e.channel) for e in dm_view] == [("Q1", "#general"), ("S1", "#hobby")]
    other_dm = presence(db, IMP, channel_id="g1", person_id="q1", scopes=SessionScopes("dm:p1", ()), now=now)
    assert [(e.person, e.channel, e.turns) for e in other_dm] == [("P1", "a direct message", 1)]
