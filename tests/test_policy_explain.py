"""`impyard policy check --method …` asks the gateway's own decision (issue 12): a dry run, not a copy.

Each sample request goes twice: through the CLI (a dry run on the home's database) and through the live
gateway (``Gateway.serve`` against the loopback fake OpenAI, a RecordingSurface for sends, a loopback site
for fetches). Both must give the same verdict, rule and error code, and the table says which. The rows
marked "old CLI" are ones the hand-made explanation got wrong. The dry run itself must leave no trace:
no audit, ledger or gate row, no rate-meter event, nothing upstream or posted.
"""

from __future__ import annotations

import http.server
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
from box.protocol.models import DiscordSendParams, DiscordSendResult, HttpFetchParams, ModelRequestParams
from impyard.backends import BoxSpec
from impyard.cli import cli
from impyard.clock import FixedClock, SystemClock
from impyard.gateway.audit import AuditLog, AuditRecord
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.core import Gateway
from impyard.gateway.gates import GateStore
from impyard.gateway.ledger import Ledger
from impyard.gateway.policy import Policy, load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.gateway.trust import ChannelInfo, DbChannelTrust
from impyard.host import build_gateway
from impyard.storage.db import Database, default_path, open_database
from testing.fake_openai import FakeOpenAI, envelope
from testing.web import local_site
from tests import sqlfile

KEY = "sk-impyard-explain-test-7d1e44a0c9"
OPS = """\
[upstream]
max_request_bytes = 20000          # below model-text's max_body_bytes: the gateway's own size check decides

[[rules]]
name = "ops-experiment"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
purposes = { experiment = ["gpt-unpriced"] }

[[rules]]
name = "send-announce"
method = "discord.send"
action = "allow"
channels = ["announce"]

[[rules]]
name = "fetch-test-site"
method = "http.fetch"
action = "allow"
hosts = ["127.0.0.1"]
allow_loopback = true
"""
CHAT: dict[str, Any] = {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]}


def chat(**extra: Any) -> dict[str, Any]:
    return {**CHAT, **extra}


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"hello from the test site"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass(frozen=True)
class Case:
    """One sample request: the CLI's options for it, the same request as the box sends it, the expected answer."""

    method: str
    cli: tuple[str, ...]  # "{site}" is the loopback site's host:port
    params: Callable[[str], BaseModel]
    verdict: str
    rule: str
    session: str = "c1"  # the box's session channel (c1: a DM, trusted; g1: a guild channel, untrusted)
    key: bool = True  # whether the host has a model key
    tiny_budget: bool = False  # pip's daily budget cannot cover one call


def model(body: dict[str, Any], purpose: str = "reply") -> Callable[[str], BaseModel]:
    return lambda site: ModelRequestParams(path="/chat/completions", body=body, purpose=purpose)


def body_args(body: dict[str, Any], purpose: str = "reply") -> tuple[str, ...]:
    return (
        "--method",
        "model.request",
        "--path",
        "/chat/completions",
        "--purpose",
        purpose,
        "--body",
        json.dumps(body),
    )


def send(channel: str, chars: int = 5) -> Callable[[str], BaseModel]:
    return lambda site: DiscordSendParams(channel_id=channel, content="x" * chars)


