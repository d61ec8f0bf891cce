"""Local model servers treated as local servers (issue 38).

* Their own timing: a local server's turn ceiling (900 s) and attempt timeout (269 s) come from its profile;
  a written ``[sessions] turn_ceiling_s`` wins.
* A call given up is ended upstream: the box names its attempt's limit and the host closes the request then;
  a local server's call also ends with the box that asked. The fake records the hang-up.
* Slow is called slow: a server that took the request and did not answer is a timeout (said and audited so),
  not "unreachable".
* A server that refuses ``json_schema`` (llama-cpp-python's, with HTTP 500) gets ``json_object`` with the
  schema in the prompt, remembered for the rest of the box, and is never retried as a transient fault.
* Messages a person can act on: one line, never a validation dump, never cut mid-word.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner, Result
from pydantic import ValidationError

from box.attempts import ModelChooser, with_attempts
from box.chat_api import parse_envelope
from box.common.attempts import attempt_timeout_s
from box.common.busy import ask_while_busy
from box.common.envelope import Envelope
from box.common.failures import clip, split_tag
from box.common.model_profiles import HOSTED_TIMING, LOCAL_TIMING, SERVER_PROFILES, profile_for, timing_for
from box.common.request_bodies import chat_body, sent_schema
from box.common.structured import JsonSchemaRefused, refuses_json_schema, with_schema_in_prompt
from box.failures import classify
from box.memory.calls import MemoryModel
from box.model import ModelCallFailed, http_failure
from box.protocol import RpcError
from box.protocol.models import MemorySettings, ModelRequestParams, ModelRequestResult, ResponderSettings
from impyard.backends import BoxSpec, BoxTimeout
from impyard.cli import cli
from impyard.cli.doctor_rules import channel_problem, envelope_problem
from impyard.conversation.sessions import ceiling_error
from impyard.failure_words import WORDS, words_for
from impyard.gateway.model_act import ModelAct
from impyard.gateway.policy import build_policy, default_policy_path
from impyard.imps.config import new_imp_settings
from impyard.imps.store import ImpStore
from impyard.imps.validate import validate_config
from impyard.terminal.turn_words import outcome_line
from testing.fake_openai import (
    LLAMA_CPP_PYTHON_MODEL,
    LOCAL_SERVER_MODEL,
    FakeOpenAI,
    FakeResponse,
    envelope,
    slow,
)
from testing.inprocess import InProcessBackend
from tests import sqlfile
from tests.scripted import deliver_params, init_params
from tests.test_responder_gateway import Rig, open_rig

KEY = "sk-impyard-test-local-38c1"
pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]
MODEL = "qwen2.5-0.5b"
LOCAL_POLICY = f"""
[[rules]]
name = "local-qwen"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
purposes = {{ reply = ["{MODEL}"], appraisal = ["{MODEL}"], filter = ["{MODEL}"], summary = ["{MODEL}"] }}

