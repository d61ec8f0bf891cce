"""Hosts as Discord shards (issue 21): ``impyard serve --shard I/N`` on two homes splits the servers between them.

Real parts: two ``impyard serve`` processes, each with its own IMPYARD_HOME and its own fake OpenAI, both on one
loopback fake Discord that routes by shard as Discord does (or, for issue 36, sends every event to every shard);
each host on its own home's SQLite file, or all on one shared SQLite file or PostgreSQL database.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from impyard.channels.store import ChannelInfo
from impyard.cli import cli
from impyard.discord.serve import shard_scope
from impyard.discord.shards import Shard, ShardError, shard_of
from impyard.storage.db import open_database
from testing.fake_discord import FakeChannel, FakeDiscord, FakeGuild, FakeUser, member
from testing.fake_openai import FakeOpenAI, envelope, slow
from tests.discord_yard import serving, until

IMPYARD = str(Path(sys.executable).parent / "impyard")
EVEN_GUILD = 2_000 << 22  # (id >> 22) % 2 == 0: shard 0 of 2
ODD_GUILD = 2_001 << 22  # shard 1 of 2
EVEN_A, EVEN_B, ODD_A, ODD_B = 3_001, 3_002, 3_003, 3_004
DM = 3_100
ALICE = FakeUser(2_001, "alice")
CAROL = FakeUser(2_003, "carol")
TOKEN = "pip-token-0123456789"
START_S = 60.0


# ------------------------------------------------------------------ the rule and the option


@pytest.mark.parametrize(
    ("guild_id", "count", "shard"),
    [
        (EVEN_GUILD, 2, 0),
        (ODD_GUILD, 2, 1),
        (EVEN_GUILD, 1, 0),
        (ODD_GUILD, 1, 0),
        (5 << 22 | 4_194_303, 3, 2),
    ],
)
def test_a_guild_belongs_to_the_shard_of_its_timestamp_bits(guild_id: int, count: int, shard: int) -> None:
    assert shard_of(guild_id, count) == shard
    assert [Shard(i, count).covers(guild_id) for i in range(count)] == [i == shard for i in range(count)]


def test_direct_messages_belong_to_shard_zero() -> None:
    assert Shard(0, 3).covers(None) and not Shard(1, 3).covers(None) and not Shard(2, 3).covers(None)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("2/2", "shard 2 is not below the shard count 2"),
        ("7/3", "shard 7 is not below the shard count 3"),
        ("0/0", "the shard count must be at least 1 (got 0)"),
        ("two", "'two' is not a shard: write I/N"),
        ("1", "'1' is not a shard: write I/N"),
        ("-1/2", "'-1/2' is not a shard: write I/N"),
        ("1/2/3", "'1/2/3' is not a shard: write I/N"),
        ("", "'' is not a shard: write I/N"),
        ("1/9999999", "'1/9999999' is not a shard: write I/N"),
    ],
)
def test_a_shard_discord_would_refuse_is_a_usage_error(text: str, error: str) -> None:
    with pytest.raises(ShardError, match=re.escape(error)):
        Shard.parse(text)
    result = CliRunner().invoke(cli, ["serve", "pip", "--shard", text])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"Invalid value for '--shard': {error}" in result.output


@pytest.mark.parametrize(
    ("text", "shard"), [("0/2", Shard(0, 2)), (" 1 / 2 ", Shard(1, 2)), ("0/1", Shard(0, 1))]
)
def test_a_shard_is_written_i_of_n(text: str, shard: Shard) -> None:
    assert Shard.parse(text) == shard and str(shard) == text.replace(" ", "")


def test_the_status_line_says_what_a_shard_serves() -> None:
    assert shard_scope(None) == ""
    assert shard_scope(Shard(0, 2)) == " as shard 0/2 (the servers of shard 0, and direct messages)"
    assert shard_scope(Shard(1, 2)) == " as shard 1/2 (the servers of shard 1; direct messages go to shard 0)"


# ------------------------------------------------------------------ one host, in process


@pytest.mark.anyio
async def test_without_shard_identify_carries_none(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        assert yard.fake.shards_connected == [None]
    (plain,) = yard.fake.identifies
    assert plain.shard is None and plain.accepted


@pytest.mark.anyio
async def test_with_shard_identify_carries_it_and_the_log_says_so(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "impyard")
    async with serving(monkeypatch, model, shard=Shard(1, 2)) as yard:
        assert yard.fake.shards_connected == [(1, 2)]
    (sharded,) = yard.fake.identifies
    assert sharded.shard == (1, 2) and sharded.accepted
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith("serving pip on Discord as shard 1/2 (the servers of shard 1;") for line in lines
    )
    assert any(
        "on shard 1/2; servers: none on this shard" in line for line in lines
    )  # its one guild is shard 0's
    assert any("logged in as" in line and "on shard 1/2; intents:" in line for line in lines)


@pytest.mark.anyio
async def test_a_sharded_bot_shows_its_status_on_its_own_shard(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.discord_yard import ALICE as MEMBER
    from tests.discord_yard import GENERAL, OWNERS

    caplog.set_level(logging.INFO, "impyard")
    pip = {"discord": {"owner_channel": str(OWNERS), "presence": True}}
    async with serving(monkeypatch, model, shard=Shard(0, 2), pip=pip) as yard:  # its guild is shard 0's
        asked = yard.fake.post_message(GENERAL, MEMBER, "hi pip")
        await yard.answered(asked.id)
        (update,) = await yard.fake.wait_for(lambda: yard.fake.presence_updates)
    assert (update.shard, update.custom_status) == ((0, 2), "talking in #general")
    assert "imp pip status (shard 0/2): talking in #general" in [r.getMessage() for r in caplog.records]


@pytest.mark.anyio
async def test_a_message_of_another_shards_server_is_dropped_and_counted(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36: the yard's one server is shard 0's; a gateway that broadcasts hands shard 1/2 its message (a server
    discord.py never cached: the id comes from the message alone). Dropped before the pipeline, counted, logged once
    as a warning; its DM (shard 0's) likewise. Nothing kept, nothing answered."""
    from tests.discord_yard import ALICE as MEMBER
    from tests.discord_yard import CAROL as DM_PERSON
    from tests.discord_yard import DM as YARD_DM
    from tests.discord_yard import GENERAL, GUILD

    caplog.set_level(logging.DEBUG, "impyard")
    for name in ("impyard.discord", "impyard.serve"):  # a serve run earlier in this process set them to INFO
        caplog.set_level(logging.DEBUG, name)
    async with serving(monkeypatch, model, shard=Shard(1, 2)) as yard:
        yard.fake.broadcast_to_every_shard()
        first = yard.fake.post_message(GENERAL, MEMBER, "hi pip")
        second = yard.fake.post_message(GENERAL, MEMBER, "hi again")
        yard.fake.post_message(YARD_DM, DM_PERSON, "psst")
        await until(lambda: yard.host.off_shard().get("message", 0) >= 3)
        assert yard.host.off_shard() == {"message": 3}
        assert yard.rt.history.get(str(GENERAL), str(first.id)) is None
        assert yard.rt.conversations.duplicates == 0 and yard.rt.sessions.boxes_started == 0
    assert yard.fake.messages(GENERAL) == [] and model.requests == []
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "shard 1/2: " in r.getMessage()]
    assert lines[0] == (
        "WARNING",
        f"imp pip on shard 1/2: Discord sent a message event of server {GUILD}, which is shard 0's: dropped (and "
        "every other such event, counted); check that each host runs with its own --shard",
    )
    assert lines[1:] == [
        ("DEBUG", f"imp pip on shard 1/2: dropped a message event of server {GUILD}"),
        ("DEBUG", "imp pip on shard 1/2: dropped a message event of a direct message"),
    ]
    assert f"message={second.id}" not in caplog.text


