"""Approval gates: durable, frozen, deadlines on a fixed clock, the approver policy, exactly-once
execution under concurrency, and earned trust (design.md §5, §12)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from box.protocol.models import DiscordSendParams, DiscordSendResult
from impyard.backends import BoxSpec
from impyard.broker import UpstreamConfig
from impyard.clock import FixedClock
from impyard.db import Database, open_database
from impyard.gates import Approver, GateError
from impyard.gateway import Gateway
from impyard.policy import Policy, build_policy, default_policy_path, load_policy
from impyard.surfaces import RecordingSurface
from impyard.trust import ChannelInfo, DbChannelTrust

pytestmark = pytest.mark.anyio

OPERATOR = Approver("operator", "root")
OWNER = Approver("user", "owner-1")
STRANGER = Approver("user", "stranger")
GUILD_ADMIN = Approver("user", "admin-7", is_guild_admin=True, guild_id="g1")
OTHER_GUILD_ADMIN = Approver("user", "admin-8", is_guild_admin=True, guild_id="g2")


@dataclass
class Setup:
    gateway: Gateway
    db: Database
    clock: FixedClock
    surface: RecordingSurface
    spec: BoxSpec

    async def gated_send(self, content: str = "hello", target: str = "guild-chat") -> str:
        result = await self.gateway.serve(self.spec, "discord.send", DiscordSendParams(channel_id=target, content=content))
        assert isinstance(result, DiscordSendResult) and result.status == "pending" and result.gate_id
        return result.gate_id

    def transitions(self, gate_id: str) -> list[str]:
        rows = self.db.query("SELECT verdict FROM audit WHERE method = 'gate' AND gate_id = ? ORDER BY id", (gate_id,))
        return [row[0] for row in rows]


def make_setup(tmp_path: Path, policy: Policy | None = None) -> Setup:
    db = open_database(tmp_path / "impyard.db")
    clock = FixedClock(datetime(2026, 6, 1, 9, 0, tzinfo=UTC))
    surface = RecordingSurface()
    gateway = Gateway(
        policy=policy or load_policy(), db=db, surface=surface, clock=clock,
        upstream=UpstreamConfig(api_key=None), owners={"pip": ["owner-1"]}, secrets=[],
    )  # fmt: skip
    DbChannelTrust(db, clock).upsert(ChannelInfo("guild-chat", kind="guild", trusted=False, guild_id="g1"))
    return Setup(gateway, db, clock, surface, BoxSpec("pip", "guild-chat", tmp_path / "state", run_id="run-9"))


@pytest.fixture
async def s(tmp_path: Path) -> AsyncIterator[Setup]:
    setup = make_setup(tmp_path)
    yield setup
    setup.db.close()


async def test_a_gate_is_durable_and_frozen(s: Setup, tmp_path: Path) -> None:
    gate_id = await s.gated_send("the exact words")
    reopened = open_database(tmp_path / "impyard.db")  # another process (the CLI) sees the same gate
    from impyard.audit import AuditLog
    from impyard.gates import GateStore

    gate = GateStore(reopened, s.clock, AuditLog(reopened, s.clock, [])).get(gate_id)
    assert gate.state == "pending" and gate.payload["content"] == "the exact words"
    assert gate.deadline - gate.created_at == timedelta(hours=24)
    assert (gate.imp, gate.run_id, gate.session_channel, gate.origin_guild) == ("pip", "run-9", "guild-chat", "g1")
    reopened.close()


async def test_an_operator_approval_executes_the_frozen_payload_once(s: Setup) -> None:
    gate_id = await s.gated_send("approved words")
    gate = await s.gateway.decide(gate_id, OPERATOR, approve=True, note="ok")
    assert gate.state == "executed" and gate.message_ids == ["rec-1"] and gate.decided_by == "operator:root"
    assert [m.content for m in s.surface.sent] == ["approved words"]
    assert s.transitions(gate_id) == ["approved", "executing", "executed"]
    again = await s.gateway.execute(gate_id)  # executing again does nothing
    assert again.state == "executed" and len(s.surface.sent) == 1


@pytest.mark.parametrize(
    ("approver", "allowed"),
    [(OWNER, True), (GUILD_ADMIN, True), (STRANGER, False), (OTHER_GUILD_ADMIN, False)],
    ids=["owner", "admin-of-origin-guild", "stranger", "admin-of-another-guild"],
)
async def test_only_approvers_with_authority_can_decide(s: Setup, approver: Approver, allowed: bool) -> None:
    gate_id = await s.gated_send()
    if allowed:
        assert (await s.gateway.decide(gate_id, approver, approve=True)).state == "executed"
        return
    with pytest.raises(GateError) as caught:
        await s.gateway.decide(gate_id, approver, approve=True)
    assert caught.value.kind == "not_authorised" and "may not decide" in str(caught.value)
    assert s.gateway.gates.get(gate_id).state == "pending" and s.surface.sent == [] and s.transitions(gate_id) == []


async def test_in_a_dm_only_owners_and_the_operator_may_decide(s: Setup) -> None:
    DbChannelTrust(s.db, s.clock).upsert(ChannelInfo("dm-5", kind="dm"))
    s.gateway.policy = build_policy(
        [("ops.toml", '[[rules]]\nname = "x"\nmethod = "discord.send"\naction = "allow"\nchannels = ["elsewhere"]\n'),
         (str(default_policy_path()), default_policy_path().read_text())]
    )  # fmt: skip
    s.spec = BoxSpec("pip", "dm-5", s.spec.state_dir)
    gate_id = await s.gated_send(target="elsewhere")
    admin_in_dm = Approver("user", "admin-7", is_guild_admin=True, guild_id=None)
    for approver in (STRANGER, admin_in_dm, GUILD_ADMIN):
        with pytest.raises(GateError, match="may not decide"):
            await s.gateway.decide(gate_id, approver, approve=True)
    assert (await s.gateway.decide(gate_id, OWNER, approve=True)).state == "executed"


async def test_a_denied_gate_never_executes(s: Setup) -> None:
    gate_id = await s.gated_send()
    gate = await s.gateway.decide(gate_id, OWNER, approve=False, note="no")
    assert gate.state == "denied" and gate.decision_note == "no"
    assert (await s.gateway.execute(gate_id)).state == "denied" and s.surface.sent == []
    with pytest.raises(GateError, match="already denied"):
        await s.gateway.decide(gate_id, OPERATOR, approve=True)


async def test_concurrent_approvals_in_threads_have_exactly_one_winner(s: Setup) -> None:
    gate_id = await s.gated_send()
    barrier = threading.Barrier(20)
    outcomes: list[str] = []

    def approve() -> None:
        barrier.wait()
        try:
            s.gateway.gates.decide(gate_id, OPERATOR, approve=True)
            outcomes.append("won")
        except GateError as exc:
            outcomes.append(exc.kind)

    threads = [threading.Thread(target=approve) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("won") == 1 and outcomes.count("not_pending") == 19
    assert s.transitions(gate_id) == ["approved"]
    assert s.db.query("SELECT clean_approvals FROM earned_trust")[0][0] == 1  # counted once


async def test_approving_twice_concurrently_sends_exactly_once(s: Setup) -> None:
    gate_id = await s.gated_send("once")
    s.surface.delay_s = 0.05  # a slow surface widens the race window
    errors: list[str] = []

    async def approve(approver: Approver) -> None:
        try:
            await s.gateway.decide(gate_id, approver, approve=True)
        except GateError as exc:
            errors.append(exc.kind)

    async def execute() -> None:
        await s.gateway.execute(gate_id)

    async with anyio.create_task_group() as tg:
        for approver in (OPERATOR, OWNER, GUILD_ADMIN) * 3:
            tg.start_soon(approve, approver)
        for _ in range(5):
            tg.start_soon(execute)  # a supervisor sweeping approved gates at the same time
    assert [m.content for m in s.surface.sent] == ["once"]
    assert errors == ["not_pending"] * 8
    assert s.gateway.gates.get(gate_id).state == "executed"
    assert s.transitions(gate_id) == ["approved", "executing", "executed"]


async def test_an_approval_after_the_deadline_is_refused_and_the_gate_expires(s: Setup) -> None:
    gate_id = await s.gated_send()
    s.clock.advance(hours=23, minutes=59)
    assert s.gateway.gates.get(gate_id).state == "pending"
    s.clock.advance(minutes=1)
    with pytest.raises(GateError) as caught:
        await s.gateway.decide(gate_id, OPERATOR, approve=True)
    assert caught.value.kind == "expired"
    assert s.gateway.gates.get(gate_id).state == "expired" and s.surface.sent == []
    assert s.transitions(gate_id) == ["expired"]
    with pytest.raises(GateError, match="already expired"):
        await s.gateway.decide(gate_id, OPERATOR, approve=True)


async def test_the_sweep_expires_gates_past_their_deadline(s: Setup) -> None:
    first = await s.gated_send("a")
    s.clock.advance(hours=12)
    second = await s.gated_send("b")
    s.clock.advance(hours=12)
    assert [gate.id for gate in await s.gateway.expire_due()] == [first]
    assert s.gateway.gates.get(second).state == "pending"


async def test_the_deadline_comes_from_the_policy(tmp_path: Path) -> None:
    policy = build_policy([("ops.toml", "[gates]\ndeadline_hours = 1\n"), (str(default_policy_path()), default_policy_path().read_text())])
    s = make_setup(tmp_path, policy)
    gate = s.gateway.gates.get(await s.gated_send())
    assert gate.deadline - gate.created_at == timedelta(hours=1)
    s.db.close()


async def test_approvals_recorded_on_the_cli_are_executed_by_the_host(s: Setup) -> None:
    gate_id = await s.gated_send("from the cli")
    s.gateway.gates.decide(gate_id, OPERATOR, approve=True)  # what `impyard approvals approve` does
    assert s.surface.sent == []
    [gate] = await s.gateway.execute_approved()
    assert gate.state == "executed" and [m.content for m in s.surface.sent] == ["from the cli"]
    assert await s.gateway.execute_approved() == []


async def test_a_failed_execution_is_recorded_not_retried(s: Setup) -> None:
    gate_id = await s.gated_send()
    s.surface.fail_with = "discord said no"
    gate = await s.gateway.decide(gate_id, OPERATOR, approve=True)
    assert gate.state == "failed" and "discord said no" in (gate.error or "")
    s.surface.fail_with = None
    assert (await s.gateway.execute(gate_id)).state == "failed" and s.surface.sent == []


async def test_a_tampered_payload_is_not_executed(s: Setup) -> None:
    gate_id = await s.gated_send("original")
    s.db.execute("UPDATE gates SET payload = replace(payload, 'original', 'tampered') WHERE id = ?", (gate_id,))
    s.gateway.gates.decide(gate_id, OPERATOR, approve=True)
    with pytest.raises(GateError) as caught:
        await s.gateway.execute(gate_id)
    assert caught.value.kind == "tampered"
    assert s.surface.sent == [] and s.gateway.gates.get(gate_id).state == "failed"


async def test_earned_trust_promotes_after_n_clean_approvals_and_a_denial_resets_it(tmp_path: Path) -> None:
    policy = build_policy(
        [('ops.toml', '[trust."discord.send"]\nuntrusted = "earned"\nearned_after = 3\n'),
         (str(default_policy_path()), default_policy_path().read_text())]
    )  # fmt: skip
    s = make_setup(tmp_path, policy)
    for _ in range(2):
        await s.gateway.decide(await s.gated_send(), OWNER, approve=True)
    await s.gateway.decide(await s.gated_send(), OWNER, approve=False)  # one denial: back to zero
    for _ in range(2):
        await s.gateway.decide(await s.gated_send(), OWNER, approve=True)
    third = await s.gated_send()  # still gated: only 2 clean approvals since the denial
    await s.gateway.decide(third, OWNER, approve=True)
    auto = await s.gateway.serve(s.spec, "discord.send", DiscordSendParams(channel_id="guild-chat", content="alone"))
    assert isinstance(auto, DiscordSendResult) and auto.status == "delivered"
    assert "earned (3 clean approvals)" in s.db.query("SELECT detail FROM audit ORDER BY id DESC LIMIT 1")[0][0]
    # earned per imp + act + target: the same imp in another untrusted channel starts from zero
    DbChannelTrust(s.db, s.clock).upsert(ChannelInfo("guild-other", kind="guild", guild_id="g1"))
    other = BoxSpec("pip", "guild-other", s.spec.state_dir)
    pending = await s.gateway.serve(other, "discord.send", DiscordSendParams(channel_id="guild-other", content="x"))
    assert isinstance(pending, DiscordSendResult) and pending.status == "pending"
    assert len(s.surface.sent) == 6  # five approved gates and one earned auto-send
    s.db.close()