[prices."{MODEL}"]
input = 0
output = 0
"""
# llama-cpp-python's HTTP 500 for a json_schema response_format (llama.cpp issue #23463; the fake's own words).
LLAMA_CPP_PYTHON_500 = {
    "error": {
        "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
        "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}\n    For further "
        "information visit https://errors.pydantic.dev/2.11/v/literal_error",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}
# The older llama.cpp server's words (llama.cpp #9522).
OLD_LLAMA_CPP_500 = {
    "error": {
        "code": 500,
        "message": 'response_format type must be one of "text" or "json_object", but got: json_schema',
        "type": "server_error",
    }
}
ASKED_SCHEMA = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}


# ------------------------------------------------------------------ the timing a server gets


@pytest.mark.parametrize("server", sorted(SERVER_PROFILES))
def test_every_local_server_gets_the_local_timing(server: str) -> None:
    assert timing_for(server) == LOCAL_TIMING and LOCAL_TIMING.local


def test_openai_keeps_its_timing() -> None:
    assert timing_for("openai") == HOSTED_TIMING and (HOSTED_TIMING.turn_ceiling_s, HOSTED_TIMING.local) == (
        120.0,
        False,
    )


@pytest.mark.parametrize(
    ("sessions", "server", "ceiling_s"),
    [
        ({}, "openai", 120.0),
        ({}, "llama.cpp", 900.0),
        ({}, "ollama", 900.0),
        ({"turn_ceiling_s": 60}, "llama.cpp", 60.0),  # written: it wins
        ({"turn_ceiling_s": 300}, "openai", 300.0),
        ({"session_ceiling_s": 600}, "vllm", 600.0),  # a session holds whole turns
    ],
)
def test_the_turn_ceiling_comes_from_the_server_unless_written(
    sessions: dict[str, Any], server: str, ceiling_s: float
) -> None:
    config = validate_config(
        {"name": "pip", "model": {"model": MODEL, "server": server}, "sessions": sessions}, "imp.toml"
    )
    assert config.turn_ceiling_s == ceiling_s
    # The attempt timeout is derived from the ceiling in force, as ever (issue 19 #6).
    assert config.imp_spec().responder.attempt_timeout_s == pytest.approx(attempt_timeout_s(ceiling_s))


def test_a_local_servers_attempt_holds_a_whole_answer_at_four_tokens_a_second() -> None:
    per_attempt = attempt_timeout_s(LOCAL_TIMING.turn_ceiling_s)
    assert per_attempt == pytest.approx(269.0) and per_attempt >= 1024 / 4


def test_the_ceiling_says_what_ran_out_and_which_setting_sets_it() -> None:
    error = ceiling_error(900.0)
    assert split_tag(error)[0] == "timeout" and words_for(error) == WORDS["timeout"]
    from box.protocol.models import DeliverResult

    line = outcome_line("pip", DeliverResult(outcome="failed", error=error))
    assert line == (
        "(impyard) pip could not answer: the turn took longer than its ceiling of 900 s and was stopped (a slow "
        "model server may need a longer one: [sessions] turn_ceiling_s in imp.toml)"
    )


# ------------------------------------------------------------------ a refusal of json_schema, recognised


@pytest.mark.parametrize(
    ("status", "body", "request_body", "refused"),
    [
        (500, LLAMA_CPP_PYTHON_500, ASKED_SCHEMA, True),
        (500, OLD_LLAMA_CPP_500, ASKED_SCHEMA, True),
        (400, {"error": {"message": "json_schema is not supported"}}, None, True),
        (422, LLAMA_CPP_PYTHON_500, ASKED_SCHEMA, True),
        (500, {"error": {"message": "the server is overloaded"}}, ASKED_SCHEMA, False),  # transient
        (503, LLAMA_CPP_PYTHON_500, ASKED_SCHEMA, False),  # not a refusal status
        (429, LLAMA_CPP_PYTHON_500, ASKED_SCHEMA, False),
        (500, LLAMA_CPP_PYTHON_500, {"response_format": {"type": "json_object"}}, False),  # did not ask it
        (500, "Internal Server Error", ASKED_SCHEMA, False),
    ],
)
def test_a_refusal_of_json_schema_is_recognised(
    status: int, body: Any, request_body: dict[str, Any] | None, refused: bool
) -> None:
    assert refuses_json_schema(status, body, request_body) is refused


def test_the_refusal_is_not_transient_and_says_so_in_one_line() -> None:
    failure = http_failure(ModelRequestResult(status=500, body=LLAMA_CPP_PYTHON_500))
    assert failure.schema_refused and failure.refused  # never retried as a 500 would be
    assert "\n" not in str(failure) and str(failure).startswith(
        "model returned HTTP 500 (json_schema_unsupported): 1 validation error: {'type': 'literal_error'"
    )
    assert len(str(failure)) < 260 and str(failure).endswith("…")  # cut between words


async def test_the_reply_falls_back_once_without_spending_an_attempt() -> None:
    structured = JsonSchemaRefused()
    asked: list[bool] = []

    async def attempt(_: int) -> str:
        asked.append(structured.refused)
        if not structured.refused:
            raise http_failure(ModelRequestResult(status=500, body=LLAMA_CPP_PYTHON_500))
        raise ModelCallFailed("model output is not a valid envelope: answer: Field required")

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    chooser = ModelChooser(ResponderSettings(attempt_timeout_s=None))
    with pytest.raises(RuntimeError):
        await with_attempts(attempt, sleep=sleep, base_s=1.0, chooser=chooser, structured=structured)
    # One json_schema call, then ENV-12's three json_object attempts: the switch costs no attempt, no wait.
    assert asked == [False, True, True, True] and slept == [1.0, 2.0]


def test_json_object_carries_the_schema_in_the_first_system_message() -> None:
    messages = [{"role": "system", "content": "You are Pip."}, {"role": "user", "content": "hi"}]
    body = chat_body(ResponderSettings(model=MODEL, server="llama-cpp-python"), MODEL, messages, [])
    assert body["response_format"] == {"type": "json_object"} and body["max_tokens"] == 1024
    system = body["messages"][0]["content"]
    assert system.startswith("You are Pip.\n\nAnswer with one JSON object only")
    settings = ResponderSettings(model=MODEL, server="llama-cpp-python")
    sent = sent_schema(settings, profile_for(MODEL, settings.server))
    assert json.dumps(sent, separators=(",", ":")) in system  # the schema this imp is asked, bounded
    # a local server: no picture fields, no staff or channel without a staff channel or post channels (issue 38)
    assert '"picture"' not in system and '"staff"' not in system and '"maxLength":2000' in system
    assert body["messages"][1:] == messages[1:] and messages[0]["content"] == "You are Pip."  # not mutated
    assert (
        with_schema_in_prompt([{"role": "user", "content": "hi"}], {"type": "object"})[0]["role"] == "system"
    )
    assert profile_for(MODEL, "llama-cpp-python").output_cap_key == "max_tokens"


async def test_a_memory_call_is_not_retried_as_busy_and_falls_back_for_the_rest_of_the_box() -> None:
    class Server:
        def __init__(self) -> None:
            self.bodies: list[dict[str, Any]] = []
            self.structured = JsonSchemaRefused()

        async def call(self, path: str, body: dict[str, Any], purpose: str) -> ModelRequestResult:
            self.bodies.append(body)
            if body["response_format"]["type"] == "json_schema":
                return ModelRequestResult(status=500, body=LLAMA_CPP_PYTHON_500)
            content = json.dumps({"ok": True})
            return ModelRequestResult(status=200, body={"choices": [{"message": {"content": content}}]})

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    server = Server()
    asked = await ask_while_busy(
        server, "/chat/completions", {"response_format": ASKED_SCHEMA["response_format"]}, "appraisal",
        sleep=sleep, deadline=lambda: None,
    )  # fmt: skip
    assert (
        len(server.bodies) == 1 and slept == [] and asked.error == "HTTP 500: the server takes no json_schema"
    )
    server.bodies.clear()
    memory = MemoryModel(server, MemorySettings(), MODEL, sleep=sleep, server="llama.cpp")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    for _ in range(2):
        assert await memory.chat_json("appraisal", "Judge.", "it", temperature=0.4, schema=schema) == {
            "ok": True
        }
    kinds = [body["response_format"]["type"] for body in server.bodies]
    assert kinds == ["json_schema", "json_object", "json_object"] and slept == []  # learnt once, shared
    assert server.structured.refused  # the box's client holds it: the reply's calls read the same


# ------------------------------------------------------------------ one line a person can act on


def test_an_invalid_envelope_is_named_by_its_fields_not_dumped() -> None:
    with pytest.raises(ModelCallFailed) as caught:
        parse_envelope(json.dumps({"answer": "hi", "answer_needed": "maybe"}))
    message = str(caught.value)
    assert "\n" not in message and "errors.pydantic.dev" not in message
    assert message.startswith("model output is not a valid envelope: answer_needed: Input should be a valid")
    assert message.endswith("more)")


@pytest.mark.parametrize(
    ("text", "limit", "clipped"),
    [
        ("short", 10, "short"),
        ("one two three four", 12, "one two…"),
        ("line one\n  line two", 40, "line one line two"),
        ("abcdefghijklmnop", 8, "abcdefg…"),  # no space to cut at: the only cut there is
    ],
)
def test_clip_cuts_between_words_on_one_line(text: str, limit: int, clipped: str) -> None:
    assert clip(text, limit) == clipped and len(clip(text, limit)) <= limit


# ------------------------------------------------------------------ end to end: box → gateway → fake


@pytest.fixture
async def rig(tmp_path: Path, fake: FakeOpenAI) -> AsyncIterator[Rig]:
    default = default_policy_path()
    policy = build_policy([("local.toml", LOCAL_POLICY), (str(default), default.read_text())])
    async with open_rig(tmp_path, fake, key=KEY, policy=policy) as opened:
        yield opened


def schema_kinds(rig: Rig) -> list[tuple[str, int | None]]:
    return [(r.body["response_format"]["type"], r.status) for r in rig.fake.requests_for("/chat/completions")]


async def test_a_server_that_refuses_json_schema_with_a_500_still_delivers(rig: Rig) -> None:
    rig.fake.add_model(MODEL, LLAMA_CPP_PYTHON_MODEL)
    rig.fake.script(envelope(answer="hello from qwen"), purpose="reply")
    results = await rig.turns(
        deliver_params("hi", "m1"), deliver_params("again", "m2"), model=MODEL, server="llama.cpp"
    )
    assert [r.outcome for r in results] == ["sent", "sent"]
    # One refused call in the whole box, then json_object at once: no retry storm (before: 3 reply calls, 82 s).
    assert schema_kinds(rig) == [("json_schema", 500), ("json_object", 200), ("json_object", 200)]
    second = rig.fake.requests_for("/chat/completions")[1].body
    assert "follows this JSON schema" in second["messages"][0]["content"]
    assert [sent.content for sent in rig.surface.sent] == ["hello from qwen", "hello from qwen"]


async def test_the_llama_cpp_python_profile_asks_json_object_from_the_first_call(rig: Rig) -> None:
    rig.fake.add_model(MODEL, LLAMA_CPP_PYTHON_MODEL)
    rig.fake.script(envelope(answer="hi"), purpose="reply")
    [result] = await rig.turns(deliver_params("hi"), model=MODEL, server="llama-cpp-python")
    assert result.outcome == "sent" and schema_kinds(rig) == [("json_object", 200)]
    [request] = rig.fake.requests
    assert request.body["max_tokens"] == 1024 and "max_completion_tokens" not in request.body


async def test_a_slow_answer_within_the_attempts_limit_is_delivered(rig: Rig) -> None:
    rig.fake.add_model(MODEL, LOCAL_SERVER_MODEL)
    rig.fake.script(slow(envelope(answer="slowly"), 0.6), purpose="reply")
    [result] = await rig.turns(deliver_params("hi"), model=MODEL, server="llama.cpp", attempt_timeout_s=3.0)
    assert result.outcome == "sent" and rig.fake.hung_up == []
    [request] = rig.fake.requests
    assert request.status == 200


def wait_for_hang_ups(fake: FakeOpenAI, count: int, timeout_s: float = 30.0) -> list[Any]:
    """The fake's hang-ups once ``count`` have come (a generous deadline: a loaded machine is slow, not wrong)."""
    deadline = time.monotonic() + timeout_s
    while len(fake.hung_up) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return fake.hung_up