@pytest.mark.anyio
async def test_a_shard_discord_refuses_stops_serve_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    from impyard.discord.client import DiscordSetupError

    with pytest.raises(DiscordSetupError) as refused:
        async with serving(monkeypatch, model, fake_kwargs={"max_guilds_per_shard": 0}):
            pytest.fail("served past the guild limit of one connection")
    assert "Discord requires sharding for imp pip" in str(refused.value)
    assert "--shard I/N" in str(refused.value)


# ------------------------------------------------------------------ two hosts, two processes


def make_fake() -> FakeDiscord:
    people = [member(ALICE), member(CAROL)]
    guilds = [
        FakeGuild(EVEN_GUILD, "even", owner_id=ALICE.id, members=people,
                  channels=[FakeChannel(EVEN_A, "even-a"), FakeChannel(EVEN_B, "even-b")]),
        FakeGuild(ODD_GUILD, "odd", owner_id=ALICE.id, members=people,
                  channels=[FakeChannel(ODD_A, "odd-a"), FakeChannel(ODD_B, "odd-b")]),
    ]  # fmt: skip
    return FakeDiscord(TOKEN, guilds=guilds, dms=[FakeChannel.dm(DM, CAROL)])


def prepare_home(home: Path, database: str = "") -> None:
    """pip, trusted in every channel of both servers: which host answers is the shards' doing alone."""
    env = {"IMPYARD_HOME": str(home), "IMPYARD_DATABASE_URL": database}
    runner = CliRunner()
    if (
        runner.invoke(cli, ["imp", "show", "pip"], env=env).exit_code != 0
    ):  # a second home of one database has it
        added = runner.invoke(cli, ["imp", "add", "pip", "--persona", "You are Pip."], env=env)
        assert added.exit_code == 0, added.output
    assert (
        home / "imps" / "pip" / "imp.toml"
    ).is_file()  # made here, or fetched from the database (issue 36)
    for channel in (EVEN_A, EVEN_B, ODD_A, ODD_B):
        assert runner.invoke(cli, ["channel", "trust", str(channel)], env=env).exit_code == 0


