"""Approval gates: durable, frozen, deadlines on a fixed clock, the approver policy, exactly-once
execution under concurrency, and earned trust (docs/security.md, docs/architecture.md)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa

from box.protocol.models import DiscordSendParams, DiscordSendResult
from impyard.backends import BoxSpec
from impyard.clock import FixedClock
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.core import Gateway
from impyard.gateway.gates import Approver, Gate, GateError, deciding_guild, may_decide
from impyard.gateway.policy import Policy, build_policy, default_policy_path, load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.gateway.trust import ChannelInfo, DbChannelTrust
from impyard.host import build_gateway
from impyard.storage import tables
from impyard.storage.db import Database, open_database
from impyard.storage.migrations.legacy import MIGRATIONS
from tests import sqlfile

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
        result = await self.gateway.serve(
            self.spec, "discord.send", DiscordSendParams(channel_id=target, content=content)
        )
        assert isinstance(result, DiscordSendResult) and result.status == "pending" and result.gate_id
        return result.gate_id

    def transitions(self, gate_id: str) -> list[str]:
        query = sa.select(tables.audit.c.verdict).where(
            tables.audit.c.method == "gate", tables.audit.c.gate_id == gate_id
        )
        return self.db.read(lambda conn: list(conn.scalars(query.order_by(tables.audit.c.id))))


def make_setup(tmp_path: Path, policy: Policy | None = None) -> Setup:
    db = open_database(tmp_path / "impyard.db")
    clock = FixedClock(datetime(2026, 6, 1, 9, 0, tzinfo=UTC))
    surface = RecordingSurface()
    gateway = build_gateway(
        policy=policy or load_policy(), db=db, surface=surface, clock=clock,
        upstream=UpstreamConfig(api_key=None), owners={"pip": ["owner-1"]}, secrets=[],
    )  # fmt: skip
    DbChannelTrust(db, clock).upsert(ChannelInfo("guild-chat", kind="guild", trusted=False, guild_id="g1"))
    return Setup(
        gateway, db, clock, surface, BoxSpec("pip", "guild-chat", tmp_path / "state", run_id="run-9")
    )


@pytest.fixture
async def s(tmp_path: Path) -> AsyncIterator[Setup]:
    setup = make_setup(tmp_path)
    yield setup
    setup.db.close()


async def test_a_gate_is_durable_and_frozen(s: Setup, tmp_path: Path) -> None:
    gate_id = await s.gated_send("the exact words")
    reopened = open_database(tmp_path / "impyard.db")  # another process (the CLI) sees the same gate
    from impyard.gateway.audit import AuditLog
    from impyard.gateway.gates import GateStore

    gate = GateStore(reopened, s.clock, AuditLog(reopened, s.clock, [])).get(gate_id)
    assert gate.state == "pending" and gate.payload["content"] == "the exact words"
    assert gate.deadline - gate.created_at == timedelta(hours=24)
    assert (gate.imp, gate.run_id, gate.session_channel, gate.origin_guild) == (
        "pip",
        "run-9",
        "guild-chat",
        "g1",
    )
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
    assert (
        s.gateway.gates.get(gate_id).state == "pending"
        and s.surface.sent == []
        and s.transitions(gate_id) == []
    )


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
    counted = s.db.read(lambda conn: list(conn.scalars(sa.select(tables.earned_trust.c.clean_approvals))))
    assert counted == [1]  # counted once


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
    policy = build_policy(
        [
            ("ops.toml", "[gates]\ndeadline_hours = 1\n"),
            (str(default_policy_path()), default_policy_path().read_text()),
        ]
    )
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
    tamper = (
        sa.update(tables.gates)
        .where(tables.gates.c.id == gate_id)
        .values(payload=sa.func.replace(tables.gates.c.payload, "original", "tampered"))
    )
    s.db.write(lambda conn: conn.execute(tamper))
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
    auto = await s.gateway.serve(
        s.spec, "discord.send", DiscordSendParams(channel_id="guild-chat", content="alone")
    )
    assert isinstance(auto, DiscordSendResult) and auto.status == "delivered"
    last = sa.select(tables.audit.c.detail).order_by(tables.audit.c.id.desc()).limit(1)
    assert "earned (3 clean approvals)" in s.db.read(lambda conn: conn.execute(last).scalar_one())
    # earned per imp + act + target: the same imp in another untrusted channel starts from zero
    DbChannelTrust(s.db, s.clock).upsert(ChannelInfo("guild-other", kind="guild", guild_id="g1"))
    other = BoxSpec("pip", "guild-other", s.spec.state_dir)
    pending = await s.gateway.serve(
        other, "discord.send", DiscordSendParams(channel_id="guild-other", content="x")
    )
    assert isinstance(pending, DiscordSendResult) and pending.status == "pending"
    assert len(s.surface.sent) == 6  # five approved gates and one earned auto-send
    s.db.close()


# --- the approver policy for posts into another channel (issue 11 #5) --------------------------------

NOW = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
CROSS_SEND = (
    '[[rules]]\nname = "cross"\nmethod = "discord.send"\naction = "allow"\nchannels = ["news-b", "unseen"]\n'
)


def a_gate(*, target: str, origin_guild: str | None = "g1", target_guild: str | None = None) -> Gate:
    return Gate(
        id="g-1", imp="pip", run_id="r", session_channel="guild-chat", origin_guild=origin_guild, act="discord.send",
        target=target, payload={}, payload_sha256="", reason="", state="pending", created_at=NOW, deadline=NOW,
        target_guild=target_guild,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("approver", "target", "target_guild", "allowed"),
    [
        pytest.param(GUILD_ADMIN, "guild-chat", "g1", True, id="own-channel: admin of its guild"),
        pytest.param(OTHER_GUILD_ADMIN, "guild-chat", "g1", False, id="own-channel: admin of another guild"),
        pytest.param(GUILD_ADMIN, "news-b", "g2", False, id="other guild: admin of the requesting guild"),
        pytest.param(OTHER_GUILD_ADMIN, "news-b", "g2", True, id="other guild: admin of the target's guild"),
        pytest.param(GUILD_ADMIN, "news-a", "g1", True, id="other channel of the same guild: its admin"),
        pytest.param(GUILD_ADMIN, "unseen", None, False, id="unknown guild: admin of the requesting guild"),
        pytest.param(OTHER_GUILD_ADMIN, "unseen", None, False, id="unknown guild: any admin"),
        pytest.param(
            Approver("user", "admin-7", is_guild_admin=True, guild_id=None),
            "unseen",
            None,
            False,
            id="unknown guild: admin in a DM",
        ),
        pytest.param(
            Approver("user", "member", is_guild_admin=False, guild_id="g2"),
            "news-b",
            "g2",
            False,
            id="member of the target's guild",
        ),
        pytest.param(OWNER, "news-b", "g2", True, id="owner: any guild"),
        pytest.param(OWNER, "unseen", None, True, id="owner: unknown guild"),
        pytest.param(OPERATOR, "unseen", None, True, id="operator: unknown guild"),
        pytest.param(STRANGER, "news-b", "g2", False, id="stranger"),
    ],
)
def test_who_may_decide_is_the_guild_the_post_lands_in(
    approver: Approver, target: str, target_guild: str | None, allowed: bool
) -> None:
    ok, why = may_decide(approver, a_gate(target=target, target_guild=target_guild), owners={"owner-1"})
    assert ok is allowed, why
    if not ok:
        assert "guild the message would be posted in" in why


def test_the_deciding_guild_of_an_own_channel_gate_is_the_session_guild_even_if_unrecorded() -> None:
    """A gate from before the target guild was recorded: its own channel's guild is the origin guild."""
    assert deciding_guild(a_gate(target="guild-chat", target_guild=None)) == "g1"
    assert deciding_guild(a_gate(target="news-b", target_guild=None)) is None
    assert deciding_guild(a_gate(target="news-b", origin_guild="g1", target_guild="g2")) == "g2"