async def test_a_slow_answer_past_the_attempts_limit_is_one_clear_line_and_closed_upstream(rig: Rig) -> None:
    rig.fake.add_model(MODEL, LOCAL_SERVER_MODEL)
    rig.fake.script(slow(envelope(answer="too late"), 30.0), purpose="reply")
    [result] = await rig.turns(deliver_params("hi"), model=MODEL, server="llama.cpp", attempt_timeout_s=0.4)
    assert result.outcome == "failed" and split_tag(result.error)[0] == "timeout"
    assert words_for(result.error) == WORDS["timeout"]
    line = outcome_line("pip", result)
    assert line is not None and "the model server did not answer within 0.4 s" in line and "\n" not in line
    # ENV-12's three attempts, each given up by the box and closed by the host: the server stops on each.
    assert len(rig.fake.requests) == 3 and len(wait_for_hang_ups(rig.fake, 3)) == 3
    with anyio.fail_after(30):  # the third row is written as its call unwinds
        while len([row for row in rig.audit() if row[0] == "model.request"]) < 3:
            await anyio.sleep(0.05)
    verdicts = [row for row in rig.audit() if row[0] == "model.request"]
    assert verdicts == [("model.request", "timeout", "reply")] * 3  # slow, not "unreachable"
    reasons = sqlfile.query(rig.db, "SELECT reason FROM audit WHERE method = 'model.request'")
    assert {row[0] for row in reasons} == {"the model server did not answer within 0.4 s"}