def serve_env(
    home: Path, model: FakeOpenAI, fake: FakeDiscord, database: str = "", **extra: str
) -> dict[str, str]:
    """The environment of an ``impyard serve pip`` process of its own: its home, its model, the fake Discord, and
    ``database`` (empty: its home's own file); ``extra`` adds to it (``DOCKER_HOST``)."""
    return {
        **os.environ, "IMPYARD_HOME": str(home), "OPENAI_API_KEY": str(model.api_key), "OPENAI_BASE_URL": model.base_url,
        "IMPYARD_DISCORD_TOKEN_PIP": TOKEN, "IMPYARD_DISCORD_API_BASE": fake.api_base,
        "IMPYARD_DISCORD_GUILD_READY_TIMEOUT": "0.05", "IMPYARD_DATABASE_URL": database, **extra,
    }  # fmt: skip


def serve_args(shard: str | None, backend: str = "process") -> list[str]:
    """``impyard serve pip`` with ``--shard`` (None: without it)."""
    return [IMPYARD, "serve", "pip", "--backend", backend, *(["--shard", shard] if shard is not None else [])]


@contextmanager
def serve_process(
    home: Path, shard: str | None, model: FakeOpenAI, fake: FakeDiscord, database: str = "", *,
    backend: str = "process", **extra: str,
) -> Iterator[Path]:  # fmt: skip
    """``impyard serve pip --shard I/N`` (None: without --shard) as a process of its own (``serve_env``), on
    ``backend``; yields its log file; SIGTERM after."""
    log = home.parent / f"serve-{home.name}-{(shard or 'all').replace('/', '-')}.log"
    with log.open("w") as out:
        child = subprocess.Popen(
            serve_args(shard, backend), env=serve_env(home, model, fake, database, **extra), stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            yield log
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=START_S) == 0, log.read_text()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def wait_for_line(log: Path, text: str, timeout: float = START_S) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} in {log.name}:\n{log.read_text()}")
        time.sleep(0.05)


@contextmanager
def two_shards(tmp_path: Path, fake: FakeDiscord, url: str) -> Iterator[tuple[Path, Path]]:
    """``serve --shard 0/2`` and ``1/2``, each with its own home and model (answering ``pip of shard I``), on ``url``
    (empty: each home's own SQLite file), both serving; yields their logs; both stopped after."""
    with FakeOpenAI() as model0, FakeOpenAI() as model1:
        for shard, model in ((0, model0), (1, model1)):
            model.script(envelope(answer=f"pip of shard {shard}"))
            prepare_home(tmp_path / f"home{shard}", url)
        with (
            serve_process(tmp_path / "home0", "0/2", model0, fake, url) as log0,
            serve_process(tmp_path / "home1", "1/2", model1, fake, url) as log1,
        ):
            wait_for_line(log0, "serving pip on Discord as shard 0/2")
            wait_for_line(log1, "serving pip on Discord as shard 1/2")
            yield log0, log1


