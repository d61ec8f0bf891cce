"""Issue 38: an envelope a small model cannot break.

A 0.5B model on llama.cpp's server filled every nullable field of the envelope (``channel`` copied from the
prompt's "Channel:" line sent the reply to the policy's default deny), asked a server without pictures for
pictures, and repeated one phrase in ``moment.refeels`` until the output cap. Here a fake that writes what that
model wrote (``testing.fake_openai.SmallModel``) drives the real host (``open_runtime``: the policy read when a
box opens, ``impyard.gateway.reach``), the real box program and the real gateway, and the rules are held one
by one: a channel the imp cannot address is the conversation's own (ENV-09, widened), ``picture`` / ``staff``
/ ``hack`` / ``channel`` are asked only where they apply, and every string and array sent carries the bound
its server takes (``box.common.schema_bounds``), refused by the fake where OpenAI refuses it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
import openai
import pytest

from box.common.envelope import (
    ENVELOPE_SCHEMA,
    MAX_REFEELS,
    Action,
    Envelope,
    EnvelopeAsks,
    envelope_schema,
)
from box.common.model_profiles import SERVER_PROFILES, profile_for
from box.common.schema_bounds import (
    FINE_TUNED,
    GUIDED,
    LLAMA_GRAMMAR,
    OPENAI_STRICT,
    bounds_problem,
    fit_schema,
)
from box.memory.calls import MemoryModel
from box.protocol.models import (
    Author,
    ImpSpec,
    MemorySettings,
    Message,
    ModelRequestResult,
    ResponderSettings,
)
from box.render import reply_target
from impyard.clock import FixedClock
from impyard.conversation.inbound import Inbound
from impyard.gateway.policy import Policy, build_policy, default_policy_path, operator_policy_dir
from impyard.gateway.reach import post_channels, with_reach
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.runtime import Runtime, open_runtime
from testing.fake_openai import LOCAL_SERVER_MODEL, FakeOpenAI, SmallModel, envelope
from testing.inprocess import InProcessBackend

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True)]

SMALL = "qwen2.5-coder-0.5b"
TERMINAL = "terminal:ann"
# The README's local-server rule, for the small model: replies only (the memory is off here).
LOCAL_POLICY = f"""
[[rules]]
name = "local-small"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
max_tokens = 4096
purposes = {{ reply = ["{SMALL}"] }}

[prices."{SMALL}"]
input = 0
output = 0
"""
ANNOUNCE = '[[rules]]\nname = "announce"\nmethod = "discord.send"\naction = "allow"\nchannels = ["news-1"]\n'
NOT_ALWAYS_ASKED = {"channel", "staff", "picture", "picture_count", "picture_edit", "hack"}


def policy_with(extra: str) -> Policy:
    default = default_policy_path()
    return build_policy([("ops.toml", extra), (str(default), default.read_text())])


# ------------------------------------------------------------------ the whole host, a small model behind it


@dataclass
class Chat:
    rt: Runtime
    surface: RecordingSurface
    fake: FakeOpenAI
    clock: FixedClock
    sent_ids: list[str] = field(default_factory=list)

    async def say(self, text: str, n: int) -> str | None:
        """One terminal message to pip; the turn's outcome."""
        message = Message(
            id=f"m{n}", author=Author(id="ann", name="ann"), content=text,
            created_at=self.clock.now() + timedelta(seconds=n),
        )  # fmt: skip
        inbound = Inbound(surface="terminal", channel_id=TERMINAL, channel_kind="terminal", message=message)
        assert await self.rt.conversations.receive("pip", inbound) in ("started", "queued")
        with anyio.fail_after(60):
            await self.rt.conversations.wait_finished(message.id)
        return self.rt.history.outcome("pip", TERMINAL, message.id)

    def reply_schemas(self) -> list[dict[str, Any]]:
        return [r.body["response_format"] for r in self.fake.requests_for("/chat/completions")]


@asynccontextmanager
async def chat_with(fake: FakeOpenAI, *, policy: str, **model: Any) -> AsyncIterator[Chat]:
    """pip in a terminal, its ``[model]`` table ``model``, ``policy`` beside the shipped one."""
    directory = operator_policy_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "local.toml").write_text(policy)
    ImpStore().add("pip", "You are Pip.", model=model)
    surface, clock = RecordingSurface(), FixedClock()
    async with open_runtime(
        ["pip"], surface, clock=clock, backends={"pip": InProcessBackend()}, surfaces=("terminal",),
        pump_period_s=None,
    ) as rt:  # fmt: skip
        yield Chat(rt, surface, fake, clock)