HOSTED_TOOL = chat(tools=[{"type": "web_search"}])
FOREIGN_IMAGE = chat(messages=[{"role": "user", "content": [
    {"type": "text", "text": "what is this?"},
    {"type": "image_url", "image_url": {"url": "https://images.example/cat.png"}},
]}])  # fmt: skip
CASES = [
    pytest.param(Case("model.request", body_args(CHAT), model(CHAT), "allowed", "model-text"), id="model-allowed"),
    pytest.param(Case("model.request", ("--method", "model.request", "--model", "gpt-4.1-mini", "--body-bytes", "600000"),
                      model(chat(messages=[{"role": "user", "content": "x" * 600_000}])), "denied", "model-text"),
                 id="over-the-rules-max-body-bytes"),
    pytest.param(Case("model.request", body_args(chat(messages=[{"role": "user", "content": "x" * 30_000}])),
                      model(chat(messages=[{"role": "user", "content": "x" * 30_000}])), "denied", "upstream-limits"),
                 id="old-cli-over-the-upstream-request-size"),
    pytest.param(Case("model.request", body_args(HOSTED_TOOL), model(HOSTED_TOOL), "denied", "model-text"),
                 id="old-cli-hosted-tool-in-the-body"),
    pytest.param(Case("model.request", body_args(FOREIGN_IMAGE), model(FOREIGN_IMAGE), "denied", "model-text"),
                 id="old-cli-image-url-on-a-host-not-allowed"),
    pytest.param(Case("model.request", body_args(chat(service_tier="flex")), model(chat(service_tier="flex")),
                      "denied", "prices"), id="old-cli-unpriced-service-tier"),
    pytest.param(Case("model.request", ("--method", "model.request", "--model", "gpt-4.1-mini", "--max-tokens", "100000"),
                      model(chat(max_completion_tokens=100_000)), "denied", "model-text"), id="output-cap-over-the-rule"),
    pytest.param(Case("model.request", body_args(chat(model="gpt-unpriced"), "experiment"),
                      model(chat(model="gpt-unpriced"), "experiment"), "denied", "prices"), id="model-without-a-price"),
    pytest.param(Case("model.request", body_args(CHAT), model(CHAT), "budget_exhausted", "budget", tiny_budget=True),
                 id="old-cli-budget-exhausted"),
    pytest.param(Case("model.request", body_args(CHAT), model(CHAT), "unreachable", "model-text", key=False),
                 id="old-cli-no-model-key"),
    pytest.param(Case("model.request", body_args(HOSTED_TOOL), model(HOSTED_TOOL), "denied", "model-text", key=False,
                      tiny_budget=True), id="the-judge-before-the-key-and-the-budget"),
    pytest.param(Case("discord.send", ("--method", "discord.send", "--channel", "c1", "--content-chars", "5"), send("c1"),
                      "allowed", "send-own-channel"), id="send-own-trusted-channel"),
    pytest.param(Case("discord.send", ("--method", "discord.send", "--channel", "g1", "--content-chars", "5"), send("g1"),
                      "gated", "send-own-channel", session="g1"), id="send-own-untrusted-channel-is-gated"),
    pytest.param(Case("discord.send", ("--method", "discord.send", "--channel", "announce", "--content-chars", "5"),
                      send("announce"), "gated", "send-announce"), id="send-elsewhere-is-gated"),
    pytest.param(Case("discord.send", ("--method", "discord.send", "--channel", "elsewhere"), send("elsewhere", 1),
                      "denied", "default-deny"), id="send-to-a-channel-no-rule-allows"),
    pytest.param(Case("discord.send", ("--method", "discord.send", "--channel", "c1", "--content-chars", "8001"),
                      send("c1", 8001), "denied", "send-own-channel"), id="send-over-the-content-limit"),
    pytest.param(Case("http.fetch", ("--method", "http.fetch", "--url", "http://{site}/page"),
                      lambda site: HttpFetchParams(url=f"http://{site}/page"), "allowed", "fetch-test-site"),
                 id="fetch-allowed"),
    pytest.param(Case("http.fetch", ("--method", "http.fetch", "--host", "example.com"),
                      lambda site: HttpFetchParams(url="https://example.com/"), "denied", "default-deny"),
                 id="fetch-a-host-not-on-the-allow-list"),
    pytest.param(Case("http.fetch", ("--method", "http.fetch", "--url", "https://user:pw@example.com/"),
                      lambda site: HttpFetchParams(url="https://user:pw@example.com/"), "denied", "malformed-request"),
                 id="fetch-with-credentials"),
]  # fmt: skip