def ask_everywhere(fake: FakeDiscord) -> dict[int, int]:
    """One message in each channel of both servers and in the DM: message id → the shard whose host owns it."""
    asked = {}
    for channel, author, shard in (
        (EVEN_A, ALICE, 0), (ODD_A, ALICE, 1), (DM, CAROL, 0), (EVEN_B, CAROL, 0), (ODD_B, CAROL, 1),
    ):  # fmt: skip
        asked[fake.post_message(channel, author, "hello pip").id] = shard
    return asked


def until_answered(fake: FakeDiscord, asked: dict[int, int]) -> None:
    """Until the bot posted as many messages as were asked (each host stops only after its running turns)."""
    fake.wait_for_sync(
        lambda: sum(len(fake.messages(c)) for c in (EVEN_A, EVEN_B, ODD_A, ODD_B, DM)) >= len(asked),
        timeout=START_S,
    )


@pytest.mark.parametrize("database", ["own", "postgresql"])
def test_two_hosts_as_two_shards_answer_every_message_exactly_once(
    tmp_path: Path, database: str, request: pytest.FixtureRequest
) -> None:
    """Two real ``serve --shard I/2`` processes: each on its own home's SQLite file, or both on one PostgreSQL
    database (issue 21's "done when"), where each also holds its shard's lease and every reply is kept once."""
    url = request.getfixturevalue("migrated_postgres_url") if database == "postgresql" else ""
    with make_fake() as fake:
        with two_shards(tmp_path, fake, url) as (log0, log1):
            assert fake.shards_connected == [(0, 2), (1, 2)]
            asked = ask_everywhere(fake)  # message id → the shard whose host must answer it
            until_answered(fake, asked)
        # Both hosts have stopped (their running turns finished): every reply there will be is here.
        replies = [m for c in (EVEN_A, EVEN_B, ODD_A, ODD_B, DM) for m in fake.messages(c)]
        answered = {m.reference_id: m.content for m in replies}
        assert len(replies) == len(asked) and set(answered) == set(asked), [
            (m.channel_id, m.reference_id, m.content) for m in replies
        ]  # each exactly once
        assert {m.author_id for m in replies} == {fake.bot_user.id}
        assert answered == {message: f"pip of shard {shard}" for message, shard in asked.items()}
        assert [i.shard for i in fake.identifies] in ([(0, 2), (1, 2)], [(1, 2), (0, 2)])
        logs = {0: log0.read_text(), 1: log1.read_text()}
    assert "on shard 0/2; servers: even" in logs[0] and "on shard 1/2; servers: odd" in logs[1]
    for message, shard in asked.items():
        assert f"message={message} " in logs[shard] and f"message={message} " not in logs[1 - shard]
    assert TOKEN not in logs[0] + logs[1]
    if url:  # one database: both hosts' turns are in it, each once, and each host held its own shard
        db = open_database(url=url)
        try:
            wakes = db.read(lambda c: c.execute(text("SELECT message_id, outcome FROM wakes")).all())
            leases = db.read(
                lambda c: c.execute(text("SELECT name, token FROM leases WHERE name LIKE 'shard:%'")).all()
            )
        finally:
            db.close()
        assert sorted((str(m), o) for m, o in wakes) == sorted((str(m), "sent") for m in asked)
        assert sorted(leases) == [("shard:0/2", 1), ("shard:1/2", 1)]