async def test_a_small_model_on_llama_cpp_gets_its_replies_delivered(fake: FakeOpenAI) -> None:
    """Issue 38's run, replayed: every reply is delivered to the conversation, no picture is asked of the local
    server, the envelope carries only what can apply, bounded the way llama.cpp takes bounds, byte-stable."""
    fake.add_model(SMALL, LOCAL_SERVER_MODEL)
    small = SmallModel()
    fake.script(small, purpose="reply")
    async with chat_with(fake, policy=LOCAL_POLICY, model=SMALL, server="llama.cpp") as chat:
        outcomes = [await chat.say("hi pip", 1), await chat.say("draw me a cat", 2)]
    assert outcomes == ["sent", "sent"]
    assert [(p.channel_id, p.content) for p in chat.surface.sent] == [
        (TERMINAL, "Hello! How can I help you today?")
    ] * 2  # ENV-09 widened: nothing named "a terminal session" was posted to, nothing denied
    assert small.cut_off == 0  # moment.refeels stopped at its bound: valid JSON, first time
    assert fake.requests_for("/images/generations") == fake.requests_for("/images/edits") == []
    first, second = chat.reply_schemas()
    assert json.dumps(first, sort_keys=False) == json.dumps(second, sort_keys=False)  # the prompt cache
    assert "strict" not in first["json_schema"]  # llama.cpp reads the schema alone
    schema = first["json_schema"]["schema"]
    assert (
        list(schema["properties"])
        == schema["required"]
        == ["answer", "answer_needed", "moment", "told", "action"]
    )
    assert bounds_problem(schema) is None  # every string and array bounded
    moment = schema["properties"]["moment"]["anyOf"][0]  # nullable as anyOf: llama.cpp keeps its keywords
    assert moment["properties"]["refeels"]["maxItems"] == MAX_REFEELS
    assert schema["properties"]["answer"]["anyOf"][0]["maxLength"] == 2000
    text = json.dumps(schema)
    for field_name in NOT_ALWAYS_ASKED:  # absent, with its prompt text
        assert f'"{field_name}"' not in text


async def test_a_server_that_ignores_the_schema_cannot_send_what_was_not_asked(fake: FakeOpenAI) -> None:
    """A server that does not constrain decoding: every field comes back, channel, staff, picture, hack
    included. Not asked, they read as null / false: one reply, to the conversation, nothing else."""
    fake.add_model(SMALL, LOCAL_SERVER_MODEL)
    fake.script(SmallModel(holds_to_schema=False), purpose="reply")
    async with chat_with(fake, policy=LOCAL_POLICY, model=SMALL, server="llama.cpp") as chat:
        assert await chat.say("hi pip", 1) == "sent"
    assert [(p.channel_id, p.kind) for p in chat.surface.sent] == [(TERMINAL, "reply")]  # no staff post
    assert fake.requests_for("/images/generations") == []


async def test_a_channel_the_imp_cannot_address_is_the_conversations_own_on_openai(fake: FakeOpenAI) -> None:
    """An imp whose policy names another channel is asked ``channel``; "a terminal session" is not one it can
    post to, so the reply comes here — never a post the policy denies. ``[model] images = false`` turns the
    pictures off on OpenAI too. OpenAI gets maxItems, never maxLength (the fake refuses that, as OpenAI does)."""
    fake.script(SmallModel(), purpose="reply")
    async with chat_with(fake, policy=ANNOUNCE, images=False) as chat:
        assert await chat.say("hi pip", 1) == "sent"
    [post] = chat.surface.sent
    assert (post.channel_id, post.content) == (TERMINAL, "Hello! How can I help you today?")
    [request] = fake.requests_for("/chat/completions")
    assert request.status == 200 and request.rejection is None  # inside OpenAI's strict subset
    fmt = request.body["response_format"]["json_schema"]
    assert fmt["strict"] is True
    schema = fmt["schema"]
    assert list(schema["properties"]) == ["answer", "answer_needed", "channel", "moment", "told", "action"]
    assert "maxLength" not in json.dumps(schema)
    assert schema["properties"]["moment"]["properties"]["refeels"]["maxItems"] == MAX_REFEELS
    assert fake.requests_for("/images/generations") == []