async def test_a_local_servers_call_ends_with_its_box(rig: Rig) -> None:
    """The turn ceiling kills the box while the model answers: the call ends with it (issue 38), where an
    OpenAI call would run on and be charged what it cost (issue 19 #4b)."""
    rig.fake.add_model(MODEL, LOCAL_SERVER_MODEL)
    rig.fake.script(slow(envelope(answer="nobody waits"), 30.0), purpose="reply")
    async with rig.gateway.running(grace_s=0.1):
        async with InProcessBackend().open(BoxSpec("pip", "c1", rig.state_dir), rig.gateway) as box:
            await box.init(init_params(model=MODEL, server="llama.cpp", retry_backoff_s=0), timeout=30)
            with pytest.raises(BoxTimeout):
                await box.deliver(deliver_params("hi"), timeout=0.5)  # the ceiling, as a session's
            await box.kill()
        assert len(wait_for_hang_ups(rig.fake, 1)) == 1
        await anyio.sleep(0.2)
    rows = sqlfile.query(rig.db, "SELECT verdict, reason FROM audit WHERE method = 'model.request'")
    assert [row[0] for row in rows] == ["interrupted"]
    assert "the box that asked ended" in rows[0][1] and "the request was closed" in rows[0][1]


async def test_an_openai_call_outlives_its_box_as_before(rig: Rig) -> None:
    rig.fake.script(slow(envelope(answer="finished anyway"), 1.0), purpose="reply")
    async with rig.gateway.running(grace_s=5.0):
        async with InProcessBackend().open(BoxSpec("pip", "c1", rig.state_dir), rig.gateway) as box:
            await box.init(init_params(retry_backoff_s=0), timeout=30)
            with pytest.raises(BoxTimeout):
                await box.deliver(deliver_params("hi"), timeout=0.3)
            await box.kill()
    assert rig.fake.hung_up == [] and [r.status for r in rig.fake.requests] == [200]


