"""Nothing lost while a shard had no host (issue 36): at start a ``serve`` host reads back, from Discord's message
history, what was sent in its shard's channels after the last message it kept, and takes it as arriving now.

Real parts: discord.py against the loopback fake Discord (whose history keeps every message posted, served by GET
/channels/{id}/messages), the in-process box, the pipeline, SQLite under the test's home; the takeover test runs real
``impyard serve`` processes (``kill -9`` of the shard's holder) on one shared SQLite file or PostgreSQL database.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC
from pathlib import Path
from typing import Any

import discord
import pytest

from impyard.discord.replay import ReplayBounds, ReplayBoundsError
from impyard.discord.serve import open_discord_host
from impyard.discord.shards import Shard
from impyard.failure_words import missed_line
from testing.fake_discord import FakeDiscord, FakeUser
from testing.fake_openai import FakeOpenAI, envelope
from testing.inprocess import InProcessBackend
from tests.discord_yard import (
    ALICE,
    BOB,
    CAROL,
    DM,
    GENERAL,
    GUILD,
    THREAD,
    Yard,
    add_pip,
    make_fake,
    settings_for,
    until,
)

ROBOT = FakeUser(4_001, "robot", bot=True)  # another bot: its messages are read, never replayed


class Clock:
    """The fake Discord's time (its snowflakes carry it): set back to post a message that is old by now."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


@asynccontextmanager
async def host_on(fake: FakeDiscord, model: FakeOpenAI, **options: Any) -> AsyncIterator[Yard]:
    """One ``serve`` host of pip on ``fake`` (its home: the test's), until the block ends."""
    async with open_discord_host(
        ["pip"],
        settings=settings_for(fake),
        backends={"pip": InProcessBackend()},
        ready_timeout_s=10,
        **options,
    ) as host:
        for channel in (GENERAL, THREAD):
            host.runtime.channels.set_trusted(str(channel), True)
        yield Yard(fake, model, host)


def replay_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("replay imp=pip ")]


async def replayed(caplog: pytest.LogCaptureFixture, starts: int) -> str:
    """The replay line of the ``starts``-th start of a host in this test (it comes once the replay is done)."""
    await until(lambda: len(replay_lines(caplog)) >= starts)
    return replay_lines(caplog)[starts - 1]


def history_reads(fake: FakeDiscord, channel: int) -> int:
    return len(fake.calls("GET", f"/channels/{channel}/messages"))


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI) -> Any:
    model.script(envelope(answer="hello there", answer_needed=True))
    add_pip()

    @asynccontextmanager
    async def fake_discord(offset_s: float = 0.0) -> AsyncIterator[tuple[FakeDiscord, Clock]]:
        """The fake Discord, its clock ``offset_s`` from now (its ids only grow: set back from the start)."""
        clock = Clock()
        clock.offset_s = offset_s
        async with make_fake(clock=clock) as fake:
            monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", fake.token)
            with fake.patch_discord():
                yield fake, clock

    return fake_discord