@dataclass
class Yard:
    """A home with a database and an operator policy directory; the CLI and the live gateway share both."""

    home: Path
    ops: Path
    policy: Policy
    db: Database
    fake: FakeOpenAI
    surface: RecordingSurface
    site: str

    def check(self, *args: str, session: str = "c1", key: bool = True) -> dict[str, Any]:
        """``impyard policy check OPS --imp pip --session-channel SESSION ARGS --json``'s sample."""
        env = {"COLUMNS": "200", **({"OPENAI_API_KEY": KEY} if key else {})}
        argv = [
            "policy",
            "check",
            str(self.ops),
            "--imp",
            "pip",
            "--session-channel",
            session,
            *args,
            "--json",
        ]
        result = CliRunner(env=env).invoke(
            cli, [arg.replace("{site}", self.site) for arg in argv], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        sample: dict[str, Any] = json.loads(result.output)["sample"]
        return sample

    def gateway(self, *, key: bool = True) -> Gateway:
        return build_gateway(
            policy=self.policy, db=self.db, surface=self.surface, clock=SystemClock(),
            upstream=UpstreamConfig(base_url=self.fake.base_url, api_key=KEY if key else None), secrets=[KEY],
        )  # fmt: skip

    async def live(
        self, method: str, params: BaseModel, *, session: str = "c1", key: bool = True
    ) -> tuple[str, str, int | None]:
        """What the live gateway answered: the audit row's verdict and rule, and the error code (None: a result)."""
        gateway = self.gateway(key=key)
        code = None
        try:
            await gateway.serve(BoxSpec("pip", session, self.home / "state", run_id="live"), method, params)
        except RpcError as exc:
            code = exc.code
        finally:
            await gateway.aclose()
        row = sqlfile.query(self.db, "SELECT verdict, rule FROM audit ORDER BY id DESC LIMIT 1")[0]
        return row["verdict"], row["rule"], code

    def dump(self) -> list[str]:
        """Every row of the home's database, as another process would read it."""
        conn = sqlite3.connect(default_path())
        try:
            return list(conn.iterdump())
        finally:
            conn.close()


@pytest.fixture
def yard(impyard_home: Path, tmp_path: Path) -> Iterator[Yard]:
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "ops.toml").write_text(OPS)
    db = open_database()  # the home's database: the CLI reads it, the live gateway writes it
    channels = DbChannelTrust(db, SystemClock())
    channels.upsert(ChannelInfo("c1", kind="dm"))  # trusted
    channels.upsert(ChannelInfo("g1", kind="guild", trusted=False, guild_id="guild-1"))
    channels.upsert(ChannelInfo("announce", kind="guild", trusted=True, guild_id="guild-1"))
    with FakeOpenAI(api_key=KEY) as fake, local_site(_Page) as site:
        fake.script(
            envelope(answer="hi"), purpose="reply", usage={"prompt_tokens": 10, "completion_tokens": 5}
        )
        yield Yard(impyard_home, ops, load_policy(ops, require_dir=True), db, fake, RecordingSurface(), site)
    db.close()


@pytest.mark.parametrize("case", CASES)
def test_policy_check_gives_the_verdict_and_rule_the_live_gateway_gives(yard: Yard, case: Case) -> None:
    if case.tiny_budget:
        Ledger(yard.db, yard.policy, SystemClock()).set_limits("pip", daily_usd=0.0001, monthly_usd=None)
    before = yard.dump()

    sample = yard.check(*case.cli, session=case.session, key=case.key)

    assert (sample["verdict"], sample["rule"]) == (case.verdict, case.rule), sample
    assert sample["allowed"] is (case.verdict in ("allowed", "gated"))
    assert yard.dump() == before  # the dry run wrote nothing: no audit, ledger or gate row
    assert yard.fake.requests == [] and yard.surface.sent == []  # ... and sent nothing anywhere

    params = case.params(yard.site)
    verdict, rule, code = anyio.run(
        lambda: yard.live(case.method, params, session=case.session, key=case.key)
    )
    assert (verdict, rule) == (sample["verdict"], sample["rule"])
    assert code == sample.get("code")
    if case.method == "discord.send" and case.verdict != "denied":
        assert sample["trust"]["mode"] == ("gate" if case.verdict == "gated" else "auto")