async def test_a_channel_the_policy_names_is_still_an_act_of_its_own(fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Big news!", channel="<#news-1>"), purpose="reply")
    async with chat_with(fake, policy=ANNOUNCE) as chat:
        assert await chat.say("announce it", 1) == "pending"  # another channel: gated, never auto-sent
        [gate] = chat.rt.gateway.gates.latest()
    assert gate.target == "news-1" and gate.payload["kind"] == "other"


# ------------------------------------------------------------------ ENV-09, widened: where the reply goes


@pytest.mark.parametrize(
    ("channel", "target", "own", "unknown"),
    [
        (None, "c1", True, None),
        ("none", "c1", True, None),
        ("", "c1", True, None),
        ("c1", "c1", True, None),
        ("<#c1>", "c1", True, None),
        ("#general", "c1", True, None),  # its own name
        ("news-1", "news-1", False, None),  # a channel the policy names
        ("<#news-1>", "news-1", False, None),
        ("#news-1", "news-1", False, None),
        ("a terminal session", "c1", True, "a terminal session"),  # copied from the prompt
        ("#random", "c1", True, "#random"),  # a name it cannot post to
        ("123456789012345678", "c1", True, "123456789012345678"),  # an id no rule names
        ("staff-1", "c1", True, "staff-1"),  # the staff channel takes staff notes, not replies
    ],
)
def test_env_09_widened_a_channel_the_imp_cannot_address_is_the_conversations_own(
    channel: str | None, target: str, own: bool, unknown: str | None
) -> None:
    got = reply_target(channel, "c1", "general", ["news-1"])
    assert (got.channel_id, got.own, got.unknown) == (target, own, unknown)


# ------------------------------------------------------------------ what the envelope asks


@pytest.mark.parametrize(
    ("settings", "asked"),
    [
        ({}, {"picture", "picture_count", "picture_edit"}),  # OpenAI: pictures; no staff, no other channel
        ({"server": "llama.cpp"}, set()),  # a local server makes no pictures
        ({"server": "ollama", "images": True}, {"picture", "picture_count", "picture_edit"}),  # turned on
        ({"images": False}, set()),  # the host said no (the setting, or the policy)
        ({"staff_channel": "s1"}, {"staff", "hack", "picture", "picture_count", "picture_edit"}),  # ENV-03
        ({"server": "llama.cpp", "post_channels": ["news-1"]}, {"channel"}),
    ],
)
def test_the_optional_fields_are_asked_only_where_they_apply(
    settings: dict[str, Any], asked: set[str]
) -> None:
    asks = EnvelopeAsks.of(ResponderSettings(**settings))
    schema = envelope_schema(asks)
    assert set(schema["properties"]) & NOT_ALWAYS_ASKED == asked
    assert schema["required"] == list(schema["properties"])  # strict: every field asked is required
    assert envelope_schema(asks) is schema  # one dict per shape: byte-stable per imp


def test_a_field_not_asked_reads_as_null_or_false() -> None:
    filled = Envelope(
        answer="hi", answer_needed=True, channel="a terminal session", staff="x", picture="cat", picture_count=2,
        picture_edit=True, hack=True, moment=None, told=None, action=Action(type="none", text=None),
    )  # fmt: skip
    settled, ignored = EnvelopeAsks(channel=False, staff=False, pictures=False, hack=False).settle(filled)
    assert (settled.channel, settled.staff, settled.picture, settled.picture_count) == (
        None,
        None,
        None,
        None,
    )
    assert (settled.picture_edit, settled.hack, settled.answer) == (False, False, "hi")
    assert set(ignored) == NOT_ALWAYS_ASKED
    assert EnvelopeAsks().settle(filled) == (filled, {})  # all asked: nothing changes


# ------------------------------------------------------------------ the host reads the policy


SPEC = ImpSpec(name="pip", responder=ResponderSettings(staff_channel="staff-1"))


def test_pictures_are_asked_only_where_the_policy_allows_them() -> None:
    allowed = with_reach(SPEC, policy_with(""), "c1").responder  # the shipped rule: gpt-image-1
    assert allowed.images is True
    deny = '[[rules]]\nname = "no-pictures"\nmethod = "model.request"\naction = "deny"\npurposes = { image = ["*"] }\n'
    assert with_reach(SPEC, policy_with(deny), "c1").responder.images is False
    other = SPEC.model_copy(update={"responder": ResponderSettings(image_model="dall-e-3")})
    assert with_reach(other, policy_with(""), "c1").responder.images is False  # no rule for that model
    local = SPEC.model_copy(update={"responder": ResponderSettings(server="llama.cpp")})
    assert (
        with_reach(local, policy_with(""), "c1").responder.images is False
    )  # allowed, but no pictures there


def test_post_channels_are_the_other_channels_the_policy_lets_the_imp_post_to() -> None:
    rules = (
        ANNOUNCE + '[[rules]]\nname = "mine"\nscope = "pip"\nmethod = "discord.send"\naction = "allow"\n'
        'channels = ["own", "staff", "staff-1", "c1", "news-2"]\n'
        '[[rules]]\nname = "theirs"\nscope = "other"\nmethod = "discord.send"\naction = "allow"\nchannels = ["news-3"]\n'
    )
    assert post_channels(policy_with(rules), SPEC, "c1") == ["news-1", "news-2"]
    blocked = (
        '[[rules]]\nname = "quiet"\nmethod = "discord.send"\naction = "deny"\nchannels = ["news-1"]\n' + rules
    )
    assert post_channels(policy_with(blocked), SPEC, "c1") == ["news-2"]  # judged: a deny rule first wins
    assert post_channels(policy_with(""), SPEC, "c1") == []  # the shipped policy: own and staff only
    many = "".join(
        f'[[rules]]\nname = "n{i}"\nmethod = "discord.send"\naction = "allow"\nchannels = ["x{i}"]\n'
        for i in range(40)
    )
    assert len(post_channels(policy_with(many), SPEC, "c1")) == 25  # bounded


# ------------------------------------------------------------------ bounds, as each server takes them


def test_every_string_and_array_of_the_envelope_is_bounded() -> None:
    assert bounds_problem(ENVELOPE_SCHEMA) is None
    assert bounds_problem(
        {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "integer"}}}}
    ) == ("schema.x: an array without maxItems")