@pytest.mark.anyio
async def test_messages_sent_while_no_host_served_are_answered_once_or_told_missed(
    served: Any, model: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "impyard")
    async with served(offset_s=-600.0) as (fake, clock):  # ten minutes ago, until the stale one is posted
        pip = f"<@{fake.bot_user.id}>"
        async with host_on(fake, model) as yard:
            assert await replayed(caplog, 1) == (
                "replay imp=pip channels=0 replayed=0 outcomes: none; not replayed: 0 over the bound of 50 a channel "
                "(in 0 channels), 0 channels past the total bound of 500, 0 channels unreadable; 0 bot or system "
                "messages"
            )  # a fresh home knows no channel: nothing to compare with, nothing read
            first = fake.post_message(GENERAL, ALICE, f"{pip} hi")
            await yard.answered(first.id)
            psst = fake.post_message(DM, CAROL, "psst")
            await yard.answered(psst.id)
            await until(lambda: len(fake.messages(DM)) == 1)
        asked_before = len(model.requests)
        assert asked_before == 2
        # No host: Discord keeps what is sent; nobody is connected to be told.
        stale = fake.post_message(GENERAL, BOB, f"{pip} anyone?")
        clock.offset_s = 0.0
        fresh = fake.post_message(GENERAL, ALICE, f"{pip} are you there?")
        fake.post_message(GENERAL, ROBOT, f"{pip} beep")
        later = fake.post_message(DM, CAROL, "still there?")
        async with host_on(fake, model) as yard:
            await yard.answered(fresh.id)
            await yard.answered(later.id)
            line = await replayed(caplog, 2)
            await until(lambda: len(fake.messages(GENERAL)) >= 3)
            history = yard.rt.history
            assert history.outcome("pip", str(GENERAL), str(stale.id)) == "missed"
            assert history.outcome("pip", str(GENERAL), str(fresh.id)) == "sent"
        assert line == (
            "replay imp=pip channels=2 replayed=3 outcomes: missed=1 started=2; not replayed: 0 over the bound of 50 a "
            "channel (in 0 channels), 0 channels past the total bound of 500, 0 channels unreadable; 1 bot or system "
            "messages"
        )
        said = [(m.reference_id, m.content) for m in fake.messages(GENERAL)]
        when = discord.utils.snowflake_time(stale.id).astimezone(UTC)
        assert said[0] == (first.id, "hello there")
        assert sorted(said[1:], key=lambda s: s[0] is None) == [
            (fresh.id, "hello there"),
            (None, missed_line([when], "bob")),
        ]  # the fresh one answered, the stale one told once, the robot never
        assert [(m.reference_id, m.content) for m in fake.messages(DM)][1:] == [(later.id, "hello there")]
        assert len(model.requests) == asked_before + 2
        # A third start finds nothing new: nothing is answered or told twice.
        async with host_on(fake, model):
            third = await replayed(caplog, 3)
        assert third.startswith("replay imp=pip channels=2 replayed=0 outcomes: none;")
        assert len(fake.messages(GENERAL)) == 3 and len(fake.messages(DM)) == 2
        assert len(model.requests) == asked_before + 2
    logged = caplog.text
    assert "anyone?" not in logged and "are you there" not in logged and "still there" not in logged
    assert f"replayed imp=pip channel={GENERAL} message={stale.id} kind=guild outcome=missed" in logged