def test_the_text_output_says_what_the_gateway_would_answer(yard: Yard) -> None:
    Ledger(yard.db, yard.policy, SystemClock()).set_limits("pip", daily_usd=0.0001, monthly_usd=None)
    args = [
        "policy",
        "check",
        str(yard.ops),
        "--imp",
        "pip",
        "--method",
        "model.request",
        "--model",
        "gpt-4.1-mini",
    ]
    runner = CliRunner(env={"COLUMNS": "300", "OPENAI_API_KEY": KEY})
    exhausted = runner.invoke(cli, args, catch_exceptions=False)
    assert exhausted.exit_code == 0, exhausted.output
    assert (
        "sample model.request by pip: budget exhausted by rule budget: budget imp:pip/day has $0.0001"
        in exhausted.output
    )
    Ledger(yard.db, yard.policy, SystemClock()).clear_limits("pip")
    allowed = runner.invoke(cli, args, catch_exceptions=False).output
    assert (
        "sample model.request by pip: allowed by rule model-text: allowed\n  reserves up to $0.00" in allowed
    )
    gated = runner.invoke(cli, ["policy", "check", str(yard.ops), "--imp", "pip", "--method", "discord.send",
                                "--session-channel", "c1", "--channel", "announce"]).output  # fmt: skip
    assert (
        "allowed by rule send-announce: allowed\n  then: gate (the target is not the session's own channel: gate)"
        in gated
    )


# --- the gateway's dry run --------------------------------------------------------------------------


SLOW = """
[[rules]]
name = "model-text"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
purposes = { reply = ["gpt-4.1-mini"] }
rate_per_minute = 2

[[rules]]
name = "slow-sends"
method = "discord.send"
action = "allow"
channels = ["own", "announce"]
rate_per_minute = 2
"""


@pytest.fixture
async def slow_yard(yard: Yard) -> Yard:
    (yard.ops / "slow.toml").write_text(SLOW)
    yard.policy = load_policy(yard.ops, require_dir=True)
    return yard


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "params"),
    [
        pytest.param(
            "model.request",
            ModelRequestParams(path="/chat/completions", body=CHAT, purpose="reply"),
            id="model",
        ),
        pytest.param("discord.send", DiscordSendParams(channel_id="c1", content="hi"), id="send"),
    ],
)
async def test_a_rate_limit_already_reached_is_what_the_dry_run_says(
    slow_yard: Yard, method: str, params: BaseModel
) -> None:
    yard = slow_yard
    gateway = yard.gateway()
    spec = BoxSpec("pip", "c1", yard.home / "state")
    for _ in range(5):  # peeking takes no event from the meter
        assert (await gateway.dry_run(spec, method, params)).verdict == "allowed"
    await gateway.serve(spec, method, params)
    await gateway.serve(spec, method, params)  # both within the rule's 2 per minute
    Ledger(yard.db, yard.policy, SystemClock()).set_limits("pip", daily_usd=0.0, monthly_usd=None)
    before = yard.dump()

    decision = await gateway.dry_run(spec, method, params)

    rule = "model-text" if method == "model.request" else "slow-sends"
    assert (decision.verdict, decision.rule, decision.allowed) == (
        "rate_limited",
        rule,
        False,
    )  # before the budget
    assert decision.error is not None and decision.error.code == ErrorCode.RATE_LIMITED
    assert yard.dump() == before
    with pytest.raises(RpcError) as caught:
        await gateway.serve(spec, method, params)
    assert caught.value.code == decision.error.code and caught.value.data["rule"] == decision.rule
    row = sqlfile.query(yard.db, "SELECT verdict, rule FROM audit ORDER BY id DESC LIMIT 1")[0]
    assert (row["verdict"], row["rule"]) == (decision.verdict, decision.rule)
    await gateway.aclose()


@pytest.mark.anyio
async def test_a_dry_run_reserves_nothing_opens_no_gate_posts_nothing_and_audits_nothing(
    slow_yard: Yard,
) -> None:
    yard = slow_yard
    gateway = yard.gateway()
    spec = BoxSpec("pip", "c1", yard.home / "state")
    model = ModelRequestParams(path="/chat/completions", body=CHAT, purpose="reply")
    own = DiscordSendParams(channel_id="c1", content="hi")
    elsewhere = DiscordSendParams(channel_id="announce", content="hi all")
    before = yard.dump()

    allowed = await gateway.dry_run(spec, "model.request", model)
    delivered = await gateway.dry_run(spec, "discord.send", own)
    gated = await gateway.dry_run(spec, "discord.send", elsewhere)

    assert (allowed.verdict, allowed.rule) == ("allowed", "model-text") and (allowed.estimate_micros or 0) > 0
    assert delivered.verdict == "allowed" and delivered.trust is not None and delivered.trust.mode == "auto"
    assert (
        gated.verdict == "gated" and gated.allowed and gated.trust is not None and gated.trust.mode == "gate"
    )
    assert yard.dump() == before  # no ledger reservation, no gate, no audit row
    assert yard.fake.requests == [] and yard.surface.sent == []
    # what the dry run promised, the live gateway does: the call is charged its measured cost, within the estimate
    await gateway.serve(spec, "model.request", model)
    [reserved] = sqlfile.query(yard.db, "SELECT reserved_micros FROM ledger")
    assert reserved[0] == allowed.estimate_micros
    result = await gateway.serve(spec, "discord.send", elsewhere)
    assert isinstance(result, DiscordSendResult) and result.status == "pending"
    await gateway.aclose()