@pytest.mark.parametrize(
    ("server", "model", "dialect"),
    [
        ("openai", "gpt-5.1", OPENAI_STRICT),
        ("openai", "ft:gpt-4.1-mini-2025-04-14:org::abc", FINE_TUNED),
        ("llama.cpp", "any", LLAMA_GRAMMAR),
        ("ollama", "any", LLAMA_GRAMMAR),
        ("lmstudio", "any", LLAMA_GRAMMAR),
        ("vllm", "any", GUIDED),
        ("compatible", "any", OPENAI_STRICT),
    ],
)
def test_each_server_profile_says_which_bounds_it_takes(server: str, model: str, dialect: object) -> None:
    assert profile_for(model, server).schema_dialect == dialect


def test_fit_schema_sends_each_server_the_bounds_it_takes() -> None:
    schema = {
        "type": "object",
        "properties": {
            "note": {"type": ["string", "null"], "description": "d", "maxLength": 10},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        },
        "required": ["note", "tags"],
        "additionalProperties": False,
    }
    original = json.dumps(schema)
    assert fit_schema(schema, OPENAI_STRICT)["properties"] == {
        "note": {"type": ["string", "null"], "description": "d"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    }
    assert fit_schema(schema, FINE_TUNED)["properties"]["tags"] == {
        "type": "array",
        "items": {"type": "string"},
    }
    assert fit_schema(schema, LLAMA_GRAMMAR)["properties"] == {
        "note": {"description": "d", "anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    }
    assert fit_schema(schema, GUIDED) == schema
    assert json.dumps(schema) == original  # never changed in place


def test_the_fake_refuses_a_strict_schema_with_a_bound_openai_refuses(fake: FakeOpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with fake.client() as client:
        for schema in (ENVELOPE_SCHEMA, fit_schema(ENVELOPE_SCHEMA, LLAMA_GRAMMAR)):
            fmt = {
                "type": "json_schema",
                "json_schema": {"name": "envelope", "strict": True, "schema": schema},
            }
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="gpt-5.1", messages=messages, response_format=fmt)  # type: ignore[arg-type]
            assert "'maxLength' is not permitted." in caught.value.message
        fmt = {
            "type": "json_schema",
            "json_schema": {
                "name": "envelope",
                "strict": True,
                "schema": fit_schema(ENVELOPE_SCHEMA, OPENAI_STRICT),
            },
        }
        fake.script(envelope(), purpose=None)
        client.chat.completions.create(model="gpt-5.1", messages=messages, response_format=fmt)  # type: ignore[arg-type]


def test_the_small_model_fake_runs_on_where_nothing_bounds_it() -> None:
    small = SmallModel(cap_chars=200)
    unbounded = {"type": "object", "properties": {"refeels": {"type": "array", "items": {"type": "string"}}}}
    request: Any = type("R", (), {"body": {"response_format": {"json_schema": {"schema": unbounded}}}})()
    answer = small(request)
    assert isinstance(answer, str) and len(answer) == 200 and small.cut_off == 1
    with pytest.raises(ValueError):
        json.loads(answer)  # cut off mid-JSON: a failed attempt


@dataclass
class Recorder:
    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def call(self, path: str, body: dict[str, Any], purpose: str) -> ModelRequestResult:
        self.bodies.append(json.loads(json.dumps(body)))
        return ModelRequestResult(status=200, body={"choices": [{"message": {"content": '{"ok": "yes"}'}}]})


BOUNDED_MEMORY_SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "string", "maxLength": 20},
        "ids": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["ok", "ids"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("server", "sent"),
    [
        (
            "openai",
            {"ok": {"type": "string"}, "ids": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
        ),
        ("llama.cpp", BOUNDED_MEMORY_SCHEMA["properties"]),
    ],
)
async def test_a_memory_call_sends_the_bounds_its_server_takes(server: str, sent: dict[str, Any]) -> None:
    recorder = Recorder()
    memory = MemoryModel(recorder, MemorySettings(models={"appraisal": "gpt-5.1"}), "gpt-5.1", server=server)
    await memory.chat_json(
        "appraisal", "sys", "user", temperature=None, schema=BOUNDED_MEMORY_SCHEMA, max_tokens=50
    )
    [body] = recorder.bodies
    assert body["response_format"]["json_schema"]["schema"]["properties"] == sent


def test_the_server_profiles_keep_their_other_settings() -> None:
    """The bounds were added beside each server's profile, never in place of what it already said."""
    assert (
        SERVER_PROFILES["llama.cpp"].structured == "schema" and SERVER_PROFILES["vllm"].structured == "strict"
    )
    assert SERVER_PROFILES["ollama"].output_cap_key == "max_tokens"


def test_the_host_judges_the_picture_body_the_box_sends() -> None:
    """``impyard.gateway.reach`` may not import ``box.images``: its probe must stay the box's own body."""
    from box.images import GENERATIONS, image_request
    from impyard.gateway.reach import IMAGE_PATH, picture_body

    settings = ResponderSettings(image_model="gpt-image-1-mini", image_size="512x512", image_quality="medium")
    probe = Envelope(answer=None, answer_needed=True, picture="a picture", moment=None, told=None,
                     action=Action(type="none", text=None))  # fmt: skip
    request = image_request(settings, probe, [], "")
    assert (request.path, request.body) == (
        GENERATIONS,
        picture_body(ImpSpec(name="pip", responder=settings)),
    )
    assert IMAGE_PATH == GENERATIONS


@pytest.mark.parametrize(("server", "bounded"), [("openai", False), ("llama.cpp", True), ("vllm", True)])
def test_tool_arguments_are_bounded_as_the_server_takes_them(server: str, bounded: bool) -> None:
    from box.common.request_bodies import chat_body, responses_body
    from box.memory import NoMemory
    from box.tools import search_tool, web_fetch_tool

    tools = [search_tool(NoMemory()), web_fetch_tool(None)]  # type: ignore[arg-type]  # the peer is only run
    assert all(bounds_problem(tool.parameters) is None for tool in tools)
    settings = ResponderSettings(server=server)
    body = chat_body(settings, "gpt-5.1", [{"role": "user", "content": "hi"}], tools)
    sent = [shape["function"]["parameters"] for shape in body["tools"]]
    assert ("maxLength" in json.dumps(sent)) is bounded
    if server == "openai":  # the Responses API's flat shape too
        flat = responses_body(settings, "gpt-5.1", "sys", [], tools)["tools"]
        assert "maxLength" not in json.dumps(flat) and flat[0]["parameters"]["required"] == ["query"]