def cross_setup(tmp_path: Path, extra: str = "") -> Setup:
    policy = build_policy(
        [("ops.toml", CROSS_SEND + extra), (str(default_policy_path()), default_policy_path().read_text())]
    )
    s = make_setup(tmp_path, policy)
    DbChannelTrust(s.db, s.clock).upsert(
        ChannelInfo("news-b", kind="guild", guild_id="g2")
    )  # a channel of guild g2
    return s


@pytest.mark.parametrize(
    ("approver", "allowed"),
    [(GUILD_ADMIN, False), (OTHER_GUILD_ADMIN, True), (OWNER, True), (STRANGER, False)],
    ids=["admin-of-the-requesting-guild", "admin-of-the-target-guild", "owner", "stranger"],
)
async def test_a_post_into_another_guild_is_decided_by_that_guild_not_the_requesting_one(
    tmp_path: Path, approver: Approver, allowed: bool
) -> None:
    s = cross_setup(tmp_path)
    gate_id = await s.gated_send("into guild b", target="news-b")
    gate = s.gateway.gates.get(gate_id)
    assert (gate.origin_guild, gate.target_guild) == ("g1", "g2")
    if allowed:
        assert (await s.gateway.decide(gate_id, approver, approve=True)).state == "executed"
        assert [(m.channel_id, m.content) for m in s.surface.sent] == [("news-b", "into guild b")]
    else:
        with pytest.raises(GateError) as caught:
            await s.gateway.decide(gate_id, approver, approve=True)
        assert caught.value.kind == "not_authorised" and "guild the message would be posted in" in str(
            caught.value
        )
        assert (
            s.gateway.gates.get(gate_id).state == "pending"
            and s.surface.sent == []
            and s.transitions(gate_id) == []
        )
    s.db.close()