@pytest.mark.anyio
async def test_dry_run_takes_only_the_params_of_a_judged_method(yard: Yard) -> None:
    gateway = yard.gateway()
    with pytest.raises(ValueError, match="dry_run takes"):
        await gateway.dry_run(
            BoxSpec("pip", "c1", yard.home), "model.request", DiscordSendParams(channel_id="c1", content="x")
        )
    await gateway.aclose()


@pytest.mark.anyio
async def test_a_dry_run_shows_no_secret_of_the_host(yard: Yard) -> None:
    params = ModelRequestParams(
        path="/chat/completions", body={**CHAT, KEY: 1}, purpose="reply"
    )  # a hostile key name
    gateway = yard.gateway()
    decision = await gateway.dry_run(BoxSpec("pip", "c1", yard.home), "model.request", params)
    await gateway.aclose()
    assert decision.verdict == "denied" and "[redacted]" in decision.reason and KEY not in decision.reason
    assert decision.error is not None and KEY not in json.dumps(decision.error.to_wire())


def test_policy_check_writes_nothing_to_the_home_database(yard: Yard) -> None:
    """An abandoned reservation stays for the host to settle; audit rows and gates stay as they are."""
    clock = FixedClock(SystemClock().now() - timedelta(hours=2))
    Ledger(yard.db, yard.policy, clock).reserve(
        "pip", 5_000
    )  # a crashed host's: any gateway at start would settle it
    audit = AuditLog(yard.db, clock, [])
    audit.write(AuditRecord(imp="pip", method="model.request", verdict="allowed", rule="model-text"))
    GateStore(yard.db, clock, audit).open(
        imp="pip", run_id="r1", session_channel="g1", origin_guild="guild-1", act="discord.send", target="announce",
        payload={"channel_id": "announce", "content": "hi", "reply_to": None, "files": [], "kind": "other"},
        reason="gate", deadline=timedelta(hours=24),
    )  # fmt: skip
    before = yard.dump()
    for case in CASES:
        yard.check(*case.values[0].cli, session=case.values[0].session)
    assert yard.dump() == before
    assert yard.fake.requests == [] and yard.surface.sent == []


def test_policy_check_without_a_home_database_creates_none(impyard_home: Path) -> None:
    result = CliRunner(env={"OPENAI_API_KEY": KEY}).invoke(
        cli,
        ["policy", "check", "--imp", "pip", "--method", "model.request", "--model", "gpt-4.1-mini", "--json"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["sample"]["verdict"] == "allowed"
    assert not default_path().exists() and not impyard_home.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "http.fetch"], "http.fetch needs --host or --url"),
        (["--method", "model.request", "--body", "[1, 2]"], "--body must be a JSON object"),
        (["--method", "model.request", "--body", "{nope"], "--body is not valid JSON"),
        (
            ["--method", "model.request", "--body", "{}", "--body-bytes", "10"],
            "--body-bytes pads the sample body",
        ),
        (
            ["--method", "model.request", "--path", "/embeddings", "--max-tokens", "5"],
            "--max-tokens applies to",
        ),
        (["--method", "model.request", "--purpose", "Not A Purpose"], "not one a box can send (purpose:"),
        (["--method", "discord.send", "--content-chars", "20001"], "not one a box can send (content:"),
    ],
)
def test_a_sample_request_a_box_could_not_send_is_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["policy", "check", *args])
    assert result.exit_code == 1 and message in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
