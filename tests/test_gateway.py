"""The gateway end to end: every box request judged, metered, gated and audited (docs/security.md).

The upstream is the loopback fake OpenAI; sends land on a RecordingSurface; the
clock is fixed. Every refusal is checked for its error code, its rule, and that
nothing was executed.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel, ConfigDict

from box.protocol import BOX_METHODS, HOST_METHODS, ErrorCode, Peer, RpcError
from box.protocol.memory import MEMORY_METHOD_NAMES
from box.protocol.models import (
    DiscordSendParams,
    DiscordSendResult,
    HttpFetchParams,
    LogParams,
    ModelRequestParams,
    ModelRequestResult,
    SendFile,
    TurnStageParams,
)
from impyard.backends import BoxSpec, QuietHost
from impyard.backends.process import box_environment
from impyard.clock import FixedClock
from impyard.gateway.broker import UpstreamConfig, encode_body
from impyard.gateway.core import Gateway
from impyard.gateway.fetch import HttpFetcher
from impyard.gateway.fetch_act import FetchAct
from impyard.gateway.policy import Policy, build_policy, default_policy_path, load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.gateway.trust import ChannelInfo, DbChannelTrust
from impyard.host import build_gateway
from impyard.storage.db import Database, open_database
from testing.fake_openai import PURPOSE_HEADER, FakeOpenAI, FakeResponse, envelope, error, slow
from testing.pipes import byte_pipe
from testing.web import local_site
from tests import sqlfile
from tests.scripted import NOW, deliver_params, init_params

KEY = "sk-impyard-test-SECRET-4f9a1c7e2b"  # the host's model key: must never reach the box or the audit
pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]
CHAT_BODY: dict[str, Any] = {
    "model": "gpt-4.1-mini",
    "messages": [{"role": "user", "content": "hi"}],
    "max_completion_tokens": 200,
}


def policy_with(extra: str) -> Policy:
    """The shipped default with an operator file on top."""
    default = default_policy_path()
    return build_policy([("ops.toml", extra), (str(default), default.read_text())])


@dataclass
class Harness:
    gateway: Gateway
    db: Database
    clock: FixedClock
    surface: RecordingSurface
    fake: FakeOpenAI
    spec: BoxSpec
    stages: list[str] = field(default_factory=list)
    results: list[BaseModel] = field(default_factory=list)

    async def call(self, method: str, params: BaseModel, spec: BoxSpec | None = None) -> BaseModel | None:
        result = await self.gateway.serve(spec or self.spec, method, params)
        if result is not None:
            self.results.append(result)
        return result

    async def refused(
        self, method: str, params: BaseModel, code: int, spec: BoxSpec | None = None
    ) -> RpcError:
        with pytest.raises(RpcError) as caught:
            await self.call(method, params, spec)
        assert caught.value.code == code, caught.value.message
        return caught.value

    def audit(self) -> list[dict[str, Any]]:
        return [dict(row) for row in sqlfile.query(self.db, "SELECT * FROM audit ORDER BY id")]

    def spent(self) -> int:
        return self.gateway.ledger.settled_total()

    def channel(
        self, channel_id: str, kind: str = "guild", trusted: bool = False, guild_id: str | None = None
    ) -> None:
        DbChannelTrust(self.db, self.clock).upsert(
            ChannelInfo(channel_id, kind=kind, trusted=trusted, guild_id=guild_id)
        )


def make_harness(
    tmp_path: Path, fake: FakeOpenAI, policy: Policy | None = None, *, api_key: str | None = KEY
) -> Harness:
    db = open_database(tmp_path / "impyard.db")
    clock = FixedClock(datetime(2026, 5, 10, 12, 0, tzinfo=UTC))
    surface = RecordingSurface()
    harness_stages: list[str] = []

    async def on_stage(spec: BoxSpec, params: TurnStageParams) -> None:
        harness_stages.append(f"{spec.imp}:{params.stage}")

    gateway = build_gateway(
        policy=policy or load_policy(),
        db=db,
        surface=surface,
        clock=clock,
        upstream=UpstreamConfig(base_url=fake.base_url, api_key=api_key),
        owners={"pip": {"owner-1"}},
        on_stage=on_stage,
        secrets=[KEY],
    )
    harness = Harness(
        gateway, db, clock, surface, fake, BoxSpec("pip", "c1", tmp_path / "state", run_id="run-1")
    )
    harness.stages = harness_stages
    harness.channel("c1", kind="dm")  # the session's own channel: a DM, trusted
    return harness


@pytest.fixture
async def h(tmp_path: Path, fake: FakeOpenAI) -> AsyncIterator[Harness]:
    harness = make_harness(tmp_path, fake)
    yield harness
    await harness.gateway.aclose()
    harness.db.close()


def no_secret_anywhere(h: Harness) -> None:
    assert KEY not in json.dumps(h.audit(), default=str)
    assert all(KEY not in result.model_dump_json() for result in h.results)


# --- model.request ---------------------------------------------------------------------------------


async def test_a_chat_call_goes_upstream_with_the_real_key_and_is_charged_from_usage(h: Harness) -> None:
    h.fake.script(
        envelope(answer="hello"),
        purpose="reply",
        usage={"prompt_tokens": 1000, "completion_tokens": 200, "cached_tokens": 100},
    )
    body = {
        **CHAT_BODY,
        "messages": [{"role": "user", "content": "hello " * 200}],
    }  # 1,000 tokens need the bytes
    result = await h.call(
        "model.request", ModelRequestParams(path="/chat/completions", body=body, purpose="reply")
    )
    assert isinstance(result, ModelRequestResult) and result.status == 200
    assert json.loads(result.body["choices"][0]["message"]["content"])["answer"] == "hello"
    [request] = h.fake.requests
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers[PURPOSE_HEADER.lower()] == "reply"
    assert request.body == body  # exactly what the box asked for
    expected = 900 * 0.40 + 100 * 0.10 + 200 * 1.60  # gpt-4.1-mini, micro-USD
    assert h.spent() == round(expected)
    [row] = h.audit()
    assert (row["method"], row["verdict"], row["rule"], row["purpose"], row["cost_micros"]) == (
        "model.request", "allowed", "model-text", "reply", round(expected),
    )  # fmt: skip
    assert (
        row["imp"] == "pip"
        and row["run_id"] == "run-1"
        and row["channel_id"] == "c1"
        and row["latency_ms"] > 0
    )
    no_secret_anywhere(h)


@pytest.mark.parametrize(
    ("path", "body", "purpose", "usage", "expected_micros"),
    [
        ("/responses", {"model": "gpt-4.1", "input": "hi " * 700, "max_output_tokens": 100}, "reply",
         {"input_tokens": 2000, "output_tokens": 50, "cached_tokens": 1000}, 1000 * 2.0 + 1000 * 0.5 + 50 * 8.0),
        ("/embeddings", {"model": "text-embedding-3-small", "input": ["word " * 500, "word " * 500]}, "embedding",
         {"prompt_tokens": 5000}, 5000 * 0.02),
        ("/images/generations", {"model": "gpt-image-1", "prompt": "a cat", "n": 2}, "image",
         {"input_tokens": 10, "output_tokens": 100}, 10 * 5.0 + 100 * 40.0),
    ],
)  # fmt: skip
async def test_every_path_is_charged_by_its_own_usage(
    h: Harness, path: str, body: dict, purpose: str, usage: dict, expected_micros: float
) -> None:
    h.fake.script(b"png" if path.startswith("/images") else envelope(), path=path, usage=usage)
    result = await h.call("model.request", ModelRequestParams(path=path, body=body, purpose=purpose))  # type: ignore[arg-type]
    assert isinstance(result, ModelRequestResult) and result.status == 200
    assert h.spent() == round(expected_micros)


@pytest.mark.parametrize("status", [400, 429, 500, 503])
async def test_upstream_http_errors_are_results_with_their_status(h: Harness, status: int) -> None:
    h.fake.script(error(status, "nope", retry_after=7), purpose="reply")
    result = await h.call(
        "model.request", ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply")
    )
    assert isinstance(result, ModelRequestResult)
    assert result.status == status and result.body["error"]["message"] == "nope"
    assert result.headers.get("retry-after") == "7"
    assert h.spent() == 0  # an error with no usage generated nothing


async def test_an_upstream_that_cannot_be_reached_is_minus_32013_and_costs_nothing(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    h = make_harness(tmp_path, fake)
    fake.stop()  # nothing listens on that port any more
    error_ = await h.refused(
        "model.request",
        ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply"),
        ErrorCode.UPSTREAM_UNREACHABLE,
    )
    assert "cannot connect" in error_.message
    assert h.spent() == 0
    assert h.audit()[-1]["verdict"] == "unreachable"
    await h.gateway.aclose()


async def test_a_slow_upstream_times_out_and_the_estimate_is_charged(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    h = make_harness(tmp_path, fake, policy_with("[upstream]\ntimeout_s = 0.3\n"))
    fake.script(slow(envelope(), 5.0), purpose="reply")
    error_ = await h.refused(
        "model.request",
        ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply"),
        ErrorCode.UPSTREAM_UNREACHABLE,
    )
    assert "did not answer within 0.3 s" in error_.message
    assert h.spent() > 0  # it may have run upstream: charged at the estimate, not assumed free
    await h.gateway.aclose()


async def test_no_model_key_is_a_clear_error_and_no_upstream_call(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = make_harness(tmp_path, fake, api_key=None)
    error_ = await h.refused(
        "model.request",
        ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply"),
        ErrorCode.UPSTREAM_UNREACHABLE,
    )
    assert "OPENAI_API_KEY" in error_.message and "OPENAI_BASE_URL" in error_.message
    assert fake.requests == [] and sqlfile.query(h.db, "SELECT count(*) FROM ledger")[0][0] == 0


async def test_the_hard_stop_makes_no_upstream_request(h: Harness) -> None:
    h.gateway.ledger.set_limits("pip", daily_usd=0.001, monthly_usd=None)  # 1000 micro-USD
    h.fake.script(envelope(), purpose="reply", usage={"prompt_tokens": 10, "completion_tokens": 10})
    params = ModelRequestParams(
        path="/chat/completions", body={**CHAT_BODY, "max_completion_tokens": 100}, purpose="reply"
    )
    for _ in range(5):  # each reserves ~ 100 * 1.6 + a little; all fit
        await h.call("model.request", params)
    assert len(h.fake.requests) == 5
    h.gateway.ledger.set_limits(
        "pip", daily_usd=h.spent() / 1_000_000, monthly_usd=None
    )  # now nothing is left
    error_ = await h.refused("model.request", params, ErrorCode.BUDGET_EXHAUSTED)
    assert error_.data == {"ledger": "imp:pip/day", "retry_after": 12 * 3600}
    assert len(h.fake.requests) == 5  # the fake's record proves it: no call was made
    assert h.audit()[-1]["verdict"] == "budget_exhausted"


@pytest.mark.parametrize(
    ("path", "body", "purpose", "rule", "reason"),
    [
        pytest.param("/chat/completions", {**CHAT_BODY, "model": "text-embedding-3-small"}, "appraisal", "default-deny",
                     "no rule allows model 'text-embedding-3-small' for purpose 'appraisal'",
                     id="model-not-allowed-for-purpose"),  # issue 16: purposes select; no rule lists it
        pytest.param("/images/edits", {"model": "gpt-image-1", "prompt": "x"}, "reply", "default-deny",
                     "no rule allows model.request to /images/edits", id="path-outside-the-allow-list"),
        pytest.param("/chat/completions", {**CHAT_BODY, "max_completion_tokens": 100_000}, "reply", "model-text",
                     "over the limit of 4096 tokens", id="max-tokens-over-cap"),
        pytest.param("/chat/completions", {**CHAT_BODY, "messages": [{"role": "user", "content": "x" * 600_000}]},
                     "reply", "model-text", "over the limit of 524288 bytes", id="oversized-body"),
        pytest.param("/chat/completions", {**CHAT_BODY, "max_tokens": "many"}, "reply", "malformed-request",
                     "positive integer", id="cap-of-the-wrong-type"),
        pytest.param("/chat/completions", {**CHAT_BODY, "stream": True}, "reply", "malformed-request",
                     "streaming", id="streaming"),
        pytest.param("/chat/completions", {**CHAT_BODY, "model": "gpt-unpriced"}, "experiment", "prices",
                     "no price in the price table", id="price-table-missing-the-model"),
        pytest.param("/images/generations", {"model": "img-noprice", "prompt": "x"}, "image", "prices",
                     "no per-image price", id="price-without-a-per-image-price"),
    ],
)  # fmt: skip
async def test_model_requests_refused_by_policy_never_reach_the_upstream(
    tmp_path: Path, fake: FakeOpenAI, path: str, body: dict, purpose: str, rule: str, reason: str
) -> None:
    policy = policy_with(
        '[[rules]]\nname = "ops-models"\nmethod = "model.request"\naction = "allow"\npaths = ["/chat/completions"]\n'
        'purposes = { experiment = ["gpt-unpriced"] }\n'
        '[[rules]]\nname = "ops-images"\nmethod = "model.request"\naction = "allow"\npaths = ["/images/generations"]\n'
        'purposes = { image = ["img-noprice"] }\n[prices."img-noprice"]\ninput = 1.0\noutput = 1.0\n'
    )
    h = make_harness(tmp_path, fake, policy)
    error_ = await h.refused(
        "model.request", ModelRequestParams(path=path, body=body, purpose=purpose), ErrorCode.DENIED
    )  # type: ignore[arg-type]
    assert error_.data["rule"] == rule and reason in error_.data["reason"], error_.data
    assert error_.message.startswith(f"denied by policy rule {rule}: ")
    assert fake.requests == []
    assert sqlfile.query(h.db, "SELECT count(*) FROM ledger")[0][0] == 0
    row = h.audit()[-1]
    assert row["verdict"] == "denied" and row["rule"] == error_.data["rule"]
    await h.gateway.aclose()


def test_a_body_with_a_lone_surrogate_is_escaped_not_sent_as_broken_utf8() -> None:
    assert encode_body({"text": "caf\u00e9 \ud800"}) == b'{"text":"caf\\u00e9 \\ud800"}'
    assert encode_body({"text": "caf\u00e9"}) == '{"text":"café"}'.encode()


async def test_the_secret_never_reaches_the_box_even_if_the_upstream_echoes_it(h: Harness) -> None:
    h.fake.script(
        FakeResponse(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}}), purpose="reply"
    )
    result = await h.call(
        "model.request", ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply")
    )
    assert isinstance(result, ModelRequestResult) and result.status == 401
    assert "[redacted]" in result.body["error"]["message"]
    no_secret_anywhere(h)


# --- the protocol boundary --------------------------------------------------------------------------


class Sneaky(BaseModel):
    """A model.request with an extra field, as a hostile box could send it."""

    model_config = ConfigDict(extra="allow")
    path: Any
    body: Any
    purpose: Any


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        pytest.param(
            Sneaky(path="/chat/completions", body=CHAT_BODY, purpose="reply", imp="someone-else"),
            "imp",
            id="unknown-field",
        ),
        pytest.param(
            Sneaky(path="/chat/completions", body="not an object", purpose="reply"), "body", id="wrong-type"
        ),
        pytest.param(
            Sneaky(path="/v2/anything", body=CHAT_BODY, purpose="reply"), "path", id="path-not-in-protocol"
        ),
        pytest.param(
            Sneaky(path="/chat/completions", body=CHAT_BODY, purpose="Reply; DROP"),
            "purpose",
            id="bad-purpose",
        ),
    ],
)
async def test_the_peer_refuses_bad_params_before_the_gateway_runs(
    h: Harness, params: BaseModel, loc: str
) -> None:
    host_out, box_in = byte_pipe()
    box_out, host_in = byte_pipe()

    async def serve(method: str, p: BaseModel) -> BaseModel | None:
        return await h.gateway.serve(h.spec, method, p)

    async def refused(method: str, code: int, reason: str) -> None:
        await h.gateway.refused(h.spec, method, code, reason)

    host = Peer(host_in, host_out, serves=HOST_METHODS, calls=BOX_METHODS, handler=serve, on_refusal=refused)
    sneaky_calls = {**HOST_METHODS, "model.request": HOST_METHODS["model.request"]}
    box = Peer(box_in, box_out, serves=BOX_METHODS, calls=sneaky_calls, handler=serve)
    async with anyio.create_task_group() as tg:
        tg.start_soon(host.run)
        tg.start_soon(box.run)
        with pytest.raises(RpcError) as caught:
            with anyio.fail_after(5):
                await box.request("model.request", params)
        tg.cancel_scope.cancel()
    assert caught.value.code == ErrorCode.INVALID_PARAMS
    assert any(item["loc"].startswith(loc) for item in caught.value.data)
    assert h.fake.requests == []  # nothing executed ...
    (row,) = h.audit()  # ... but the attempt is on the record
    assert row["verdict"] == "invalid" and row["method"] == "model.request" and loc in row["reason"]


# --- discord.send ----------------------------------------------------------------------------------


async def test_a_reply_in_the_sessions_own_trusted_channel_is_delivered(h: Harness) -> None:
    result = await h.call("discord.send", DiscordSendParams(channel_id="c1", content="hello", reply_to="m1"))
    assert (
        isinstance(result, DiscordSendResult)
        and result.status == "delivered"
        and result.message_ids == ["rec-1"]
    )
    [sent] = h.surface.sent
    assert (sent.channel_id, sent.content, sent.reply_to, sent.kind) == ("c1", "hello", "m1", "reply")
    row = h.audit()[-1]
    assert (row["verdict"], row["rule"], row["purpose"]) == ("allowed", "send-own-channel", "reply")


async def test_files_are_decoded_host_side(h: Harness) -> None:
    import base64

    file = SendFile(filename="a.txt", data_b64=base64.b64encode(b"abc").decode())
    await h.call("discord.send", DiscordSendParams(channel_id="c1", content="see file", files=[file]))
    assert h.surface.sent[0].files[0].data == b"abc"


async def test_a_send_to_another_trusted_channel_from_an_untrusted_session_is_gated(h: Harness) -> None:
    """docs/architecture.md: never auto-send on the strength of the *target's* trust."""
    h.gateway.policy = policy_with(  # allow the send itself, so only trust decides
        '[[rules]]\nname = "send-announce"\nmethod = "discord.send"\naction = "allow"\nchannels = ["announce"]\n'
    )
    h.channel("guild-chat", kind="guild", trusted=False, guild_id="g1")  # the session: untrusted
    h.channel("announce", kind="guild", trusted=True, guild_id="g1")  # the target: trusted
    spec = BoxSpec("pip", "guild-chat", h.spec.state_dir, run_id="run-2")
    result = await h.call(
        "discord.send", DiscordSendParams(channel_id="announce", content="hi all", kind="other"), spec
    )
    assert isinstance(result, DiscordSendResult) and result.status == "pending" and result.gate_id
    assert h.surface.sent == []
    gate = h.gateway.gates.get(result.gate_id)
    assert (gate.state, gate.target, gate.origin_guild, gate.payload["content"]) == (
        "pending",
        "announce",
        "g1",
        "hi all",
    )
    row = h.audit()[-1]
    assert row["verdict"] == "gated" and row["gate_id"] == result.gate_id