@pytest.mark.anyio
async def test_only_the_newest_messages_within_the_bounds_are_replayed_and_the_rest_counted(
    served: Any, model: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """Two per channel, three in all: the general channel (the most recently active) gives its newest two of five;
    the thread, one of its two (the total is spent); what was left is counted in the line, never answered."""
    caplog.set_level(logging.INFO, "impyard")
    async with served() as (fake, _clock):
        async with host_on(fake, model) as yard:
            for channel in (THREAD, GENERAL):  # the general channel last: the most recently active
                asked = fake.post_message(channel, ALICE, "hi pip")
                await yard.answered(asked.id)
            await until(lambda: len(fake.messages(GENERAL)) == 1)
        general = [fake.post_message(GENERAL, ALICE, f"general {n}") for n in range(5)]
        thread = [fake.post_message(THREAD, BOB, f"thread {n}") for n in range(2)]
        async with host_on(fake, model, replay=ReplayBounds(per_channel=2, total=3)) as yard:
            line = await replayed(caplog, 2)
            history = yard.rt.history
            kept = {
                m.id
                for channel, messages in ((GENERAL, general), (THREAD, thread))
                for m in messages
                if history.get(str(channel), str(m.id)) is not None
            }
            for answered in (general[4], thread[1]):  # their turns end before the host stops
                await yard.answered(answered.id)
        assert line == (
            "replay imp=pip channels=2 replayed=3 outcomes: queued=1 started=2; not replayed: 4 over the bound of 2 a "
            "channel (in 2 channels), 0 channels past the total bound of 3, 0 channels unreadable; 0 bot or system "
            "messages"
        )
        assert kept == {general[3].id, general[4].id, thread[1].id}
        # The per-channel read is one request within Discord's limits (the fake refuses a limit above 100).
        assert all(
            1 <= int(call.query["limit"]) <= 100
            for call in fake.calls("GET", "/channels/*/messages")
            if "limit" in call.query
        )
        again = [fake.post_message(channel, ALICE, "again") for channel in (GENERAL, THREAD)]
        async with host_on(fake, model, replay=ReplayBounds(per_channel=2, total=1)) as yard:
            line = await replayed(caplog, 3)
            kept = {m.id for m in again if yard.rt.history.get(str(m.channel_id), str(m.id)) is not None}
        assert line.startswith("replay imp=pip channels=1 replayed=1 outcomes: started=1;")
        assert ", 1 channels past the total bound of 1," in line
        assert len(kept) == 1  # the channel most recently active; the other is not read at all


@pytest.mark.anyio
async def test_a_host_reads_only_its_own_shards_channels(
    served: Any, model: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """The yard's server is shard 0's of 2, and DMs are shard 0's: a host of shard 1/2 reads neither back (even when
    a misrouting gateway hands its bot the server); the next host of shard 0/2 does, and answers."""
    caplog.set_level(logging.INFO, "impyard")
    async with served() as (fake, _clock):
        async with host_on(fake, model, shard=Shard(0, 2)) as yard:
            asked = fake.post_message(GENERAL, ALICE, "hi pip")
            await yard.answered(asked.id)
            psst = fake.post_message(DM, CAROL, "psst")
            await yard.answered(psst.id)
            await until(lambda: len(fake.messages(DM)) == 1)
        missed = fake.post_message(GENERAL, ALICE, "hi again pip")
        missed_dm = fake.post_message(DM, CAROL, "psst again")
        reads = history_reads(fake, GENERAL), history_reads(fake, DM)
        fake.broadcast_to_every_shard()  # even a gateway that hands shard 1 the server does not make it shard 1's
        async with host_on(fake, model, shard=Shard(1, 2)) as yard:
            line = await replayed(caplog, 2)
            assert (
                yard.host.clients["pip"].get_guild(GUILD) is not None
            )  # known to its bot: not read all the same
        fake.broadcast_to_every_shard(False)
        assert line.startswith("replay imp=pip channels=0 replayed=0 ")
        assert (history_reads(fake, GENERAL), history_reads(fake, DM)) == reads  # not read, not answered
        assert len(fake.messages(GENERAL)) == 1
        async with host_on(fake, model, shard=Shard(0, 2)) as yard:
            await yard.answered(missed.id)
            await yard.answered(missed_dm.id)
            line = await replayed(caplog, 3)
        assert line.startswith("replay imp=pip channels=2 replayed=2 outcomes: started=2;")
        assert history_reads(fake, GENERAL) > reads[0] and history_reads(fake, DM) > reads[1]


def test_the_bounds_are_read_from_the_environment_and_refused_in_one_line() -> None:
    assert ReplayBounds.from_env({}) == ReplayBounds(50, 500)
    assert ReplayBounds.from_env({"IMPYARD_REPLAY_PER_CHANNEL": "0"}).off
    assert ReplayBounds.from_env({"IMPYARD_REPLAY_PER_CHANNEL": "7", "IMPYARD_REPLAY_TOTAL": "70"}) == (
        ReplayBounds(7, 70)
    )
    for name, value in (("IMPYARD_REPLAY_PER_CHANNEL", "lots"), ("IMPYARD_REPLAY_TOTAL", "10001")):
        with pytest.raises(ReplayBoundsError) as refused:
            ReplayBounds.from_env({name: value})
        assert str(refused.value).startswith(f"{name} must be a whole number of messages from 0 to ")


@pytest.mark.anyio
async def test_the_fake_discord_refuses_a_history_limit_discord_refuses() -> None:
    import aiohttp

    async with make_fake() as fake:
        headers = {"Authorization": f"Bot {fake.token}"}
        async with aiohttp.ClientSession() as http:
            for limit, status in (("100", 200), ("1", 200), ("0", 400), ("101", 400), ("x", 400)):
                url = f"{fake.api_base}/channels/{GENERAL}/messages?limit={limit}"
                async with http.get(url, headers=headers) as answer:
                    assert answer.status == status, (limit, await answer.text())
                    if status == 400:
                        assert (await answer.json())["code"] == 50035
            async with http.get(
                f"{fake.api_base}/channels/{GENERAL}/messages?after=abc", headers=headers
            ) as answer:
                assert answer.status == 400


# ------------------------------------------------------------------ a takeover after kill -9


@pytest.mark.parametrize("database", ["shared", "postgresql"])
def test_a_takeover_after_kill_9_replays_what_arrived_in_between(
    tmp_path: Path, database: str, request: pytest.FixtureRequest
) -> None:
    """Shard 0/2's holder is killed (``kill -9``); a message arrives while no host holds the shard; the host of
    another home that takes the shard over (one shared database) reads it back and answers it, once."""
    from tests.test_discord_shards import (
        ALICE as MEMBER,
    )
    from tests.test_discord_shards import (
        EVEN_A,
        IMPYARD,
        START_S,
        database_for,
        prepare_home,
        serve_env,
        serve_process,
        wait_for_line,
        wakes_of,
    )
    from tests.test_discord_shards import make_fake as make_sharded_fake

    url = database_for(database, tmp_path, request)
    with make_sharded_fake() as fake, FakeOpenAI() as model0, FakeOpenAI() as model1:
        model0.script(envelope(answer="from the killed host"))
        model1.script(envelope(answer="from the next holder"))
        prepare_home(tmp_path / "home0", url)
        (tmp_path / "home1").mkdir()  # its imp and the channels' trust come from the one database
        log0 = tmp_path / "killed.log"
        with log0.open("w") as out:
            killed = subprocess.Popen(
                [IMPYARD, "serve", "pip", "--backend", "process", "--shard", "0/2"],
                env=serve_env(tmp_path / "home0", model0, fake, url), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            wait_for_line(log0, "serving pip on Discord as shard 0/2")
            first = fake.post_message(EVEN_A, MEMBER, "hello pip").id
            fake.wait_for_sync(
                lambda: any(m.reference_id == first for m in fake.messages(EVEN_A)), timeout=START_S
            )
            killed.kill()  # SIGKILL: no goodbye
            killed.wait(timeout=START_S)
        finally:
            if killed.poll() is None:
                killed.kill()
                killed.wait()
        between = fake.post_message(EVEN_A, MEMBER, "anyone there?").id  # no host holds shard 0/2
        with serve_process(tmp_path / "home1", "0/2", model1, fake, url) as log1:
            wait_for_line(log1, "serving pip on Discord as shard 0/2")
            fake.wait_for_sync(
                lambda: any(m.reference_id == between for m in fake.messages(EVEN_A)), timeout=START_S
            )
            wait_for_line(log1, "replay imp=pip channels=1 replayed=1 outcomes: ")
        said = [(m.reference_id, m.content) for m in fake.messages(EVEN_A)]
        assert said == [(first, "from the killed host"), (between, "from the next holder")], log1.read_text()
        logged = log1.read_text()
        assert re.search(r"replay imp=pip channels=1 replayed=1 outcomes: (queued|started)=1;", logged), (
            logged
        )
        assert re.search(
            rf"replayed imp=pip channel={EVEN_A} message={between} kind=guild outcome=(queued|started)\n",
            logged,
        )
    assert wakes_of(url) == sorted([(str(first), "sent"), (str(between), "sent")])


def test_serve_refuses_a_bound_out_of_range_in_one_line_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from impyard.cli import cli

    add_pip()
    monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", "pip-token-0123456789")
    monkeypatch.setenv("IMPYARD_DISCORD_API_BASE", "http://127.0.0.1:9/api/v10")  # never reached
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-never-used")
    monkeypatch.setenv("IMPYARD_REPLAY_PER_CHANNEL", "lots")
    result = CliRunner().invoke(cli, ["serve", "pip"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: IMPYARD_REPLAY_PER_CHANNEL must be a whole number of messages from 0 to 1000 (got 'lots')"
    ], result.output