async def test_a_post_into_a_channel_whose_guild_is_unknown_is_for_owners_and_the_operator(
    tmp_path: Path,
) -> None:
    s = cross_setup(tmp_path)
    gate_id = await s.gated_send("somewhere", target="unseen")  # the host never saw this channel
    assert s.gateway.gates.get(gate_id).target_guild is None
    for approver in (GUILD_ADMIN, OTHER_GUILD_ADMIN):
        with pytest.raises(GateError, match="no guild admin may"):
            await s.gateway.decide(gate_id, approver, approve=True)
    assert s.surface.sent == []
    assert (await s.gateway.decide(gate_id, OWNER, approve=True)).state == "executed"
    second = await s.gated_send("again", target="unseen")
    assert (await s.gateway.decide(second, OPERATOR, approve=True)).state == "executed"
    s.db.close()


async def test_earned_trust_counts_only_approvals_from_approvers_of_the_target(tmp_path: Path) -> None:
    s = cross_setup(tmp_path, '[trust."discord.send"]\nother_channel = "earned"\nearned_after = 2\n')
    for _ in range(3):  # the requesting guild's admin keeps trying: refused, and nothing is earned
        gate_id = await s.gated_send(target="news-b")
        with pytest.raises(GateError):
            await s.gateway.decide(gate_id, GUILD_ADMIN, approve=True)
    assert s.gateway.earned.count("pip", "discord.send", "news-b") == 0
    still = await s.gateway.serve(s.spec, "discord.send", DiscordSendParams(channel_id="news-b", content="x"))
    assert isinstance(still, DiscordSendResult) and still.status == "pending"
    for _ in range(2):  # the target guild's admin approves: that is earned
        await s.gateway.decide(await s.gated_send(target="news-b"), OTHER_GUILD_ADMIN, approve=True)
    assert s.gateway.earned.count("pip", "discord.send", "news-b") == 2
    alone = await s.gateway.serve(
        s.spec, "discord.send", DiscordSendParams(channel_id="news-b", content="alone")
    )
    assert isinstance(alone, DiscordSendResult) and alone.status == "delivered"
    s.db.close()


def test_the_migration_records_target_guilds_and_restarts_earned_trust_approved_across_channels(
    tmp_path: Path,
) -> None:
    old = Database(tmp_path / "old.db", MIGRATIONS[:3])
    old.migrate()
    row = "('{id}', 'pip', 'r', 'chat', 'g1', 'discord.send', '{target}', '{{}}', 'x', '', 'executed', 't', 't', '{by}')"
    sqlfile.execute(
        old,
        "INSERT INTO gates (id, imp, run_id, session_channel, origin_guild, act, target, payload, payload_sha256, "
        "reason, state, created_at, deadline, decided_by) VALUES "
        + ", ".join(
            row.format(id=i, target=t, by=b)
            for i, t, b in [
                ("g-own", "chat", "user:discord:7"),
                ("g-far", "far", "user:discord:7"),
                ("g-cli", "cli", "operator:root"),
            ]
        ),
    )
    sqlfile.execute(
        old,
        "INSERT INTO earned_trust VALUES ('pip', 'discord.send', 'chat', 4, 't'), ('pip', 'discord.send', 'far', 4, 't'), "
        "('pip', 'discord.send', 'cli', 4, 't')",
    )
    old.close()
    db = open_database(tmp_path / "old.db")
    guilds = {r["id"]: r["target_guild"] for r in sqlfile.query(db, "SELECT id, target_guild FROM gates")}
    earned = {
        r["target"]: r["clean_approvals"]
        for r in sqlfile.query(db, "SELECT target, clean_approvals FROM earned_trust")
    }
    db.close()
    assert guilds == {"g-own": "g1", "g-far": None, "g-cli": None}
    assert earned == {
        "chat": 4,
        "far": 0,
        "cli": 4,
    }  # a chat user's approval across channels may have been the wrong guild's


async def test_a_learned_target_guild_only_fills_a_gap(tmp_path: Path) -> None:
    s = cross_setup(tmp_path)
    unknown = await s.gated_send(target="unseen")
    known = await s.gated_send(target="news-b")
    own = await s.gated_send(target="guild-chat")
    assert s.gateway.gates.learn_target_guild(unknown, "g2").target_guild == "g2"
    assert (
        s.gateway.gates.learn_target_guild(known, "g9").target_guild == "g2"
    )  # never changes a recorded guild
    assert (
        s.gateway.gates.learn_target_guild(own, "g9").target_guild == "g1"
    )  # nor the session's own channel's
    assert (await s.gateway.decide(unknown, OTHER_GUILD_ADMIN, approve=True)).state == "executed"
    s.db.close()