@pytest.mark.parametrize(
    ("info", "owners"),
    [
        (ChannelInfo("1", kind="guild", guild_id=str(EVEN_GUILD)), [0]),
        (ChannelInfo("2", kind="guild", guild_id=str(ODD_GUILD)), [1]),
        (ChannelInfo("3", kind="dm"), [0]),
        (ChannelInfo("4", kind="guild", guild_id=None), [0]),  # its server unknown: shard 0's, like a DM
        (None, [0]),
        (ChannelInfo("terminal:pip", surface="terminal", kind="terminal"), [0, 1]),
        (ChannelInfo("task:pip", surface="log", kind="task"), [0, 1]),
    ],
)
def test_a_channel_is_the_shard_of_its_server_and_dms_are_shard_zero(
    info: ChannelInfo | None, owners: list[int]
) -> None:
    assert [i for i in range(2) if Shard(i, 2).owns_channel(info)] == owners


def test_a_shard_whose_host_is_killed_mid_turn_is_answered_by_its_next_holder(
    tmp_path: Path, migrated_postgres_url: str
) -> None:
    """Issue 21, "a host killed mid-turn loses no message that its shard's next holder can still answer": the
    host of shard 0/2 is killed (``kill -9``) while the model answers a message; another home's host takes the
    shard over at once (the holder is dead on this machine) and answers that message, once, from the shared
    PostgreSQL database. The killed host's model call in flight is settled by the next holder."""
    url = migrated_postgres_url
    with make_fake() as fake, FakeOpenAI() as model0, FakeOpenAI() as model1:
        model0.script(slow(envelope(answer="from the killed host"), 60.0))
        model1.script(envelope(answer="from the next holder"))
        prepare_home(tmp_path / "home0", url)
        prepare_home(tmp_path / "home1", url)
        log0 = tmp_path / "killed.log"
        with log0.open("w") as out:
            killed = subprocess.Popen(
                [IMPYARD, "serve", "pip", "--backend", "process", "--shard", "0/2"],
                env=serve_env(tmp_path / "home0", model0, fake, url), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            wait_for_line(log0, "serving pip on Discord as shard 0/2")
            asked = fake.post_message(EVEN_A, ALICE, "hello pip").id
            deadline = time.monotonic() + START_S
            while not model0.requests:  # mid-turn: the model has the request and takes its time
                assert time.monotonic() < deadline, log0.read_text()
                time.sleep(0.05)
            killed.kill()  # SIGKILL: no goodbye, no outcome written
            killed.wait(timeout=START_S)
        finally:
            if killed.poll() is None:
                killed.kill()
                killed.wait()
        with serve_process(tmp_path / "home1", "0/2", model1, fake, url) as log1:
            wait_for_line(log1, "serving pip on Discord as shard 0/2")
            fake.wait_for_sync(lambda: len(fake.messages(EVEN_A)) >= 1, timeout=START_S)
        replies = fake.messages(EVEN_A)
        assert [(m.reference_id, m.content) for m in replies] == [(asked, "from the next holder")], (
            log1.read_text()
        )
    db = open_database(url=url)
    try:
        wakes = db.read(lambda c: c.execute(text("SELECT message_id, outcome FROM wakes")).all())
        lease = db.read(
            lambda c: c.execute(text("SELECT token FROM leases WHERE name = 'shard:0/2'")).scalar_one()
        )
        in_flight = db.read(
            lambda c: c.execute(text("SELECT count(*) FROM ledger WHERE state = 'reserved'")).scalar_one()
        )
    finally:
        db.close()
    assert [(str(m), o) for m, o in wakes] == [(str(asked), "sent")]
    assert lease == 2  # taken over: the next token
    assert in_flight == 0  # the killed host's reservation was settled by the next holder


# ------------------------------------------------------------------ issue 36: exactly once, whatever Discord sends


def database_for(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """``own``: each home its own SQLite file (""); ``shared``: one SQLite file of both; ``postgresql``: one server."""
    if kind == "postgresql":
        return str(request.getfixturevalue("migrated_postgres_url"))
    return f"sqlite:///{tmp_path / 'shared.db'}" if kind == "shared" else ""


def replies_once(fake: FakeDiscord, asked: dict[int, int]) -> dict[int, str]:
    """Every reply the bot posted (after its hosts stopped: all there will be), by the message it answers; each
    message answered exactly once."""
    replies = [m for c in (EVEN_A, EVEN_B, ODD_A, ODD_B, DM) for m in fake.messages(c)]
    answered = {m.reference_id: m.content for m in replies if m.reference_id is not None}
    assert len(replies) == len(asked) and set(answered) == set(asked), [
        (m.channel_id, m.reference_id, m.content) for m in replies
    ]
    return answered  # type: ignore[return-value]


def wakes_of(url: str) -> list[tuple[str, str]]:
    db = open_database(url=url)
    try:
        rows = db.read(lambda c: c.execute(text("SELECT message_id, outcome FROM wakes")).all())
    finally:
        db.close()
    return sorted((str(m), str(o)) for m, o in rows)


@pytest.mark.parametrize("database", ["own", "shared", "postgresql"])
def test_two_shards_answer_every_message_once_when_discord_broadcasts_every_event(
    tmp_path: Path, database: str, request: pytest.FixtureRequest
) -> None:
    """Issue 36, "defence in depth": the fake Discord sends every event (servers, messages, DMs) to both shards.
    Each host drops what is not its shard's, and says so; every message is answered once, by its own shard's host
    (``own``: each host on its own database, so the drop alone holds it)."""
    url = database_for(database, tmp_path, request)
    with make_fake() as fake:
        fake.broadcast_to_every_shard()
        with two_shards(tmp_path, fake, url) as (log0, log1):
            asked = ask_everywhere(fake)
            until_answered(fake, asked)
            for log, (guild, other) in (
                (log0, (ODD_GUILD, 1)),
                (log1, (EVEN_GUILD, 0)),
            ):  # the other's: dropped
                wait_for_line(
                    log, f"Discord sent a message event of server {guild}, which is shard {other}'s: dropped"
                )
        answered = replies_once(fake, asked)
        logs = {0: log0.read_text(), 1: log1.read_text()}
    assert answered == {message: f"pip of shard {shard}" for message, shard in asked.items()}
    assert "on shard 0/2; servers: even (" in logs[0] and "on shard 1/2; servers: odd (" in logs[1]
    for message, shard in asked.items():  # routed by its own shard's host only
        assert f"message={message} " in logs[shard] and f"message={message} " not in logs[1 - shard]
    assert "hello pip" not in logs[0] + logs[1]  # ids, never text
    if url:
        assert wakes_of(url) == sorted((str(m), "sent") for m in asked)


@pytest.mark.parametrize("database", ["shared", "postgresql"])
def test_two_unsharded_hosts_of_one_imp_on_one_database_answer_every_message_once(
    tmp_path: Path, database: str, request: pytest.FixtureRequest
) -> None:
    """Issue 36, "a unique claim": two ``serve`` without --shard (one layout, so neither is refused) both get every
    message of the imp, as Discord sends every session of an unsharded bot everything. Each message is claimed by
    one host, which answers it; the other logs ``outcome=duplicate`` and neither queues nor answers it."""
    url = database_for(database, tmp_path, request)
    with make_fake() as fake, FakeOpenAI() as model0, FakeOpenAI() as model1:
        for n, model in ((0, model0), (1, model1)):
            model.script(envelope(answer=f"pip of host {n}"))
            prepare_home(tmp_path / f"home{n}", url)
        with (
            serve_process(tmp_path / "home0", None, model0, fake, url) as log0,
            serve_process(tmp_path / "home1", None, model1, fake, url) as log1,
        ):
            wait_for_line(log0, "serving pip on Discord")
            wait_for_line(log1, "serving pip on Discord")
            assert fake.shards_connected == [None, None]
            asked = ask_everywhere(fake)
            for (
                message
            ) in asked:  # both hosts routed each message: one claimed it, the other found it claimed
                wait_for_line(log0, f"message={message} ")
                wait_for_line(log1, f"message={message} ")
            fake.wait_for_sync(
                lambda: sum(len(fake.messages(c)) for c in (EVEN_A, EVEN_B, ODD_A, ODD_B, DM)) >= len(asked),
                timeout=START_S,
            )
        answered = replies_once(fake, asked)
        logs = [log0.read_text(), log1.read_text()]
    assert set(answered.values()) <= {"pip of host 0", "pip of host 1"}
    for message in asked:
        outcomes = [re.search(rf"message={message} kind=\w+ outcome=(\w+)", log) for log in logs]
        found = sorted(o[1] for o in outcomes if o is not None)
        assert len(found) == 2 and found[0] == "duplicate" and found[1] in ("queued", "started"), found
        answering = [n for n, o in enumerate(outcomes) if o is not None and o[1] != "duplicate"]
        assert answered[message] == f"pip of host {answering[0]}"
    assert "hello pip" not in "".join(logs)
    assert wakes_of(url) == sorted((str(m), "sent") for m in asked)


def refused(home: Path, shard: str | None, model: FakeOpenAI, fake: FakeDiscord, url: str) -> str:
    """``impyard serve`` that must be refused at start: its one ``Error:`` line (exit 1, no trace, no connection)."""
    done = subprocess.run(
        serve_args(shard), env=serve_env(home, model, fake, url), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=START_S,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    errors = [line for line in said.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in said and "serving pip" not in said, said
    return errors[0]


def answer_in(fake: FakeDiscord, channel: int) -> None:
    """A message in ``channel`` is answered (so its host is serving, past its start, before a test stops it)."""
    asked = fake.post_message(channel, ALICE, "hello pip").id
    fake.wait_for_sync(lambda: any(m.reference_id == asked for m in fake.messages(channel)), timeout=START_S)


def layout_of(url: str) -> dict[str, object] | None:
    result = CliRunner().invoke(cli, ["hosts", "--json"], env={"IMPYARD_DATABASE_URL": url})
    assert result.exit_code == 0, result.output
    found: dict[str, object] | None = json.loads(result.output)["layout"]
    return found


@pytest.mark.parametrize("database", ["shared", "postgresql"])
def test_a_host_of_another_shard_layout_is_refused_until_every_host_stopped(
    tmp_path: Path, database: str, request: pytest.FixtureRequest
) -> None:
    """Issue 36, "one shard layout per database": beside ``serve --shard 0/2``, a ``serve`` without --shard and a
    ``serve --shard 0/3`` are refused in one line naming the lease, host and pid that hold the layout; once that host
    stopped, the layout is free: an unsharded ``serve`` starts, and then refuses a sharded one (the reverse)."""
    url = database_for(database, tmp_path, request)
    here = socket.gethostname()
    with make_fake() as fake, FakeOpenAI() as model:
        model.script(envelope(answer="hi"))
        homes = [tmp_path / f"home{n}" for n in range(3)]
        for home in homes:
            prepare_home(home, url)
        assert layout_of(url) is None
        with serve_process(homes[0], "0/2", model, fake, url) as log:
            wait_for_line(log, "serving pip on Discord as shard 0/2")
            pid = int(
                re.findall(
                    r"pid (\d+)", CliRunner().invoke(cli, ["hosts"], env={"IMPYARD_DATABASE_URL": url}).output
                )[0]
            )
            layout = layout_of(url)
            assert layout is not None
            assert (layout["shards"], layout["state"], layout["fixed_by"]) == (
                2,
                "held",
                {"host": here, "pid": pid},
            )
            assert layout["held_by"] == [{"lease": "shard:0/2", "host": here, "pid": pid}]
            held_by = f"shard:0/2 is held by {here} (pid {pid})"
            assert refused(homes[1], None, model, fake, url) == (
                f"Error: this database is served as 2 shards ({held_by}): a `serve` without --shard would answer "
                "their messages a second time; start it with --shard I/2, or to serve without shards, stop every "
                "`impyard serve` of this database (`impyard hosts` lists them), then start each without --shard"
            )
            assert refused(homes[2], "0/3", model, fake, url) == (
                f"Error: this database is served as 2 shards ({held_by}), not 3: start this host with --shard I/2, "
                "or to change the number of shards, stop every `impyard serve` of this database (`impyard hosts` "
                "lists them), then start each with --shard I/3"
            )
            shown = CliRunner().invoke(cli, ["hosts"], env={"IMPYARD_DATABASE_URL": url}).output
            assert shown.splitlines()[0].startswith(
                f"Shard layout: Discord is served as 2 shards (--shard I/2), fixed by {here} (pid {pid}) "
            ) and shown.splitlines()[0].endswith("; held by 1 lease: a host of another layout is refused")
            with serve_process(homes[1], "1/2", model, fake, url) as other:  # the same layout: welcome
                wait_for_line(other, "serving pip on Discord as shard 1/2")
                answer_in(fake, ODD_A)
            assert fake.shards_connected == [(0, 2)]  # the refused hosts never connected
        free = layout_of(url)
        assert free is not None and (free["shards"], free["state"], free["held_by"]) == (2, "free", [])
        with serve_process(homes[1], None, model, fake, url) as unsharded:  # every host stopped: a new layout
            wait_for_line(unsharded, "serving pip on Discord")
            assert (layout_of(url) or {}).get("shards", 2) is None
            line = refused(homes[2], "1/3", model, fake, url)
            assert re.fullmatch(
                rf"Error: this database is served without shards: an `impyard serve` without --shard runs on "
                rf"{re.escape(here)} \(pid \d+\) and gets every server, so a host with --shard 1/3 would answer "
                r"messages a second time; to shard it, stop every `impyard serve` of this database \(`impyard "
                r"hosts` lists them\), then start each with --shard I/N",
                line,
            ), line
        with serve_process(homes[2], "2/3", model, fake, url) as third:
            wait_for_line(third, "serving pip on Discord as shard 2/3")
            answer_in(fake, EVEN_A)  # the even server is shard 2 of 3
            layout = layout_of(url)
            assert layout is not None and (layout["shards"], layout["state"]) == (3, "held")
            leases = json.loads(
                CliRunner().invoke(cli, ["hosts", "--json"], env={"IMPYARD_DATABASE_URL": url}).output
            )["leases"]
            assert [lease["name"] for lease in leases] == [
                "shard:2/3"
            ]  # the old layout's leases are forgotten


def test_two_homes_with_different_imp_files_are_refused_then_run_one_imp(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Issue 36, "one source of truth for imps", through real ``serve`` processes on one PostgreSQL: a home whose pip
    differs from the database's is refused at start in one line naming the way out; once the operator chose (``imp
    apply -f``), the running host picks the new revision up for its next boxes and the second host starts."""
    url = database_for("postgresql", tmp_path, request)
    a, b = tmp_path / "home-a", tmp_path / "home-b"
    with make_fake() as fake, FakeOpenAI() as model:
        model.script(envelope(answer="hi"))
        prepare_home(a, url)  # pip, published as revision 1
        (b / "imps" / "pip").mkdir(
            parents=True
        )  # home B's own pip, written by hand before it ever met the database
        (b / "imps" / "pip" / "imp.toml").write_text('name = "pip"\n\n[memory]\nenabled = false\n')
        (b / "imps" / "pip" / "persona.md").write_text("You are Pip of home B.")
        with serve_process(a, "0/2", model, fake, url, IMPYARD_IMP_SYNC_S="1") as log:
            wait_for_line(log, "serving pip on Discord as shard 0/2")
            line = refused(b, "1/2", model, fake, url)
            assert line.startswith("Error: imp pip: this home's files differ from the database's (the database has "
                                   "revision 1 by ") and f"impyard imp apply -f {b / 'imps' / 'pip' / 'imp.toml'}" in line  # fmt: skip
            assert (
                b / "imps" / "pip" / "persona.md"
            ).read_text() == "You are Pip of home B."  # nothing written over
            chose = CliRunner().invoke(
                cli, ["imp", "apply", "-f", str(b / "imps" / "pip" / "imp.toml")],
                env={"IMPYARD_HOME": str(b), "IMPYARD_DATABASE_URL": url},
            )  # fmt: skip
            assert chose.exit_code == 0 and "revision 2" in chose.output, chose.output
            wait_for_line(log, "imp pip: revision 2 applied")  # host A, without a restart
            answer_in(fake, EVEN_A)  # a new box of host A, with home B's settings
            with serve_process(b, "1/2", model, fake, url) as other:
                wait_for_line(other, "serving pip on Discord as shard 1/2")
                answer_in(fake, ODD_A)
    replies = [r.body for r in model.requests_for("/chat/completions") if r.purpose == "reply"]
    assert replies and all("You are Pip of home B." in json.dumps(body["messages"][0]) for body in replies)
