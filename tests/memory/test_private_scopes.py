"""Scopes follow who can read (issue 32 #4): the rule, the host's facts, presence, the one-time move, the CLI.

A server channel whose audience is narrower than the server's (``channels.audience = 'private'``) keeps its
memories in ``channel:<channel id>``; it reads there and the server's public scope. A public channel reads the
server's public scope only; a DM with P reads ``dm:P`` and the public scopes of P's servers, never a private
channel's. A channel the host knew before it read audiences has its memories moved to its own scope once, the
first time it is found private; after that a memory keeps the scope it was formed in.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner

from box.protocol.memory import ConstructParams
from box.protocol.models import Author, Message
from impyard.channels.store import ChannelStore
from impyard.cli import cli
from impyard.clock import FixedClock
from impyard.conversation.history import History
from impyard.host import channel_store
from impyard.imps.store import ImpStore
from impyard.memory.cache import VectorCache
from impyard.memory.scopes import SessionScopes, decide, parse_scope, presence, scopes_of
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database, open_database
from tests.memory.conftest import IMP, T0, embed, moment, rows
from tests.test_memory_night import LONG_AGO, conclusions, night, remember, slept
from tests.test_memory_night import home as home_fixture  # noqa: F401 - a fixture: pip, bee, the stand-in box

G1 = "G1"
GENERAL, STAFF, OTHER_STAFF = "g1", "s1", "s2"
PUBLIC_G1 = SessionScopes("guild:G1", ("guild:G1",))


# ------------------------------------------------------------------ the rule (pure)


@pytest.mark.parametrize(
    ("kind", "guild_id", "partner", "guilds", "audience", "writes", "reads"),
    [
        ("guild", "G1", None, [], "guild", "guild:G1", ("guild:G1",)),
        ("guild", "G1", None, [], None, "guild:G1", ("guild:G1",)),  # not known yet: as before
        ("guild", "G1", None, [], "private", "channel:c1", ("channel:c1", "guild:G1")),
        (
            "guild",
            None,
            None,
            [],
            "private",
            "channel:c1",
            ("channel:c1",),
        ),  # no server known: no server scope
        ("guild", None, None, [], "guild", "guild:channel:c1", ("guild:channel:c1",)),
        ("dm", None, "p1", ["G1"], None, "dm:p1", ("dm:p1", "guild:G1")),  # a DM never reads channel:…
        (
            "dm",
            None,
            "p1",
            ["G1"],
            "private",
            "dm:p1",
            ("dm:p1", "guild:G1"),
        ),  # an audience means nothing there
        ("terminal", None, None, [], "private", "terminal", ("terminal",)),
    ],
)
def test_decide_follows_the_audience(
    kind: str,
    guild_id: str | None,
    partner: str | None,
    guilds: list[str],
    audience: str | None,
    writes: str,
    reads: tuple[str, ...],
) -> None:
    assert decide(kind, "c1", guild_id, partner, guilds, audience) == SessionScopes(writes, reads)


@pytest.mark.parametrize(
    "name", ["terminal", "guild:1000", "guild:channel:5", "dm:2003", "dm:channel:7", "channel:1002"]
)
def test_scope_names_the_host_writes_are_taken(name: str) -> None:
    assert parse_scope(name) == name


@pytest.mark.parametrize(
    "name", ["", "channel:", "chan:1", "channel:a b", "guild:%", "private:1", "Terminal"]
)
def test_other_scope_names_are_refused_saying_which_there_are(name: str) -> None:
    with pytest.raises(
        ValueError, match=r"not a memory scope: write terminal, guild:<server id>, channel:<channel"
    ):
        parse_scope(name)


# ------------------------------------------------------------------ the host's facts


def _say(history: History, channel: str, mid: str, who: str, at: datetime = T0) -> None:
    history.record(
        channel, Message(id=mid, author=Author(id=who, name=who.upper()), content="hi", created_at=at)
    )


@pytest.fixture
def yard(mdb: Database, clock: FixedClock) -> tuple[ChannelStore, History]:
    channels = ChannelStore(mdb, clock)
    channels.seen(GENERAL, surface="discord", kind="guild", name="general", guild_id=G1, audience="guild")
    channels.seen(STAFF, surface="discord", kind="guild", name="staff", guild_id=G1, audience="private")
    channels.seen("d1", surface="discord", kind="dm")
    history = History(mdb, clock)
    _say(history, STAFF, "m1", "p1")  # p1 is staff, and has spoken only there
    _say(history, "d1", "m2", "p1")
    return channels, history


def test_a_private_channel_reads_itself_and_the_public_server_and_no_one_else_reads_it(
    mdb: Database, yard: tuple[ChannelStore, History]
) -> None:
    assert scopes_of(mdb, IMP, STAFF) == SessionScopes("channel:s1", ("channel:s1", "guild:G1"))
    assert scopes_of(mdb, IMP, GENERAL) == PUBLIC_G1
    # p1 spoke only in the staff channel: their DM reads the server's public scope, never the staff channel's.
    assert scopes_of(mdb, IMP, "d1") == SessionScopes("dm:p1", ("dm:p1", "guild:G1"))


def test_m10_presence_never_shows_a_private_channel_outside_it(
    mdb: Database, clock: FixedClock, yard: tuple[ChannelStore, History]
) -> None:
    _, history = yard
    now = T0 + timedelta(hours=2)
    for channel, mid, who in ((STAFF, "a1", "q1"), (GENERAL, "a2", "r1"), (STAFF, "a3", "q2")):
        _say(history, channel, mid, who, now - timedelta(minutes=1))
        history.record_wake(IMP, channel, mid)

    def listed(channel: str, person: str) -> list[tuple[str, str]]:
        scopes = scopes_of(mdb, IMP, channel)
        assert scopes is not None
        found = presence(mdb, IMP, channel_id=channel, person_id=person, scopes=scopes, now=now)
        return sorted((e.person, e.channel) for e in found)

    assert listed(GENERAL, "u9") == [("R1", "#general")]  # the staff talk is not there
    assert listed("d1", "p1") == [("R1", "#general")]
    assert listed(STAFF, "q1") == [("Q2", "#staff"), ("R1", "#general")]  # staff know #general is going on


# ------------------------------------------------------------------ the one-time move (the upgrade's data half)


def _keep(
    store: MemoryStore, channel: str, scope: SessionScopes, text: str, mid: str, join: str | None = None
) -> str:
    record_id, _ = store.scoped(IMP, scope, channel).encode(moment(text, message_id=mid, join=join))
    return record_id


def _scope_of(mdb: Database, record_id: str) -> tuple[str, set[str]]:
    record = rows(mdb, "SELECT scope FROM memory_records WHERE id = :r", r=record_id)
    episodes = rows(mdb, "SELECT scope FROM memory_episodes WHERE record_id = :r", r=record_id)
    return str(record[0]["scope"]), {str(e["scope"]) for e in episodes}


def _found(store: MemoryStore, scopes: SessionScopes, channel: str, text: str) -> list[str]:
    return [view.conclusion for view in store.scoped(IMP, scopes, channel).search(embed(text), k=10)]


def test_a_channel_found_private_takes_its_memories_along_once(
    any_engine_db: Database, clock: FixedClock
) -> None:
    """On SQLite and PostgreSQL."""
    mdb = any_engine_db
    store = MemoryStore(mdb, clock.now, VectorCache(64 * 1024 * 1024))
    channels = channel_store(mdb, clock)  # as every host builds it
    # A home from before issue 32: both channels known, no audience; every channel wrote the server's scope.
    for channel, name in ((GENERAL, "general"), (STAFF, "staff"), (OTHER_STAFF, "mods")):
        channels.seen(channel, surface="discord", kind="guild", name=name, guild_id=G1)
    staff = _keep(store, STAFF, PUBLIC_G1, "the staff plan to ban mallory on friday", "m1")
    public = _keep(store, GENERAL, PUBLIC_G1, "carol loves the rosegarden", "m2")
    mixed = _keep(store, GENERAL, PUBLIC_G1, "dave baked bread for everyone", "m3")
    _keep(store, STAFF, PUBLIC_G1, "the staff talked about dave's bread", "m4", join=mixed)  # a fold of two
    thought = store.scoped(IMP, PUBLIC_G1, STAFF).construct(_construct("people here are kind"))
    store.scoped(IMP, PUBLIC_G1, STAFF).conversation_put("p1", {"focus": ["mallory"]})
    assert "the staff plan to ban mallory on friday" in _found(
        store, PUBLIC_G1, GENERAL, "ban mallory friday"
    )

    channels.seen(STAFF, surface="discord", kind="guild", name="staff", guild_id=G1, audience="private")
    channels.seen(GENERAL, surface="discord", kind="guild", name="general", guild_id=G1, audience="guild")

    assert _scope_of(mdb, staff) == ("channel:s1", {"channel:s1"})
    assert _scope_of(mdb, mixed) == ("channel:s1", {"channel:s1"})  # the narrower audience wins, whole
    assert _scope_of(mdb, public) == ("guild:G1", {"guild:G1"})
    assert _scope_of(mdb, thought[0]) == ("guild:G1", set())  # records no channel: stays (docs/memory.md)
    saved = rows(mdb, "SELECT scope FROM memory_conversations WHERE channel_id = :c", c=STAFF)
    assert [r["scope"] for r in saved] == ["channel:s1"]
    # The public channel's search (its vector cache loaded before the move) no longer finds them; staff does.
    assert sorted(_found(store, PUBLIC_G1, GENERAL, "ban mallory friday")) == [
        "I believe: people here are kind", "carol loves the rosegarden",
    ]  # fmt: skip
    private = scopes_of(mdb, IMP, STAFF)
    assert private == SessionScopes("channel:s1", ("channel:s1", "guild:G1"))
    assert "the staff plan to ban mallory on friday" in _found(store, private, STAFF, "ban mallory friday")

    # Once only: the channel turns public, something is kept there, it turns private again: that stays public.
    channels.seen(STAFF, surface="discord", kind="guild", name="staff", guild_id=G1, audience="guild")
    later = _keep(
        store, STAFF, scopes_of(mdb, IMP, STAFF) or PUBLIC_G1, "the staff room is open to all now", "m5"
    )
    channels.seen(STAFF, surface="discord", kind="guild", name="staff", guild_id=G1, audience="private")
    assert _scope_of(mdb, later) == ("guild:G1", {"guild:G1"})
    # A channel first known public moves nothing, and no audience said (a slash command) forgets none known.
    channels.seen(OTHER_STAFF, surface="discord", kind="guild", name="mods", guild_id=G1)
    assert channels.info(STAFF) is not None and channels.info(STAFF).audience == "private"  # type: ignore[union-attr]
    channels.seen(STAFF, surface="discord", kind="guild", name="staff", guild_id=G1)
    assert channels.info(STAFF).audience == "private"  # type: ignore[union-attr]


def _construct(statement: str) -> ConstructParams:
    return ConstructParams(
        construct_kind="belief", feeling="calm", conclusion=f"I believe: {statement}", statement=statement,
        valence=0.3, intensity=0.5, vector=embed(statement),
    )  # fmt: skip


def test_an_unknown_audience_is_refused(mdb: Database, clock: FixedClock) -> None:
    with pytest.raises(ValueError, match="unknown audience"):
        ChannelStore(mdb, clock).seen(
            "x", surface="discord", kind="guild", guild_id=G1, audience="staff-only"
        )


# ------------------------------------------------------------------ the CLI takes the new names


def test_memory_show_takes_a_private_channels_scope() -> None:
    ImpStore().add("pip", memory={"enabled": True, "embedder": "hashing"})
    runner = CliRunner()
    given = runner.invoke(cli, ["memory", "remember", "pip", "The staff room smells of coffee.", "--valence", "0.2",
                                "--intensity", "0.5", "--scope", "channel:1002", "--json"])  # fmt: skip
    assert given.exit_code == 0, given.output
    shown = runner.invoke(cli, ["memory", "show", "pip", "--scope", "channel:1002", "--json"])
    assert shown.exit_code == 0, shown.output
    assert [(r["scope"], r["conclusion"]) for r in json.loads(shown.output)] == [
        ("channel:1002", "The staff room smells of coffee.")
    ]
    public = runner.invoke(cli, ["memory", "show", "pip", "--scope", "guild:1000", "--json"])
    assert public.exit_code == 0 and json.loads(public.output) == []
    bad = runner.invoke(cli, ["memory", "show", "pip", "--scope", "chan:1002"])
    assert bad.exit_code == 1
    assert bad.output.strip() == (
        "Error: --scope 'chan:1002' is not a memory scope: write terminal, guild:<server id>, channel:<channel id> "
        "(a private channel or thread), dm:<person id>, guild:channel:<channel id> or dm:channel:<channel id> "
        "(e.g. guild:123456789012345678)"
    )


# ------------------------------------------------------------------ the night works in a private scope alone


@pytest.mark.usefixtures("home_fixture")
def test_the_night_works_in_a_private_channels_scope_alone() -> None:
    """``impyard memory night``: one sleep task per scope with records, ``channel:<id>`` among them, each box
    writing and reading that scope only (the stand-in box reports what the host told it)."""
    staff, public = "channel:1002", "guild:200000000000000001"
    remember("pip", staff, "a faint staff chat", 0.3, LONG_AGO)  # below 0.6 at 30 days: forgotten
    remember("pip", staff, "the staff's old plan", 0.9, LONG_AGO)
    remember("pip", public, "a faint chat", 0.3, LONG_AGO)
    result = night("pip", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    told = {entry["scope"]: slept(entry["summary"]) for entry in report["scopes"]}
    assert sorted(told) == [staff, public]
    assert [(s["writes"], s["reads"], s["forgot"]) for s in (told[staff], told[public])] == [
        (staff, [staff], 1), (public, [public], 1),
    ]  # fmt: skip
    assert conclusions("pip") == [(staff, "the staff's old plan")]


def test_channel_ls_says_who_can_read_each_channel() -> None:
    db = open_database()
    try:
        channels = ChannelStore(db, FixedClock(T0))
        channels.seen(
            "1001", surface="discord", kind="guild", name="general", guild_id="1000", audience="guild"
        )
        channels.seen(
            "1002", surface="discord", kind="guild", name="staff", guild_id="1000", audience="private"
        )
        channels.seen("1003", surface="discord", kind="guild", name="old", guild_id="1000")
        channels.seen("1100", surface="discord", kind="dm")
    finally:
        db.close()
    listed = CliRunner().invoke(cli, ["channel", "ls", "--json"])
    assert listed.exit_code == 0, listed.output
    assert {c["channel_id"]: c["audience"] for c in json.loads(listed.output)} == {
        "1001": "guild", "1002": "private", "1003": None, "1100": None,
    }  # fmt: skip
    table = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["channel", "ls"])
    kinds = {
        line.split()[0]: line.split()[2] for line in table.output.splitlines() if line.strip()[:1].isdigit()
    }
    assert kinds == {"1001": "guild", "1002": "private", "1003": "guild", "1100": "dm"}, table.output
    shown = CliRunner().invoke(cli, ["channel", "show", "1002"])
    assert shown.exit_code == 0 and shown.output.strip().endswith("audience=private"), shown.output
    old = CliRunner().invoke(cli, ["channel", "show", "1003"])
    assert old.output.strip().endswith("audience=not known yet"), old.output