# ------------------------------------------------------------------ doctor asks what the imp asks


def doctor(fake: FakeOpenAI) -> tuple[Result, dict[str, dict[str, Any]]]:
    env = {"OPENAI_API_KEY": fake.api_key or "", "OPENAI_BASE_URL": fake.base_url}
    result = CliRunner(env=env).invoke(cli, ["doctor", "--json"])
    return result, {row["item"]: row for row in json.loads(result.stdout)}


@pytest.fixture
def local_pip(impyard_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("impyard.cli.doctor.docker_facts", _built_docker)
    (impyard_home / "policies").mkdir(parents=True, exist_ok=True)
    (impyard_home / "policies" / "local.toml").write_text(LOCAL_POLICY)


def _built_docker() -> Any:
    from impyard.cli.doctor_rules import DockerFacts

    return DockerFacts(reachable=True, version="27.0", expected_image="impyard-box:abc", image_present=True)


def add_pip(server: str, **sessions: Any) -> None:
    settings = {"model": {"model": MODEL, "server": server}, "memory": {"enabled": False}}
    if sessions:
        settings["sessions"] = sessions
    ImpStore().add("pip", **new_imp_settings(settings))


def test_doctor_sends_a_llama_cpp_imps_own_envelope_call(fake: FakeOpenAI, local_pip: None) -> None:
    fake.add_model(MODEL, LOCAL_SERVER_MODEL)
    add_pip("llama.cpp")
    result, rows = doctor(fake)
    row = rows["Model endpoint"]
    assert row["status"] == "ok", row
    [call] = fake.requests
    # What the imp's box sends: max_tokens, no strict, the envelope schema, the imp's own cap.
    assert call.body["max_tokens"] == 1024 and "max_completion_tokens" not in call.body
    assert call.body["response_format"]["json_schema"]["name"] == "envelope"
    assert "strict" not in call.body["response_format"]["json_schema"]
    assert row["detail"].startswith(
        f"{MODEL} at {fake.base_url} (server llama.cpp: max_tokens, json_schema without strict) answered a "
        "reply envelope in "
    )
    assert row["detail"].endswith(
        "s; turn ceiling 900 s, each attempt 269 s (from server llama.cpp) (metered as pip's)"
    )


def test_doctor_names_a_refused_json_schema_and_the_setting_that_skips_it(
    fake: FakeOpenAI, local_pip: None
) -> None:
    fake.add_model(MODEL, LLAMA_CPP_PYTHON_MODEL)
    add_pip("llama.cpp")
    result, rows = doctor(fake)
    row = rows["Model endpoint"]
    assert result.exit_code == 0 and row["status"] == "warn", row
    assert (
        "refused response_format json_schema; with json_object and the schema in the prompt it answered"
        in (row["detail"])
    )
    assert row["fix"].startswith("impyard imp set pip model.server=llama-cpp-python")
    assert [r.status for r in fake.requests] == [500, 200]  # asked once each way: no retry


def test_doctor_says_when_a_server_cannot_give_structured_output(fake: FakeOpenAI, local_pip: None) -> None:
    fake.add_model(MODEL, LOCAL_SERVER_MODEL)
    fake.script(FakeResponse(500, OLD_LLAMA_CPP_500))
    add_pip("llama.cpp")
    result, rows = doctor(fake)
    row = rows["Model endpoint"]
    assert result.exit_code == 1 and row["status"] == "fail"
    assert (
        "this server cannot give structured output: it refused response_format json_schema and json_object"
        in (row["detail"])
    )
    assert "llama.cpp's llama-server, Ollama, vLLM or LM Studio" in row["fix"] and len(fake.requests) == 2


def test_doctor_reports_a_slow_server_with_the_timing_in_force(fake: FakeOpenAI, local_pip: None) -> None:
    fake.add_model(MODEL, LOCAL_SERVER_MODEL)
    fake.script(slow(envelope(answer="late"), 30.0))
    add_pip("llama.cpp", turn_ceiling_s=5)  # each attempt (5 × 0.9 − 3) / 3 = 0.5 s
    result, rows = doctor(fake)
    row = rows["Model endpoint"]
    assert result.exit_code == 1 and row["detail"] == (
        f"{MODEL} at {fake.base_url} (server llama.cpp: max_tokens, json_schema without strict) took the call but "
        "did not answer within 0.5 s; turn ceiling 5 s, each attempt 0.5 s (from [sessions] turn_ceiling_s)"
    )
    assert "sessions.turn_ceiling_s=SECONDS" in row["fix"]
    assert len(wait_for_hang_ups(fake, 1)) == 1  # the request was closed, not left running on the server


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (envelope(answer="hi"), None),
        (envelope(answer="hi", channel="none"), None),
        (envelope(answer="hi", channel="123456789012345678"), None),
        (envelope(answer="hi", channel="a terminal session"), 'its channel names "a terminal session"'),
        ({"answer": "hi"}, "the answer is not a valid reply envelope: answer_needed: Field required"),
        ("not json", "the answer is not JSON: not json"),
    ],
)
def test_the_probe_answer_is_judged_for_use(content: Any, problem: str | None) -> None:
    text = content if isinstance(content, str) else json.dumps(content)
    body = {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}
    found = envelope_problem(body)
    assert (found is None) if problem is None else (found is not None and found.startswith(problem))


