"""A request the model API refuses as written (issue 16): reported once, with its cause, never retried as if the
upstream were having trouble. It is still ENV-12's failure: a ``RuntimeError`` (``ModelExhausted``) ends the
turn, after one failed attempt instead of three, since the same request would be refused the same way.

And the other side of it: a fresh imp with the default model (gpt-5.1) and tools on, an imp on a
non-reasoning model with tools, and an imp on a local server all work against the strict loopback fake,
which refuses what the real API refuses.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from box.attempts import ModelChooser, ModelExhausted, ModelRefused, with_attempts
from box.common.failures import tagged
from box.failures import classify
from box.model import http_failure
from box.protocol.models import DeliverParams, DeliverResult, ModelRequestResult, ResponderSettings
from impyard.failure_words import WORDS, words_for
from impyard.gateway.policy import build_policy, default_policy_path
from impyard.gateway.surfaces import Post
from impyard.terminal.chat import ChatSurface
from testing.fake_openai import LOCAL_SERVER_MODEL, FakeOpenAI, FakeResponse, envelope, tool_call
from tests.scripted import deliver_params
from tests.test_responder_gateway import Rig, open_rig

KEY = "sk-impyard-test-refusals-2b7e"
pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]
UNSUPPORTED = {
    "error": {
        "message": "Unsupported parameter: 'reasoning_effort' is not supported with this model.",
        "type": "invalid_request_error",
        "param": "reasoning_effort",
        "code": "unsupported_parameter",
    }
}
# What a person reads, written out: the kind's words and the upstream's cause, nothing else of the box's.
REFUSED_NOTICE = (
    "The model refused the request as I sent it (HTTP 400, unsupported_parameter: reasoning_effort) — "
    "my model settings need a change."
)


# ------------------------------------------------------------------ the attempt loop (ENV-12)


@dataclass
class Script:
    status: int
    body: Any
    attempts: int = 0

    async def __call__(self, n: int) -> str:
        self.attempts += 1
        raise http_failure(ModelRequestResult(status=self.status, body=self.body))


async def run(script: Script) -> tuple[BaseException, list[float]]:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    chooser = ModelChooser(ResponderSettings(attempt_timeout_s=None))
    with pytest.raises(ModelExhausted) as caught:
        await with_attempts(script, sleep=sleep, base_s=1.0, chooser=chooser)
    return caught.value, slept


@pytest.mark.parametrize("status", [400, 404, 413, 422])
async def test_a_refused_request_is_one_failed_attempt_not_three(status: int) -> None:
    script = Script(status, UNSUPPORTED)
    error, slept = await run(script)
    assert script.attempts == 1 and slept == []  # reported once: not retried, no backoff
    assert isinstance(error, ModelRefused) and isinstance(error, RuntimeError)  # still ENV-12's RuntimeError
    assert str(error) == (
        f"the model refused the request on attempt 1, not retried (the same request would be refused again): "
        f"model returned HTTP {status} (unsupported_parameter: reasoning_effort): Unsupported parameter: "
        "'reasoning_effort' is not supported with this model."
    )


@pytest.mark.parametrize("status", [408, 409, 429, 500, 503])
async def test_env_12_a_transient_failure_is_still_tried_three_times(status: int) -> None:
    script = Script(status, {"error": {"message": "busy"}})
    error, slept = await run(script)
    assert script.attempts == 3 and slept == [1.0, 2.0]  # ENV-12: spaced, never back to back
    assert type(error) is ModelExhausted


async def test_a_refusal_without_an_error_body_is_still_not_retried() -> None:
    script = Script(400, "<html>bad request</html>")
    error, _ = await run(script)
    assert script.attempts == 1 and str(error).endswith("model returned HTTP 400")


# ------------------------------------------------------------------ what the person and the log are told


def test_the_failure_notice_names_the_cause() -> None:
    error = ModelRefused(http_failure(ModelRequestResult(status=400, body=UNSUPPORTED)), 1)
    assert classify(error) == "model_refused"
    assert words_for(tagged(classify(error), str(error))) == REFUSED_NOTICE


@pytest.mark.parametrize(
    "detail",
    [
        "model returned HTTP 400 (<@everyone> free nitro at https://evil.example)",  # not identifier words
        "model returned HTTP 400: no cause given",
        "",
    ],
)
def test_a_box_cannot_put_its_own_words_in_the_notice(detail: str) -> None:
    assert words_for(f"[model_refused] {detail}") == WORDS["model_refused"]
    assert (
        WORDS["model_refused"]
        == "The model refused the request as I sent it — my model settings need a change."
    )


class Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        self.lines.append(text)


async def test_the_terminal_says_it_once_in_its_outcome_line() -> None:
    console = Console()
    surface = ChatSurface("pip", console)  # type: ignore[arg-type]
    surface.skip_notices = frozenset(WORDS.values())  # as `impyard chat` sets it
    await surface.send(Post("c1", REFUSED_NOTICE, kind="notice"))
    await surface.send(Post("c1", "The imp is unwell today.", kind="notice"))
    assert console.lines == ["(impyard) The imp is unwell today."]


# ------------------------------------------------------------------ end to end: box → gateway → strict fake


LOCAL_POLICY = """
[[rules]]
name = "local-llama"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
purposes = { reply = ["llama3.2"] }

