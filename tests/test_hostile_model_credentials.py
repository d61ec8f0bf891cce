"""Credentials in OPENAI_BASE_URL never leave the host (issue 11 #9).

A proxy's ``user:password@`` and a ``?key=`` in the base URL are secrets like the model key: the error a
box gets when the upstream is down, the box's journal, the audit, the host's log lines and ``impyard
doctor`` show the URL with them replaced by [redacted].
"""

from __future__ import annotations

import base64
import json
import logging
import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from box.protocol import ErrorCode, RpcError
from box.protocol.models import ModelRequestParams, ModelRequestResult
from impyard.backends import BoxSpec
from impyard.backends.process import ProcessBackend
from impyard.cli import cli
from impyard.clock import FixedClock
from impyard.gateway.audit import AuditRecord, known_secrets, redact_url, url_secrets
from impyard.gateway.broker import ModelBroker, UpstreamConfig, UpstreamUnreachable, encode_body
from impyard.gateway.policy import load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.host import build_gateway
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI, FakeResponse
from tests import sqlfile
from tests.scripted import deliver_params, init_params

pytestmark = pytest.mark.anyio

KEY = "sk-impyard-test-credentials-5d2f"
USER = "proxy-user-7f3a"
PASSWORD = "proxy-pass-9c2e"
QUERY_KEY = "query-secret-55aa"
CREDENTIALS = (USER, PASSWORD, QUERY_KEY)
CHAT = {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 20}


@pytest.fixture
def dead_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_url(host: str) -> str:
    return f"http://{USER}:{PASSWORD}@{host}/v1?key={QUERY_KEY}"


def leaked(text: str) -> list[str]:
    return [secret for secret in CREDENTIALS if secret in text]


@pytest.mark.parametrize("configured", ["environment", "explicit"])
async def test_an_unreachable_proxy_is_reported_without_its_credentials(
    tmp_path: Path,
    dead_port: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    configured: str,
) -> None:
    url = base_url(f"127.0.0.1:{dead_port}")
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    db = open_database(tmp_path / "impyard.db")
    extra = (
        {}
        if configured == "environment"
        else {"upstream": UpstreamConfig(base_url=url, api_key=KEY), "secrets": [KEY]}
    )
    gateway = build_gateway(
        policy=load_policy(),
        db=db,
        surface=RecordingSurface(),
        clock=FixedClock(datetime(2026, 5, 10, tzinfo=UTC)),
        **extra,
    )
    spec = BoxSpec("pip", "c1", tmp_path / "state", run_id="r1")
    with caplog.at_level(logging.DEBUG), pytest.raises(RpcError) as caught:
        await gateway.serve(
            spec, "model.request", ModelRequestParams(path="/chat/completions", body=CHAT, purpose="reply")
        )
    error = caught.value
    assert error.code == ErrorCode.UPSTREAM_UNREACHABLE
    assert (
        f"http://[redacted]@127.0.0.1:{dead_port}/v1?key=[redacted]" in error.message
    )  # still says where it tried
    assert leaked(json.dumps(error.to_wire())) == []
    rows = [dict(row) for row in sqlfile.query(db, "SELECT * FROM audit")]
    assert rows and leaked(json.dumps(rows, default=str)) == []
    assert leaked("\n".join(record.getMessage() for record in caplog.records)) == []
    # the audit's second line of defence knows them too, however the gateway was configured
    gateway.audit.write(
        AuditRecord(imp="pip", method="model.request", reason=f"echoed {url} and {USER}/{PASSWORD}")
    )
    assert leaked(sqlfile.query(db, "SELECT reason FROM audit ORDER BY id DESC LIMIT 1")[0]["reason"]) == []
    await gateway.aclose()
    db.close()


async def test_the_box_and_its_journal_never_see_them(tmp_path: Path, dead_port: int) -> None:
    db = open_database(tmp_path / "impyard.db")
    gateway = build_gateway(
        policy=load_policy(), db=db, surface=RecordingSurface(), clock=FixedClock(datetime(2026, 5, 10, tzinfo=UTC)),
        upstream=UpstreamConfig(base_url=base_url(f"127.0.0.1:{dead_port}"), api_key=KEY), secrets=[KEY],
    )  # fmt: skip
    spec = BoxSpec("pip", "c1", tmp_path / "state")
    async with ProcessBackend(warn=False).open(spec, gateway) as box:
        await box.init(init_params(imp="pip", channel_id="c1", kind="dm", retry_backoff_s=0), timeout=30)
        result = await box.deliver(deliver_params("hi", "m1"), timeout=30)
    assert result.outcome == "failed" and "unreachable" in (result.error or "")
    assert leaked(result.model_dump_json()) == []
    written = "\n".join(
        path.read_text(errors="replace") for path in spec.state_dir.rglob("*") if path.is_file()
    )
    assert "journal" in " ".join(p.name for p in spec.state_dir.rglob("*")) and leaked(written) == []
    await gateway.aclose()
    db.close()


