"""``impyard serve`` and ``impyard discord``: tokens, intents, command sync, lifecycle, Docker, --supervise.

The real discord.py client against the fake Discord; the CLI through CliRunner, or as a real process
(the signal test).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import anyio
import pexpect
import pytest
from click.testing import CliRunner

from box.context import split_context
from impyard import paths
from impyard.backends.docker import DockerBackend
from impyard.backends.plan import LABEL_CHANNEL
from impyard.cli import cli
from impyard.clock import SystemClock
from impyard.discord.client import DiscordSetupError
from impyard.discord.serve import open_discord_host, serve
from impyard.imps.store import ImpStore
from impyard.storage.db import open_database
from impyard.storage.instance import AlreadyRunning
from impyard.supervisor import SupervisorSettings
from impyard.tasks import TaskRequest, TaskStore
from testing.fake_openai import FakeOpenAI, envelope
from tests.discord_yard import (
    ALICE,
    GENERAL,
    GUILD,
    add_pip,
    make_fake,
    serving,
    settings_for,
    until,
)

IMPYARD = str(Path(sys.executable).parent / "impyard")


# ------------------------------------------------------------------ tokens and intents


@pytest.mark.anyio
async def test_a_missing_token_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI) -> None:
    add_pip()
    async with make_fake() as fake:
        with fake.patch_discord(), pytest.raises(DiscordSetupError) as refused:
            async with open_discord_host(["pip"], settings=settings_for(fake)):
                pytest.fail("served without a token")
    assert "imp pip has no Discord token (env IMPYARD_DISCORD_TOKEN_PIP is not set)" in str(refused.value)
    assert not fake.rest_calls and not fake.identifies  # nothing was tried


@pytest.mark.anyio
async def test_a_rejected_token_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI) -> None:
    add_pip()
    wrong = "not-the-token-at-all-7f3a"
    monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", wrong)
    async with make_fake() as fake:
        with fake.patch_discord(), pytest.raises(DiscordSetupError) as refused:
            async with open_discord_host(["pip"], settings=settings_for(fake)):
                pytest.fail("served with a wrong token")
    message = str(refused.value)
    assert "Discord rejected the token of imp pip (from env IMPYARD_DISCORD_TOKEN_PIP)" in message
    assert "Reset Token" in message and wrong not in message
    assert [c.status for c in fake.calls("GET", "/users/@me")] == [401] and not fake.identifies


def test_serve_on_the_cli_says_what_is_wrong_in_one_line(model: FakeOpenAI) -> None:
    add_pip()
    with make_fake() as fake:
        env = {"IMPYARD_DISCORD_API_BASE": fake.api_base, "IMPYARD_DISCORD_TOKEN_PIP": "wrong-token-123456"}
        rejected = CliRunner().invoke(cli, ["serve", "pip"], env=env)
        unknown = CliRunner().invoke(cli, ["serve", "nobody"], env=env)
        no_key = CliRunner().invoke(cli, ["serve", "pip"], env={**env, "OPENAI_API_KEY": ""})
        no_token = CliRunner().invoke(cli, ["serve"], env={"IMPYARD_DISCORD_API_BASE": fake.api_base})
    assert (
        rejected.exit_code == 1
        and rejected.output.count("\n") == 1
        and "rejected the token" in rejected.output
    )
    assert "wrong-token-123456" not in rejected.output
    assert unknown.exit_code == 1 and "nobody" in unknown.output and "Traceback" not in unknown.output
    assert no_key.exit_code == 1 and "OPENAI_API_KEY" in no_key.output
    assert (
        no_token.exit_code == 1
        and "no imp has a Discord token (pip: env IMPYARD_DISCORD_TOKEN_PIP)" in no_token.output
    )
    assert not fake.identifies


# ------------------------------------------------------------------ impyard discord


def test_discord_sync_registers_the_commands(model: FakeOpenAI) -> None:
    add_pip()
    with make_fake() as fake:
        env = {"IMPYARD_DISCORD_API_BASE": fake.api_base, "IMPYARD_DISCORD_TOKEN_PIP": fake.token}
        to_guild = CliRunner().invoke(cli, ["discord", "sync", "pip", "--guild", str(GUILD)], env=env)
        in_guild = fake.commands(GUILD)
        globally = CliRunner().invoke(cli, ["discord", "sync"], env=env)
        bad = CliRunner().invoke(cli, ["discord", "sync", "--guild", "the-yard"], env=env)
    assert to_guild.exit_code == 0, to_guild.output
    assert to_guild.output == f"pip: synced /forget-me, /channel, /approvals to server {GUILD}\n"
    assert [c["name"] for c in in_guild] == ["forget-me", "channel", "approvals"]
    channel = next(c for c in in_guild if c["name"] == "channel")
    assert [o["name"] for o in channel["options"]] == ["mode", "trust", "untrust", "show"]
    approvals = next(c for c in in_guild if c["name"] == "approvals")
    assert [o["name"] for o in approvals["options"]] == ["list", "approve", "deny"]
    assert globally.exit_code == 0 and [c["name"] for c in fake.commands()] == [
        "forget-me",
        "channel",
        "approvals",
    ]
    assert bad.exit_code == 1 and "server id" in bad.output


def test_discord_invite_prints_the_link_with_scopes_and_permissions(model: FakeOpenAI) -> None:
    add_pip()
    ImpStore().add("pix", "You are Pix.", discord={"application_id": "3001"})
    with make_fake() as fake:
        env = {"IMPYARD_DISCORD_API_BASE": fake.api_base, "IMPYARD_DISCORD_TOKEN_PIP": fake.token}
        result = CliRunner().invoke(cli, ["discord", "invite"], env=env)
    assert result.exit_code == 0, result.output
    pip_line, pix_line = sorted(result.output.splitlines())
    assert pip_line.startswith(
        f"pip: https://discord.com/oauth2/authorize?client_id={fake.application_id}"
    )  # asked Discord
    assert pix_line.startswith(
        "pix: https://discord.com/oauth2/authorize?client_id=3001"
    )  # from imp.toml, no login
    assert "scope=bot+applications.commands" in pip_line
    permissions = int(pip_line.split("permissions=")[1].split("&")[0])
    assert permissions == (1 << 10) | (1 << 11) | (1 << 38) | (1 << 16) | (1 << 15) | (1 << 31)


# ------------------------------------------------------------------ lifecycle


@pytest.mark.anyio
async def test_serve_runs_until_stopped_and_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    from impyard.backends.process import ProcessBackend

    model.script(envelope(answer="hello there"))
    add_pip()
    stop = anyio.Event()
    async with make_fake() as fake:
        monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", fake.token)
        with fake.patch_discord():
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: serve(["pip"], stop=stop, handle_signals=False, settings=settings_for(fake),
                                            backends={"pip": ProcessBackend(warn=False)}))  # fmt: skip
                await fake.wait_for(lambda: fake.sessions_connected == 1)
                with pytest.raises(AlreadyRunning):  # one host per IMPYARD_HOME
                    async with open_discord_host(["pip"], settings=settings_for(fake)):
                        pass
                trusted = CliRunner().invoke(
                    cli, ["channel", "trust", str(GENERAL)]
                )  # the CLI, while serve runs
                assert trusted.exit_code == 0
                asked = fake.post_message(GENERAL, ALICE, "hi")
                await fake.wait_for(lambda: fake.messages(GENERAL), timeout=20)
                stop.set()
            assert fake.sessions_connected == 0
    assert [m.content for m in fake.messages(GENERAL)] == ["hello there"]
    assert asked.id


def test_sigterm_stops_serve_cleanly(model: FakeOpenAI, impyard_home: Path) -> None:
    model.script(envelope(answer="hello from the process"))
    add_pip()
    CliRunner().invoke(cli, ["channel", "trust", str(GENERAL)])
    with make_fake() as fake:
        env = {
            **os.environ, "IMPYARD_HOME": str(impyard_home), "OPENAI_API_KEY": model.api_key, "OPENAI_BASE_URL": model.base_url,
            "IMPYARD_DISCORD_TOKEN_PIP": fake.token, "IMPYARD_DISCORD_API_BASE": fake.api_base,
            "IMPYARD_DISCORD_GUILD_READY_TIMEOUT": "0.05",
        }  # fmt: skip
        child = pexpect.spawn(
            IMPYARD, ["serve", "pip", "--backend", "process"], env=env, encoding="utf-8", timeout=30
        )
        try:
            child.expect("serving pip on Discord")
            fake.post_message(GENERAL, ALICE, "hello")
            child.expect("posted imp=pip channel=1001")
            box_pids = _children(child.pid)
            child.kill(signal.SIGTERM)
            child.expect("stopped")
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
        assert child.exitstatus == 0, child.before
        assert fake.wait_for_sync(lambda: fake.sessions_connected == 0)
    assert [m.content for m in fake.messages(GENERAL)] == ["hello from the process"]
    assert box_pids and not [
        pid for pid in box_pids if Path(f"/proc/{pid}").exists()
    ]  # the warm box went too
    assert fake.token not in (child.before or "")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.anyio
async def test_the_plain_reply_path_with_the_docker_backend(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, docker_backend: DockerBackend
) -> None:
    async with serving(monkeypatch, model, backend=docker_backend) as yard:
        asked = yard.fake.post_message(GENERAL, ALICE, "hello from docker")
        (reply,) = await yard.posted(GENERAL)
        await yard.answered(asked.id)
        served = [box for box in docker_backend.labelled() if box.labels.get(LABEL_CHANNEL)]  # not a spare
        assert len(served) == 1  # the warm box, locked down, serves the channel
    assert reply.content == "hello there" and reply.reference_id == asked.id
    assert DockerBackend(home_id=paths.home_id()).labelled() == []


@pytest.mark.anyio
async def test_supervise_posts_tasks_through_the_bots_and_the_task_log_to_the_log(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "impyard.posts")
    fast = SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0)
    async with serving(
        monkeypatch, model, supervise=True, supervisor_settings=fast, pip={"box": {"backend": "process"}}
    ) as yard:
        tasks = TaskStore(open_database(), SystemClock(), ImpStore())
        tasks.add(TaskRequest("pip", "Post the daily summary", channel_id=str(GENERAL)))
        tasks.add(TaskRequest("pip", "Note it in the log"))  # task:pip, the imp's task log on the host
        (posted,) = await yard.posted(GENERAL)
        await until(lambda: any("[task:pip] pip" in r.getMessage() for r in caplog.records))
    assert posted.content == "hello there" and posted.author_id == yard.fake.bot_user.id
    assert not [c for c in yard.fake.rest_calls if "task" in c.path]


# ------------------------------------------------------------------ the walkthrough (docs/discord.md)


def test_the_walkthrough_in_the_readme(model: FakeOpenAI, impyard_home: Path) -> None:
    """Every step of the Discord walkthrough (docs/discord.md), against the fake Discord: CLI steps, then serve."""
    from impyard.backends.process import ProcessBackend
    from tests.discord_yard import OLIVE, OWNERS, QUIET

    doc = (Path(__file__).parent.parent / "docs" / "discord.md").read_text()
    model.script(envelope(answer="Hi, I'm Pip!"))
    runner = CliRunner()
    with make_fake() as fake:
        env = {"IMPYARD_DISCORD_API_BASE": fake.api_base}
        # 2. An imp, its owner, and its token in a file (chmod 600); the owners' channel in imp.toml.
        step = runner.invoke(
            cli, ["imp", "add", "pip", "--persona", "You are Pip.", "--owner", f"discord:{OLIVE.id}"]
        )
        assert step.exit_code == 0, step.output
        directory = impyard_home / "imps" / "pip"
        token_file = directory / "discord.token"
        token_file.write_text(fake.token + "\n")
        token_file.chmod(0o600)
        toml = (directory / "imp.toml").read_text()
        toml = toml.replace(
            '# token_file = "discord.token"  # an example; unset by default', 'token_file = "discord.token"'
        )
        toml = toml.replace(
            '# owner_channel = "123456789012345678"  # an example; unset by default',
            f'owner_channel = "{OWNERS}"',
        )
        (directory / "imp.toml").write_text(toml)
        shown = runner.invoke(cli, ["imp", "show", "pip"])
        assert shown.exit_code == 0 and "discord.token" in shown.output and fake.token not in shown.output
        # 3. The invite link.
        invite = runner.invoke(cli, ["discord", "invite", "pip"], env=env)
        assert invite.exit_code == 0 and "scope=bot+applications.commands" in invite.output
        # 4. The slash commands.
        synced = runner.invoke(cli, ["discord", "sync", "pip", "--guild", str(GUILD)], env=env)
        assert synced.exit_code == 0 and "/forget-me, /channel, /approvals" in synced.output
        # 5. Trust a channel, set another's mode.
        assert runner.invoke(cli, ["channel", "trust", str(GENERAL)]).exit_code == 0
        assert runner.invoke(cli, ["channel", "trust", str(QUIET)]).exit_code == 0
        assert runner.invoke(cli, ["channel", "mode", str(QUIET), "mention"]).exit_code == 0
        for command in ("impyard discord invite pip", "impyard discord sync pip --guild", "impyard channel trust",
                        "impyard channel mode", "impyard serve", "token_file", "owner_channel", "Message Content Intent"):  # fmt: skip
            assert command in doc, f"the Discord walkthrough (docs/discord.md) lost the step {command!r}"

        # 6. impyard serve (in-process; the CLI would run exactly this).
        async def main() -> None:
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: serve(["pip"], stop=stop, handle_signals=False, settings=settings_for(fake),
                                            backends={"pip": ProcessBackend(warn=False)}))  # fmt: skip
                await fake.wait_for(lambda: fake.sessions_connected == 1)
                fake.post_message(GENERAL, ALICE, "hello pip")
                await fake.wait_for(lambda: fake.messages(GENERAL), timeout=20)
                fake.post_message(QUIET, ALICE, "ambient chatter")
                fake.post_message(QUIET, ALICE, f"{fake.bot_user.mention} are you there?")
                await fake.wait_for(lambda: fake.messages(QUIET), timeout=20)
                stop.set()

        with fake.patch_discord():
            anyio.run(main)
        fake.wait_for_sync(lambda: fake.sessions_connected == 0)
    assert [m.content for m in fake.messages(GENERAL)] == ["Hi, I'm Pip!"]
    assert [m.content for m in fake.messages(QUIET)] == [
        "Hi, I'm Pip!"
    ]  # the mention only; the chatter woke nobody
    woken = {
        split_context(r.body["messages"][-1]["content"])[1]
        for r in model.requests_for("/chat/completions")
        if r.purpose == "reply"
    }
    assert len(woken) == 2 and not any(
        c.endswith("ambient chatter") for c in woken
    )  # the memory's calls aside


@pytest.mark.anyio
async def test_two_imps_each_post_as_their_own_bot_and_never_answer_each_other(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    import re

    from testing.inprocess import InProcessBackend
    from tests.discord_yard import PIX, QUIET

    caplog.set_level(logging.DEBUG, "impyard.serve")

    def handled(imp: str, message_id: int) -> str | None:
        """What ``imp``'s inbound worker made of a message: "skipped", a route outcome, or None (not yet)."""
        for record in caplog.records:
            text = record.getMessage()
            if text.startswith(f"imp {imp}: message {message_id} skipped"):
                return "skipped"
            found = re.match(rf"inbound imp={imp} .*message={message_id} .*outcome=(\w+)", text)
            if found:
                return found.group(1)
        return None

    model.script(envelope(answer="hello there"))
    add_pip()
    ImpStore().add("pix", "You are Pix.")
    async with make_fake(other_bots=[PIX]) as fake:
        monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", fake.token)
        monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIX", PIX.token)
        with fake.patch_discord():
            backend = InProcessBackend()
            async with open_discord_host(
                settings=settings_for(fake), backends={"pip": backend, "pix": backend}
            ) as host:
                rt = host.runtime
                for channel in (GENERAL, QUIET):
                    rt.channels.set_trusted(str(channel), True)
                rt.channels.set_mode(str(QUIET), "mention")
                asked = fake.post_message(GENERAL, ALICE, "hello, both of you")
                await fake.wait_for(lambda: len(fake.messages(GENERAL)) == 2, timeout=20)
                with anyio.fail_after(20):
                    await rt.conversations.wait_finished(str(asked.id))
                mention = fake.post_message(QUIET, ALICE, f"{PIX.user.mention} just you")
                await fake.wait_for(lambda: fake.messages(QUIET), timeout=20)
                with anyio.fail_after(20):
                    await rt.conversations.wait_finished(str(mention.id))
                # Each imp's inbound worker takes the other's post; had it woken the imp, that turn is awaited
                # too, so a loop shows as a third post instead of hiding behind a sleep.
                posts = {m.bot_user_id: m for m in fake.messages(GENERAL)}
                for imp, other in (("pip", PIX.user.id), ("pix", fake.bot_user.id)):
                    outcome = await until(lambda imp=imp, other=other: handled(imp, posts[other].id))
                    if outcome in ("started", "queued"):
                        with anyio.fail_after(20):
                            await rt.conversations.wait_finished(str(posts[other].id))
                history = rt.history.recent(str(GENERAL), imp="pix")
    assert sorted(m.bot_user_id for m in fake.messages(GENERAL)) == sorted([fake.bot_user.id, PIX.user.id])
    assert [m.bot_user_id for m in fake.messages(QUIET)] == [PIX.user.id]
    assert len(fake.messages(GENERAL)) == 2  # neither answered the other's post
    assert sorted((e.author.id, e.from_imp) for e in history if e.author.bot) == sorted(
        [(str(fake.bot_user.id), False), (str(PIX.user.id), True)]
    )


@pytest.mark.anyio
async def test_a_bot_losing_its_gateway_for_good_stops_serve_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    from impyard.backends.process import ProcessBackend

    add_pip()
    async with make_fake() as fake:
        monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", fake.token)
        with fake.patch_discord(), pytest.raises(BaseExceptionGroup) as stopped:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: serve(["pip"], handle_signals=False, settings=settings_for(fake),
                                            backends={"pip": ProcessBackend(warn=False)}))  # fmt: skip
                await fake.wait_for(lambda: fake.sessions_connected == 1)
                fake.drop_connection(4004)  # "authentication failed": discord.py does not reconnect
        assert fake.sessions_connected == 0
    (error,) = stopped.value.exceptions  # serve itself raised the one error, unwrapped
    assert isinstance(error, DiscordSetupError)
    assert (
        str(error)
        == "imp pip: the Discord gateway connection failed: Shard ID None WebSocket closed with 4004"
    )