[prices."llama3.2"]
input = 0
output = 0
"""


@pytest.fixture
async def rig(tmp_path: Path, fake: FakeOpenAI) -> AsyncIterator[Rig]:
    default = default_policy_path()
    policy = build_policy([("local.toml", LOCAL_POLICY), (str(default), default.read_text())])
    async with open_rig(tmp_path, fake, key=KEY, policy=policy) as opened:
        yield opened


async def turn(rig: Rig, params: DeliverParams, **settings: Any) -> DeliverResult:
    [result] = await rig.turns(params, **settings)
    return result


async def test_a_refused_request_fails_the_turn_once_with_its_cause(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.fake.script(FakeResponse(400, UNSUPPORTED), purpose="reply")
    with caplog.at_level(logging.WARNING, logger="impyard.box.pip"):
        result = await turn(rig, deliver_params("hi"))
    assert len(rig.fake.requests) == 1  # the upstream saw it once: not retried as if it were transient
    assert result.outcome == "failed" and words_for(result.error) == REFUSED_NOTICE
    # The host's log of the box (an in-process box's own loggers are the box's, as a process's stderr is).
    host_side = [r for r in caplog.records if r.name.startswith("impyard.box.pip")]
    logged = [r.getMessage() for r in host_side if "unsupported_parameter" in r.getMessage()]
    assert len(logged) == 1 and "reasoning_effort" in logged[0]  # the log says it once, and why


async def test_a_fresh_imp_with_the_default_model_and_tools_works_against_the_strict_fake(rig: Rig) -> None:
    rig.fake.script(tool_call("search", {"query": "owls"}), purpose="reply", times=1)
    rig.fake.script(envelope(answer="owls, yes"), purpose="reply")
    result = await turn(rig, deliver_params("owls?"), tools=["search"])
    assert result.outcome == "sent"
    assert [(r.status, r.rejection) for r in rig.fake.requests] == [(200, None), (200, None)]
    for request in rig.fake.requests:  # ENV-21: tools attached, effort "none"; ENV-19: the strict envelope
        assert request.body["model"] == "gpt-5.1" and request.body["reasoning_effort"] == "none"
        assert request.body["response_format"]["json_schema"]["strict"] is True


async def test_a_non_reasoning_model_with_tools_works_against_the_strict_fake(rig: Rig) -> None:
    rig.fake.script(tool_call("search", {"query": "owls"}), purpose="reply", times=1)
    rig.fake.script(envelope(answer="owls, yes"), purpose="reply")
    result = await turn(rig, deliver_params("owls?"), model="gpt-4.1-mini", tools=["search"], temperature=0.5)
    assert result.outcome == "sent"
    assert [(r.status, r.rejection) for r in rig.fake.requests] == [(200, None), (200, None)]
    for request in rig.fake.requests:
        assert "reasoning_effort" not in request.body and request.body["temperature"] == 0.5


async def test_a_responses_call_to_a_non_reasoning_model_works_against_the_strict_fake(rig: Rig) -> None:
    rig.fake.script(envelope(answer="hello"), purpose="reply")
    result = await turn(
        rig, deliver_params("hi"), model="gpt-4.1", use_responses_api=True, reasoning_effort="low"
    )
    assert result.outcome == "sent"
    [request] = rig.fake.requests
    assert "reasoning" not in request.body and "include" not in request.body


async def test_a_local_server_imp_works_against_the_fake(rig: Rig) -> None:
    rig.fake.add_model("llama3.2", LOCAL_SERVER_MODEL)
    rig.fake.script(envelope(answer="hi from llama"), purpose="reply")
    result = await turn(rig, deliver_params("hi"), model="llama3.2", server="ollama", tools=["search"])
    assert result.outcome == "sent"
    [request] = rig.fake.requests
    assert request.body["max_tokens"] == 1024 and "max_completion_tokens" not in request.body
    assert "strict" not in request.body["response_format"]["json_schema"]
    assert "reasoning_effort" not in request.body