async def test_a_trusted_session_sending_elsewhere_is_gated_too(h: Harness) -> None:
    h.gateway.policy = policy_with(
        '[[rules]]\nname = "x"\nmethod = "discord.send"\naction = "allow"\nchannels = ["dm-2"]\n'
    )
    h.channel("dm-2", kind="dm")
    result = await h.call("discord.send", DiscordSendParams(channel_id="dm-2", content="psst"))
    assert isinstance(result, DiscordSendResult) and result.status == "pending" and h.surface.sent == []


async def test_the_sessions_own_untrusted_channel_is_gated(h: Harness) -> None:
    h.channel("guild-chat", kind="guild", trusted=False)
    spec = BoxSpec("pip", "guild-chat", h.spec.state_dir)
    result = await h.call("discord.send", DiscordSendParams(channel_id="guild-chat", content="hi"), spec)
    assert isinstance(result, DiscordSendResult) and result.status == "pending" and h.surface.sent == []


async def test_an_unknown_channel_is_untrusted(h: Harness) -> None:
    spec = BoxSpec("pip", "never-seen", h.spec.state_dir)
    result = await h.call("discord.send", DiscordSendParams(channel_id="never-seen", content="hi"), spec)
    assert isinstance(result, DiscordSendResult) and result.status == "pending"


