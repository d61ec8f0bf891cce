"""Issue 21: a host that lost its lease acts no more. Its gateway refuses every act of its boxes (DENIED, rule
``lease``), audited, with nothing reserved or posted, and leaves an approved gate approved for the host that
holds the lease now."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from box.protocol import ErrorCode
from box.protocol.models import DiscordSendParams, HttpFetchParams, ModelRequestParams
from impyard.gateway.gates import Approver
from testing.fake_openai import FakeOpenAI, envelope
from tests import sqlfile
from tests.test_gateway import (
    CHAT_BODY,
    KEY,
    Harness,
    make_harness,
    policy_with,
)

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]

LOST = "lost lease shard:1/2: the lease passed to beta pid 200 (token 4, this host held 3)"


class Guard:
    """A LeaseKeeper as the gateway sees it (impyard.storage.leases.LeaseGuard): None while held, else why not."""

    def __init__(self) -> None:
        self.lost: str | None = None
        self.checks = 0

    def check(self) -> str | None:
        self.checks += 1
        return self.lost


@pytest.fixture
async def h(tmp_path: Path, fake: FakeOpenAI) -> AsyncIterator[Harness]:  # noqa: F811 - the fixture imported
    harness = make_harness(tmp_path, fake)
    yield harness
    await harness.gateway.aclose()
    harness.db.close()


@pytest.fixture
def guard(h: Harness) -> Guard:
    h.gateway.lease_guard = guard = Guard()
    return guard


async def test_a_host_holding_its_lease_acts_as_before(h: Harness, guard: Guard) -> None:
    h.fake.script(envelope(answer="hi"), purpose="reply", usage={"prompt_tokens": 10, "completion_tokens": 5})
    await h.call(
        "model.request", ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply")
    )
    await h.call("discord.send", DiscordSendParams(channel_id="c1", content="hello"))
    assert guard.checks == 2 and len(h.fake.requests) == 1 and len(h.surface.sent) == 1
    assert [row["verdict"] for row in h.audit()] == ["allowed", "allowed"]


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("model.request", ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply")),
        ("discord.send", DiscordSendParams(channel_id="c1", content="hello")),
        ("http.fetch", HttpFetchParams(url="https://example.com/")),
    ],
)
async def test_a_host_that_lost_its_lease_refuses_every_act(
    h: Harness, guard: Guard, method: str, params: object
) -> None:
    h.fake.script(envelope(answer="hi"), purpose="reply")
    guard.lost = LOST
    refusal = await h.refused(method, params, ErrorCode.DENIED)  # type: ignore[arg-type]
    assert refusal.data == {"rule": "lease", "reason": f"this host holds no lease to act: {LOST}"}
    assert "lost lease shard:1/2" in refusal.message
    [row] = h.audit()
    assert (row["method"], row["verdict"], row["rule"]) == (method, "denied", "lease")
    assert LOST in row["reason"]
    # nothing reserved, nothing sent upstream, nothing posted, no gate opened
    assert sqlfile.query(h.db, "SELECT count(*) FROM ledger")[0][0] == 0 and h.gateway.ledger.totals() == {}
    assert h.fake.requests == [] and h.surface.sent == []
    assert sqlfile.query(h.db, "SELECT count(*) FROM gates")[0][0] == 0


async def test_an_approved_gate_stays_approved_on_a_host_that_lost_its_lease(
    h: Harness, guard: Guard
) -> None:
    h.gateway.policy = policy_with(
        '[[rules]]\nname = "x"\nmethod = "discord.send"\naction = "allow"\nchannels = ["dm-2"]\n'
    )
    h.channel("dm-2", kind="dm")
    result = await h.call("discord.send", DiscordSendParams(channel_id="dm-2", content="psst"))
    gate_id = result.gate_id  # type: ignore[union-attr]
    assert gate_id and h.surface.sent == []
    guard.lost = LOST
    decided = await h.gateway.decide(gate_id, Approver("operator", "me"), approve=True)
    assert decided.state == "approved" and h.gateway.gates.get(gate_id).state == "approved"
    assert await h.gateway.execute_approved() == []  # the pump moves nothing either
    assert h.surface.sent == []
    guard.lost = (
        None  # the lease is held again (or another host, holding it, runs the pump): it goes out once
    )
    [sent] = await h.gateway.execute_approved()
    assert sent.state == "executed" and len(h.surface.sent) == 1
