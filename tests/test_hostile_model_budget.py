"""A hostile box against the budget hard stop (issue 11 #3), through the real gateway and the loopback fake OpenAI.

The fake plays an upstream that reports far more usage than the request allowed (a misbehaving provider, a
proxy that ignores caps), so the only thing between the box and an overspent budget is the gateway: it caps
every text call's output, reserves the call's true worst case, and never settles above the reservation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from box.protocol import ErrorCode, RpcError
from box.protocol.models import ModelRequestParams, ModelRequestResult
from impyard.backends import BoxSpec
from impyard.clock import FixedClock
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.core import Gateway
from impyard.gateway.ledger import Ledger
from impyard.gateway.policy import Policy, build_policy, default_policy_path
from impyard.gateway.surfaces import RecordingSurface
from impyard.host import build_gateway
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI, envelope
from tests import sqlfile

KEY = "sk-impyard-test-hostile-budget-91c3"
pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]
LIMIT_MICROS = 100_000  # pip's day: $0.10
HUGE = {
    "prompt_tokens": 1_000_000,
    "completion_tokens": 32_768,
}  # what the upstream claims, whatever was asked
SPEC = BoxSpec("pip", "c1", Path("/nonexistent"), run_id="hostile")


def policy_with(extra: str) -> Policy:
    default = default_policy_path()
    return build_policy([("ops.toml", extra), (str(default), default.read_text())])


@pytest.fixture
async def gateway(tmp_path: Path, fake: FakeOpenAI) -> AsyncIterator[Gateway]:
    db = open_database(tmp_path / "impyard.db")
    gateway = build_gateway(
        policy=policy_with(f"[budgets.per_imp]\ndaily_usd = {LIMIT_MICROS / 1_000_000}\n"),
        db=db, surface=RecordingSurface(), clock=FixedClock(datetime(2026, 5, 10, 12, 0, tzinfo=UTC)),
        upstream=UpstreamConfig(base_url=fake.base_url, api_key=KEY), secrets=[KEY],
    )  # fmt: skip
    yield gateway
    await gateway.aclose()
    db.close()


def spent_today(ledger: Ledger) -> int:
    return {row.scope: row for row in ledger.summary()}["pip"].daily_spent


async def ask(
    gateway: Gateway, path: str, body: dict[str, Any], purpose: str = "reply"
) -> ModelRequestResult:
    result = await gateway.serve(
        SPEC, "model.request", ModelRequestParams(path=path, body=body, purpose=purpose)
    )  # type: ignore[arg-type]
    assert isinstance(result, ModelRequestResult)
    return result


UNCAPPED_CHAT = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "write until the end of time"}]}


@pytest.mark.parametrize(
    ("path", "body", "key"),
    [
        pytest.param("/chat/completions", UNCAPPED_CHAT, "max_completion_tokens", id="chat"),
        pytest.param(
            "/responses",
            {"model": "gpt-4.1", "input": "write until the end of time"},
            "max_output_tokens",
            id="responses",
        ),
    ],
)
async def test_a_call_without_an_output_cap_is_sent_the_rules_cap(
    gateway: Gateway, fake: FakeOpenAI, path: str, body: dict, key: str
) -> None:
    fake.script(envelope(answer="..."), purpose="reply")
    await ask(gateway, path, body)
    [request] = fake.requests
    assert request.body == {
        **body,
        key: 4096,
    }  # the default policy's model-text max_tokens; nothing else changed
    [row] = sqlfile.query(gateway.db, "SELECT detail FROM audit")
    assert "output_cap=4096 (set by the host)" in row["detail"]


async def test_no_sequence_of_requests_spends_past_the_hard_stop(
    gateway: Gateway, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script(envelope(answer="..."), purpose="reply", usage=HUGE)
    hostile = [
        ("/chat/completions", UNCAPPED_CHAT),
        ("/chat/completions", {**UNCAPPED_CHAT, "model": "gpt-4.1-mini", "max_completion_tokens": 4096}),
        ("/responses", {"model": "gpt-4.1-nano", "input": "and again"}),
    ]
    upstream_calls, refused = 0, None
    with caplog.at_level(logging.ERROR, logger="impyard.gateway"):
        for attempt in range(30):
            path, body = hostile[attempt % len(hostile)]
            try:
                await ask(gateway, path, body)
            except RpcError as exc:
                refused = exc
                break
            upstream_calls += 1
            assert len(fake.requests) == upstream_calls
            assert spent_today(gateway.ledger) <= LIMIT_MICROS  # after every call, not just at the end
    assert upstream_calls >= 2 and refused is not None and refused.code == ErrorCode.BUDGET_EXHAUSTED
    assert refused.data["ledger"] == "imp:pip/day"
    assert len(fake.requests) == upstream_calls  # refused before the upstream: no call made
    # the upstream's claims were over every reservation: charged the reservation, and said so loudly
    assert any(
        "over the" in r.getMessage() and "reserved" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR
    )
    rows = sqlfile.query(gateway.db, "SELECT verdict, detail, cost_micros FROM audit ORDER BY id")
    assert all("OVER RESERVATION" in row["detail"] for row in rows if row["verdict"] == "allowed")
    assert sum(row["cost_micros"] for row in rows) == spent_today(gateway.ledger) <= LIMIT_MICROS


async def test_an_imp_at_its_limit_makes_no_upstream_call_whatever_it_asks(
    gateway: Gateway, fake: FakeOpenAI
) -> None:
    fake.script(envelope(answer="..."), purpose="reply", usage=HUGE)
    await ask(gateway, "/chat/completions", UNCAPPED_CHAT)
    gateway.ledger.set_limits("pip", daily_usd=spent_today(gateway.ledger) / 1_000_000, monthly_usd=None)
    for path, body in [
        ("/chat/completions", {**UNCAPPED_CHAT, "max_completion_tokens": 1}),
        ("/responses", {"model": "gpt-4.1-nano", "input": "x", "max_output_tokens": 1}),
        ("/embeddings", {"model": "text-embedding-3-small", "input": "x"}),
    ]:
        with pytest.raises(RpcError) as caught:
            await ask(gateway, path, body, "embedding" if path == "/embeddings" else "reply")
        assert caught.value.code == ErrorCode.BUDGET_EXHAUSTED
    assert len(fake.requests) == 1


PNG = "data:image/png;base64,iVBORw0KGgo="


def _images(count: int) -> dict[str, Any]:
    parts = [{"type": "text", "text": "look"}] + [{"type": "image_url", "image_url": {"url": PNG}}] * count
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": parts}],
        "max_completion_tokens": 16,
    }


@pytest.mark.parametrize(
    ("body", "why"),
    [
        # each is tiny in bytes; each would be reserved at a few hundred micro-USD by its bytes alone
        pytest.param(
            {**UNCAPPED_CHAT, "max_completion_tokens": 4096, "n": 8}, "n choices", id="n-multiplies-the-cap"
        ),
        pytest.param(_images(20), "input images", id="images-at-their-worst-case"),
    ],
)
async def test_what_costs_beyond_the_bytes_is_reserved_at_its_worst_case(
    gateway: Gateway, fake: FakeOpenAI, body: dict, why: str
) -> None:
    fake.script(envelope(answer="..."), purpose="reply", usage=HUGE)
    with pytest.raises(RpcError) as caught:
        await ask(gateway, "/chat/completions", body)
    assert caught.value.code == ErrorCode.BUDGET_EXHAUSTED, why
    assert caught.value.data["ledger"] == "imp:pip/day" and fake.requests == []


@pytest.mark.parametrize(
    ("body", "rule", "reason"),
    [
        pytest.param(
            {**UNCAPPED_CHAT, "service_tier": "priority"},
            "prices",
            "service_tier 'priority' is not priced",
            id="priority-tier",
        ),
        pytest.param(
            {"model": "gpt-4.1", "input": "go on", "previous_response_id": "resp_abc"},
            "model-text",
            "previous_response_id pulls stored context",
            id="stored-context",
        ),
    ],
)
async def test_costs_the_price_table_cannot_bound_are_refused(
    gateway: Gateway, fake: FakeOpenAI, body: dict, rule: str, reason: str
) -> None:
    path = "/responses" if "input" in body else "/chat/completions"
    with pytest.raises(RpcError) as caught:
        await ask(gateway, path, body)
    assert caught.value.code == ErrorCode.DENIED
    assert caught.value.data["rule"] == rule and reason in caught.value.data["reason"]
    assert fake.requests == [] and sqlfile.query(gateway.db, "SELECT count(*) FROM ledger")[0][0] == 0


async def test_a_priced_tier_and_an_allowed_stored_context_are_reserved_and_charged_in_full(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    ops = (
        '[[rules]]\nname = "threads"\nmethod = "model.request"\naction = "allow"\npaths = ["/responses"]\n'
        'purposes = { reply = ["gpt-4.1"] }\nmax_tokens = 100\nstored_context_tokens = 50000\n'
        '[prices."gpt-4.1"]\ninput = 2.0\nservice_tiers = { priority = 2.0 }\n'
    )
    db = open_database(tmp_path / "impyard.db")
    gateway = build_gateway(
        policy=policy_with(ops), db=db, surface=RecordingSurface(), clock=FixedClock(datetime(2026, 5, 10, tzinfo=UTC)),
        upstream=UpstreamConfig(base_url=fake.base_url, api_key=KEY), secrets=[KEY],
    )  # fmt: skip
    fake.script(
        envelope(answer="..."), purpose="reply", usage={"prompt_tokens": 40_000, "completion_tokens": 100}
    )
    body = {
        "model": "gpt-4.1",
        "input": "go on",
        "previous_response_id": "resp_abc",
        "service_tier": "priority",
    }
    await ask(gateway, "/responses", body)
    [request] = fake.requests
    assert request.body == {**body, "max_output_tokens": 100}
    [row] = sqlfile.query(db, "SELECT reserved_micros, cost_micros FROM ledger")
    assert row["reserved_micros"] >= 2 * (
        50_000 * 2 + 100 * 8
    )  # the stored context's worst case, doubled by the tier
    assert row["cost_micros"] == 2 * (40_000 * 2 + 100 * 8)  # what it used, at the tier's price
    await gateway.aclose()
    db.close()