async def test_a_staff_channel_rule_with_trust_auto_delivers(h: Harness) -> None:
    h.gateway.policy = policy_with('[channels]\nstaff = ["staff-1"]\n')
    h.channel("staff-1", kind="guild", trusted=False)
    result = await h.call(
        "discord.send", DiscordSendParams(channel_id="staff-1", content="note", kind="staff")
    )
    assert isinstance(result, DiscordSendResult) and result.status == "delivered"
    assert h.audit()[-1]["rule"] == "send-staff"


async def test_an_imps_own_staff_channel_counts_as_staff(h: Harness) -> None:
    h.gateway.staff_channels = {"pip": ("pip-staff",)}
    result = await h.call(
        "discord.send", DiscordSendParams(channel_id="pip-staff", content="note", kind="staff")
    )
    assert isinstance(result, DiscordSendResult) and result.status == "delivered"
    other = BoxSpec("bob", "c1", h.spec.state_dir)
    await h.refused(
        "discord.send", DiscordSendParams(channel_id="pip-staff", content="note"), ErrorCode.DENIED, other
    )


@pytest.mark.parametrize(
    ("params", "rule", "reason"),
    [
        pytest.param(DiscordSendParams(channel_id="elsewhere", content="hi"), "default-deny", "neither this session", id="channel-not-allowed"),
        pytest.param(DiscordSendParams(channel_id="c1", content="x" * 8001), "send-own-channel", "8001 characters", id="oversized-content"),
        pytest.param(DiscordSendParams(channel_id="c1", content="x", files=[SendFile(filename=f"{i}.txt", data_b64="eA==") for i in range(5)]),
                     "send-own-channel", "5 files", id="too-many-files"),
        pytest.param(DiscordSendParams(channel_id="c1", content="x", files=[SendFile(filename="a", data_b64="@@@")]),
                     "malformed-request", "not valid base64", id="bad-base64"),
    ],
)  # fmt: skip
async def test_refused_sends_send_nothing_and_open_no_gate(
    h: Harness, params: DiscordSendParams, rule: str, reason: str
) -> None:
    error_ = await h.refused("discord.send", params, ErrorCode.DENIED)
    assert error_.data["rule"] == rule and reason in error_.data["reason"]
    assert h.surface.sent == [] and h.gateway.gates.latest() == []


