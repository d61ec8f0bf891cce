"""One host per process (issue 12): the assembly every entry point opens, and its one gate pump.

The two defects the redesign fixes, through the real assembly (``open_supervisor`` as ``impyard
supervise`` opens it): a standalone supervisor has no Discord, so it must neither "deliver" a Discord
post by printing it nor execute a Discord gate approved on the CLI — both wait for a host that has
Discord.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from click.testing import CliRunner

from impyard.cli import cli
from impyard.gateway.gates import Approver, Gate, GateStore
from impyard.gateway.surfaces import (
    SURFACE_DISCORD,
    SURFACE_LOG,
    SURFACE_TERMINAL,
    RecordingSurface,
    surface_of,
)
from impyard.gateway.trust import ChannelInfo
from impyard.imps.store import ImpStore
from impyard.supervisor import SupervisorSettings, open_supervisor
from impyard.tasks import TaskRequest
from testing.fake_openai import FakeOpenAI, envelope
from testing.inprocess import InProcessBackend

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True)]

DISCORD_CHANNEL = "100000000000000001"
FAST = SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0)


def held_post(gates: GateStore, channel_id: str, content: str) -> Gate:
    """A task's post into ``channel_id``, held by a gate (as the gateway opens it for an untrusted channel)."""
    return gates.open(
        imp="pip", run_id="r1", session_channel="task:pip", origin_guild=None, act="discord.send", target=channel_id,
        payload={"channel_id": channel_id, "content": content, "kind": "other"}, reason="held",
        deadline=timedelta(hours=1),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("channel_id", "recorded", "surface"),
    [
        ("100000000000000001", None, SURFACE_DISCORD),  # a snowflake nobody has seen yet
        ("100000000000000001", "discord", SURFACE_DISCORD),
        ("terminal:ann", None, SURFACE_TERMINAL),
        ("terminal:ann", "discord", SURFACE_TERMINAL),  # a host-side id says it, whatever was recorded
        ("task:pip", None, SURFACE_LOG),
        ("task:pip", "terminal", SURFACE_LOG),  # older homes recorded task logs as terminal channels
        ("some-other-channel", None, SURFACE_LOG),
        ("some-other-channel", "terminal", SURFACE_TERMINAL),
    ],
)
def test_which_surface_a_channel_lives_on(channel_id: str, recorded: str | None, surface: str) -> None:
    assert surface_of(channel_id, recorded) == surface


async def test_a_standalone_supervisor_leaves_a_discord_gate_approved_on_the_cli_for_a_discord_host(
    fake: FakeOpenAI,
) -> None:
    ImpStore().add("pip", "You are Pip.")
    surface = RecordingSurface()
    async with open_supervisor(surface=surface, settings=FAST, lock=False) as supervisor:
        gates = supervisor.gateway.gates
        gate = held_post(gates, DISCORD_CHANNEL, "for the guild")
        approved = CliRunner().invoke(cli, ["approvals", "approve", gate.id])
        assert approved.exit_code == 0, approved.output
        await supervisor.run(once=True)  # a tick: the gate pump runs
        assert await supervisor.pump.run_once() == []  # type: ignore[union-attr]
        assert surface.sent == [] and gates.get(gate.id).state == "approved"  # left for `impyard serve`


async def test_a_task_posting_to_discord_is_not_delivered_by_a_supervisor_without_discord(
    fake: FakeOpenAI,
) -> None:
    fake.script(envelope(answer="Daily summary: all quiet."), purpose="reply")
    ImpStore().add("pip", "You are Pip.")
    surface = RecordingSurface()
    backend = InProcessBackend()
    async with open_supervisor(
        surface=surface, settings=FAST, lock=False, backend_for=lambda imp: backend
    ) as supervisor:
        supervisor.gateway.channels.upsert(
            ChannelInfo(DISCORD_CHANNEL, kind="guild", name="daily", trusted=True)
        )
        task = supervisor.tasks.add(TaskRequest("pip", "Post the daily summary", channel_id=DISCORD_CHANNEL))
        await supervisor.run(once=True)
        done = supervisor.tasks.get(task.id)
        rows = [r for r in supervisor.gateway.audit.tail(20) if r.method == "discord.send"]
    assert surface.sent == []
    assert done.state == "failed" and "0 posts delivered" in (done.outcome or "")
    assert [r.verdict for r in rows] == ["unreachable"] and "impyard serve --supervise" in (
        rows[0].reason or ""
    )


async def test_a_standalone_supervisor_still_posts_to_its_task_log(fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Noted."), purpose="reply")
    ImpStore().add("pip", "You are Pip.")
    surface = RecordingSurface()
    backend = InProcessBackend()
    async with open_supervisor(
        surface=surface, settings=FAST, lock=False, backend_for=lambda imp: backend
    ) as supervisor:
        task = supervisor.tasks.add(TaskRequest("pip", "Note it in the log"))
        await supervisor.run(once=True)
        done = supervisor.tasks.get(task.id)
    assert [(s.channel_id, s.content) for s in surface.sent] == [("task:pip", "Noted.")]
    assert done.state == "done" and "1 post delivered" in (done.outcome or "")


async def test_an_operator_gate_decision_goes_through_the_same_pump_on_the_host_that_reaches_it(
    fake: FakeOpenAI,
) -> None:
    """The counterpart: the same gate, on a host that reaches its channel, is executed by one pump pass, once."""
    ImpStore().add("pip", "You are Pip.")
    surface = RecordingSurface()
    async with open_supervisor(surface=surface, settings=FAST, lock=False) as supervisor:
        gates = supervisor.gateway.gates
        gate = held_post(gates, "task:pip", "for the log")
        gates.decide(gate.id, Approver(kind="operator", id="root"), approve=True, owners=())
        pump = supervisor.pump
        assert pump is not None
        assert [moved.state for moved in await pump.run_once()] == ["executed"]
        assert await pump.run_once() == []
    assert [s.content for s in surface.sent] == ["for the log"]