async def test_a_reachable_proxy_gets_them_as_basic_auth_never_in_the_logged_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with FakeOpenAI(api_key=KEY) as fake:
        host = fake.base_url.split("://", 1)[1].split("/", 1)[0]
        config = UpstreamConfig(base_url=base_url(host), api_key=KEY)
        broker = ModelBroker(config)
        with caplog.at_level(logging.DEBUG):
            response = await broker.call("/chat/completions", encode_body(CHAT), "reply")
        await broker.aclose()
        [request] = fake.requests
    assert response.status in (200, 401)  # the fake wants the key; what matters is what was sent
    assert (
        request.headers["authorization"]
        == "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    )
    assert (request.path, request.query) == (
        "/v1/chat/completions",
        f"key={QUERY_KEY}",
    )  # the query still reaches the proxy
    assert any("HTTP Request" in r.getMessage() for r in caplog.records)
    assert [
        r.getMessage() for r in caplog.records if USER in r.getMessage() or PASSWORD in r.getMessage()
    ] == []
    assert leaked(repr(config)) == []


async def test_the_brokers_own_errors_never_carry_them(dead_port: int) -> None:
    broker = ModelBroker(UpstreamConfig(base_url=base_url(f"127.0.0.1:{dead_port}"), api_key=KEY))
    with pytest.raises(UpstreamUnreachable) as caught:
        await broker.call("/chat/completions", encode_body(CHAT), "reply")
    await broker.aclose()
    assert (
        str(caught.value)
        == f"cannot connect to the model API at http://[redacted]@127.0.0.1:{dead_port}/v1?key=[redacted]: ConnectError"
    )


async def test_an_upstream_that_echoes_them_has_them_redacted_before_the_box_sees_its_answer(
    tmp_path: Path,
) -> None:
    with FakeOpenAI(api_key=KEY) as fake:
        fake.script(
            FakeResponse(403, {"error": {"message": f"key {QUERY_KEY} is not valid for this proxy"}}),
            purpose="reply",
        )
        db = open_database(tmp_path / "impyard.db")
        gateway = build_gateway(
            policy=load_policy(), db=db, surface=RecordingSurface(), clock=FixedClock(datetime(2026, 5, 10, tzinfo=UTC)),
            upstream=UpstreamConfig(base_url=f"{fake.base_url}?key={QUERY_KEY}", api_key=KEY), secrets=[KEY],
        )  # fmt: skip
        result = await gateway.serve(
            BoxSpec("pip", "c1", tmp_path),
            "model.request",
            ModelRequestParams(path="/chat/completions", body=CHAT, purpose="reply"),
        )
        await gateway.aclose()
        db.close()
    assert isinstance(result, ModelRequestResult) and result.status == 403
    assert result.body["error"]["message"] == "key [redacted] is not valid for this proxy"


@pytest.mark.parametrize("as_json", [True, False])
def test_doctor_shows_the_base_url_without_its_credentials(
    monkeypatch: pytest.MonkeyPatch, dead_port: int, as_json: bool
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", base_url(f"127.0.0.1:{dead_port}"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    result = CliRunner(env={"COLUMNS": "400"}).invoke(cli, ["doctor", "--json"] if as_json else ["doctor"])
    assert "[redacted]@127.0.0.1" in result.output, result.output
    assert leaked(result.output) == [] and KEY not in result.output


@pytest.mark.parametrize(
    ("url", "shown", "secrets"),
    [
        ("https://api.openai.com/v1", "https://api.openai.com/v1", []),
        ("http://user-name-1:pa%40ss-word-2@proxy:8080/v1", "http://[redacted]@proxy:8080/v1",
         ["user-name-1:pa%40ss-word-2", "pa%40ss-word-2", "user-name-1", "pa@ss-word-2"]),
        ("https://proxy/v1?api-key=abcdefgh1234&v=1", "https://proxy/v1?api-key=[redacted]&v=[redacted]",
         ["api-key=abcdefgh1234&v=1", "abcdefgh1234"]),
        ("https://token-only-abcdef@proxy/v1#frag", "https://[redacted]@proxy/v1", ["token-only-abcdef"]),
    ],
)  # fmt: skip
def test_url_credentials_are_known_secrets_and_shown_redacted(
    url: str, shown: str, secrets: list[str]
) -> None:
    assert redact_url(url) == shown
    assert sorted(url_secrets(url)) == sorted(secrets)
    assert sorted(known_secrets({"OPENAI_BASE_URL": url})) == sorted(secrets)