async def test_sends_are_rate_limited_per_channel(h: Harness) -> None:
    h.gateway.policy = policy_with(
        '[[rules]]\nname = "slow-sends"\nmethod = "discord.send"\naction = "allow"\nchannels = ["own"]\nrate_per_minute = 2\n'
    )
    params = DiscordSendParams(channel_id="c1", content="hi")
    await h.call("discord.send", params)
    h.clock.advance(seconds=10)
    await h.call("discord.send", params)
    error_ = await h.refused("discord.send", params, ErrorCode.RATE_LIMITED)
    assert error_.data == {"retry_after": 50.0, "rule": "slow-sends"}
    assert len(h.surface.sent) == 2 and h.audit()[-1]["verdict"] == "rate_limited"
    h.clock.advance(seconds=51)
    await h.call("discord.send", params)
    assert len(h.surface.sent) == 3


async def test_a_surface_failure_is_minus_32013(h: Harness) -> None:
    h.surface.fail_with = "discord is down"
    error_ = await h.refused(
        "discord.send", DiscordSendParams(channel_id="c1", content="hi"), ErrorCode.UPSTREAM_UNREACHABLE
    )
    assert "discord is down" in error_.message


# --- http.fetch ------------------------------------------------------------------------------------


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://elsewhere.example/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"<html><script>steal()</script><p>Hello <b>world</b></p></html>"
        if self.path == "/big":
            body = b"<p>" + b"a" * 50_000 + b"</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    with local_site(_Page) as address:
        yield address