def test_an_answer_cut_at_its_cap_is_said_so() -> None:
    body = {"choices": [{"message": {"content": '{"answer": "repeat repeat'}, "finish_reason": "length"}]}
    assert envelope_problem(body) == (
        "the answer was cut at its output cap (finish_reason length): not a whole JSON object"
    )
    assert channel_problem(None) is None and channel_problem("<#123>") is None


def test_the_envelope_model_is_what_the_probe_checks() -> None:
    with pytest.raises(ValidationError):
        Envelope.model_validate({"answer": "hi"})
    assert classify(ModelCallFailed("the model server did not answer within 269 s")) == "timeout"


@pytest.mark.parametrize(
    ("asked_s", "ends_with_box", "limit_s"),
    [
        (5.0, False, 0.5),  # a longer limit than the policy's, on a call that outlives its box: the policy's
        (0.3, False, 0.3),  # a shorter one: the box's
        (
            1.0,
            True,
            1.0,
        ),  # a call that ends with its box (a local server's): the box's, the ceiling bounds it
    ],
)
async def test_a_box_may_shorten_the_upstream_limit_never_lengthen_it(
    rig: Rig, asked_s: float, ends_with_box: bool, limit_s: float
) -> None:
    """Issue 38: ``timeout_s`` comes from the box, an attacker's byte: it cannot hold a call open past
    ``[upstream] timeout_s`` unless the call dies with the box, which the host's turn ceiling kills."""
    act = rig.gateway.act(ModelAct)
    assert act is not None
    act.broker.settings = act.broker.settings.model_copy(update={"timeout_s": 0.5})
    rig.fake.script(slow(envelope(answer="late"), 30.0), purpose="reply")
    body = {"model": "gpt-5.1", "messages": [{"role": "user", "content": "hi"}]}
    params = ModelRequestParams(
        path="/chat/completions", body=body, purpose="reply", timeout_s=asked_s, end_with_box=ends_with_box
    )
    with pytest.raises(RpcError) as raised:
        await rig.gateway.serve(BoxSpec("pip", "c1", rig.state_dir), "model.request", params)
    assert f"did not answer within {limit_s:g} s" in raised.value.message