FETCH_LOOPBACK = (
    '[[rules]]\nname = "fetch-test-site"\nmethod = "http.fetch"\naction = "allow"\nhosts = ["127.0.0.1", "localhost"]\n'
    "allow_loopback = true\nmax_fetch_bytes = 1000\nrate_per_minute = 3\n"
)


async def test_fetch_is_denied_by_default(h: Harness, site: str) -> None:
    error_ = await h.refused("http.fetch", HttpFetchParams(url=f"http://{site}/"), ErrorCode.DENIED)
    assert error_.data["rule"] == "default-deny" and "allow-list" in error_.data["reason"]


async def test_an_allowed_fetch_returns_text_extracted_on_the_host(h: Harness, site: str) -> None:
    h.gateway.policy = policy_with(FETCH_LOOPBACK)
    result = await h.call("http.fetch", HttpFetchParams(url=f"http://{site}/"))
    assert result.status == 200 and result.text == "Hello world" and not result.truncated  # type: ignore[union-attr]
    big = await h.call("http.fetch", HttpFetchParams(url=f"http://{site}/big"))
    assert big.truncated and len(big.text) <= 1000  # type: ignore[union-attr]
    redirect = await h.call("http.fetch", HttpFetchParams(url=f"http://{site}/redirect"))
    assert redirect.status == 302 and "not followed" in redirect.text  # type: ignore[union-attr]
    await h.refused("http.fetch", HttpFetchParams(url=f"http://{site}/"), ErrorCode.RATE_LIMITED)
    assert [row["verdict"] for row in h.audit()] == ["allowed", "allowed", "allowed", "rate_limited"]


async def test_an_allow_listed_host_that_resolves_to_loopback_is_refused(h: Harness, site: str) -> None:
    h.gateway.policy = policy_with(FETCH_LOOPBACK.replace("allow_loopback = true\n", ""))
    port = site.rsplit(":", 1)[1]
    for url in (f"http://{site}/", f"http://localhost:{port}/"):
        error_ = await h.refused("http.fetch", HttpFetchParams(url=url), ErrorCode.DENIED)
        assert error_.data["rule"] == "egress" and "loopback" in error_.data["reason"]


async def test_fetch_refuses_urls_with_credentials_and_other_schemes(h: Harness) -> None:
    h.gateway.policy = policy_with(FETCH_LOOPBACK)
    for url in ("http://u:p@127.0.0.1/", "file:///etc/passwd", "gopher://127.0.0.1/"):
        error_ = await h.refused("http.fetch", HttpFetchParams(url=url), ErrorCode.DENIED)
        assert error_.data["rule"] == "malformed-request"


# --- notifications ---------------------------------------------------------------------------------


async def test_each_method_is_served_by_one_act_registered_by_the_host(h: Harness) -> None:
    """The gateway by act (issue 35): the host registered the five acts; a second act for a method is refused."""
    served = {method for act in h.gateway.acts for method in act.methods}
    assert {"model.request", "discord.send", "http.fetch", "history.load", "history.commit"} <= served
    assert {name for name in served if name.startswith("memory.")} == set(MEMORY_METHOD_NAMES)
    with pytest.raises(ValueError, match="already served: http.fetch"):
        h.gateway.register(FetchAct(HttpFetcher(h.gateway.policy.http)))