@pytest.mark.parametrize(
    ("valence", "intensity", "held"),
    [
        (1.7, 0.5, (1.0, 0.5)),  # a small model's 1.7: held to the top of the scale
        (-3.0, -0.2, (-1.0, 0.0)),
        (0.25, 1.2, (0.25, 1.0)),
    ],
)
async def test_a_feeling_off_its_scale_is_held_to_it_not_the_replys_end(
    rig: Rig, valence: float, intensity: float, held: tuple[float, float]
) -> None:
    """Issue 38: llama.cpp's grammar bounds integers, not numbers; a reply whose moment says 1.7 is delivered,
    its feeling held to the scale (ENV-18 refuses only what is not a number)."""
    moment = {"feeling": "glad", "conclusion": "ann is back", "valence": valence, "intensity": intensity,
              "refeels": []}  # fmt: skip
    rig.fake.add_model(MODEL, LOCAL_SERVER_MODEL)
    rig.fake.script(envelope(answer="welcome back", moment=moment), purpose="reply")
    [result] = await rig.turns(deliver_params("hi"), model=MODEL, server="llama.cpp")
    assert result.outcome == "sent"
    parsed = parse_envelope(json.dumps(envelope(moment=moment)))
    assert parsed.moment is not None and (parsed.moment.valence, parsed.moment.intensity) == held


def test_a_feeling_that_is_no_number_is_still_a_failed_attempt() -> None:
    with pytest.raises(ModelCallFailed):
        parse_envelope('{"answer": "x", "answer_needed": true, "picture_edit": false, "hack": false, "told": null, '
                       '"moment": {"feeling": "f", "conclusion": "c", "valence": NaN, "intensity": 0.5, "refeels": []}, '
                       '"action": {"type": "none", "text": null}}')  # fmt: skip