async def test_turn_stage_reaches_the_callback_and_log_the_logger(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    await h.gateway.turn_stage(h.spec, TurnStageParams(message_id="m1", stage="render"))
    assert h.stages == ["pip:render"]
    with pytest.raises(RpcError) as caught:  # a stage is a notification of its own (BoxHost.turn_stage)
        await h.call("turn.stage", TurnStageParams(message_id="m1", stage="render"))
    assert caught.value.code == ErrorCode.METHOD_NOT_FOUND
    with caplog.at_level(logging.INFO, logger="impyard.box.pip"):
        await h.call("log", LogParams(level="warning", message="box says hi", fields={"n": 1}))
    assert any(r.name == "impyard.box.pip" and "box says hi" in r.getMessage() for r in caplog.records)
    assert h.audit() == []  # notifications are not requests


# --- end to end through a real box -------------------------------------------------------------------


@dataclass
class Watching(QuietHost):
    """Wraps the gateway and keeps everything it hands to the box."""

    gateway: Gateway
    handed_to_box: list[str] = field(default_factory=list)

    async def turn_stage(self, spec: BoxSpec, params: TurnStageParams, *, woken: bool = False) -> None:
        await self.gateway.turn_stage(spec, params, woken=woken)

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        try:
            result = await self.gateway.serve(spec, method, params)
        except RpcError as exc:
            self.handed_to_box.append(json.dumps(exc.to_wire()))
            raise
        if result is not None:
            self.handed_to_box.append(result.model_dump_json())
        return result


async def test_end_to_end_a_real_box_replies_through_the_gateway(
    tmp_path: Path, fake: FakeOpenAI, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # in the host's environment, as in real use
    h = make_harness(tmp_path, fake)
    fake.script(envelope(answer="hello ann"), purpose="reply", schema_name="envelope",
                usage={"prompt_tokens": 300, "completion_tokens": 40})  # fmt: skip
    watching = Watching(h.gateway)
    run_id = (
        f"e2e-{uuid.uuid4().hex[:8]}"  # the container's name: unique beside another worker's run of this test
    )
    spec = BoxSpec("pip", "c1", tmp_path / "state", run_id=run_id)
    async with backend.open(spec, watching) as box:
        await box.init(init_params(imp="pip", channel_id="c1", kind="dm"), timeout=60)
        result = await box.deliver(deliver_params("hi pip", "m1"), timeout=60)
    assert result.outcome == "sent" and result.message_ids == ["rec-1"]
    [sent] = h.surface.sent
    assert (sent.channel_id, sent.content, sent.reply_to) == ("c1", "hello ann", "m1")
    [request] = fake.requests
    assert request.purpose == "reply" and request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["response_format"]["json_schema"]["name"] == "envelope"
    assert h.spent() == round(300 * 1.25 + 40 * 10.00)  # gpt-5.1, the default model (issue 16)
    rows = h.audit()
    assert [(r["method"], r["verdict"]) for r in rows] == [
        ("model.request", "allowed"),
        ("discord.send", "allowed"),
        ("history.commit", "allowed"),  # issue 22: the turn's own lines (its load folded in)
    ]
    assert all(r["run_id"] == run_id for r in rows)
    assert KEY not in json.dumps(rows) and not any(KEY in text for text in watching.handed_to_box)
    assert KEY not in box_environment(spec.state_dir).values() and os.environ["OPENAI_API_KEY"] == KEY
    assert not any(KEY in str(path.read_bytes()) for path in spec.state_dir.rglob("*") if path.is_file())
    await h.gateway.aclose()
    h.db.close()


async def test_end_to_end_a_refusal_reaches_the_box_as_a_legible_failure(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    from testing.inprocess import InProcessBackend

    h = make_harness(
        tmp_path,
        fake,
        policy_with(
            '[[rules]]\nname = "no-replies"\nmethod = "model.request"\naction = "deny"\nreason = "pip is on a break"\n'
        ),
    )
    spec = BoxSpec("pip", "c1", tmp_path / "state")
    async with InProcessBackend().open(spec, h.gateway) as box:
        await box.init(init_params(imp="pip", channel_id="c1", kind="dm"), timeout=30)
        result = await box.deliver(deliver_params("hi", "m1"), timeout=30)
    assert (
        result.outcome == "failed"
        and "no-replies" in (result.error or "")
        and "pip is on a break" in (result.error or "")
    )
    assert fake.requests == [] and h.surface.sent == []
    await h.gateway.aclose()
    h.db.close()


_ = NOW  # the scripted helpers' fixed time


@pytest.mark.parametrize("audit_fails_too", [False, True])
async def test_a_full_disk_is_said_to_the_box_as_the_hosts_storage(h: Harness, audit_fails_too: bool) -> None:
    """Issue 19 #1: a write of the host's own database fails (here the budget reservation, and perhaps the audit
    row after it): the box gets an internal error whose data says ``store`` — so the person reads that the disk
    is full, not "something went wrong" — never a raw exception, and nothing goes upstream."""
    import sqlite3

    def disk_full(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    h.gateway.ledger.reserve = disk_full  # type: ignore[method-assign]
    if audit_fails_too:
        h.gateway.audit.write = disk_full  # type: ignore[method-assign]
    params = ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply")
    error_ = await h.refused("model.request", params, ErrorCode.INTERNAL_ERROR)
    assert error_.data == {"kind": "store"} and "disk full or read-only" in error_.message
    assert h.fake.requests == []
