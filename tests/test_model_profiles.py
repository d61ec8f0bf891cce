"""Model profiles (issue 16): every request builder sends only what the configured model takes, and a
``[model]`` table that asks for what no request could carry is refused when imp.toml is loaded.

The expectations are written out from the OpenAI API reference and the local servers' documentation (see
``box/common/model_profiles.py``): gpt-5.1 takes efforts none..high and temperature only with effort none; gpt-5
takes minimal..high and no temperature but its own; the o-series low..high; gpt-4.1 and gpt-4o no reasoning
parameters at all (400 ``unsupported_parameter``, SPEC-001 ENV-21 / ENV-22); local servers take
``max_tokens`` and a json_schema with (vLLM, LM Studio) or without (Ollama, llama.cpp) ``strict``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from box import responses_api
from box.common.envelope import EnvelopeAsks, envelope_schema
from box.common.model_profiles import (
    SERVER_PROFILES,
    ModelProfile,
    SettingProblem,
    config_problems,
    model_notes,
    profile_for,
)
from box.common.request_bodies import chat_body, responses_body
from box.common.schema_bounds import fit_schema
from box.memory.calls import MemoryModel
from box.protocol.models import MemorySettings, ModelRequestResult, ResponderSettings
from box.tools import Tool
from impyard.imps.config import ImpConfigError
from impyard.imps.validate import parse_config

pytestmark = pytest.mark.anyio

PNG = "data:image/png;base64,iVBORw0KGgo="
SEARCH = Tool(
    "search",
    "Search memory.",
    {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
        "additionalProperties": False,
    },
    lambda _: "",
)


def _envelope(server: str = "openai", *, strict: bool = True) -> dict[str, Any]:
    """The envelope format a default imp on ``server`` sends (issue 38: its fields, its server's bounds)."""
    asks = EnvelopeAsks.of(ResponderSettings(server=server))
    schema = fit_schema(envelope_schema(asks), profile_for("any", server).schema_dialect)
    inner: dict[str, Any] = {"name": "envelope", "strict": True, "schema": schema} if strict else {
        "name": "envelope", "schema": schema}  # fmt: skip
    return {"type": "json_schema", "json_schema": inner}


STRICT_ENVELOPE = _envelope()


# ------------------------------------------------------------------ which profile a name gets


@pytest.mark.parametrize(
    ("model", "server", "family"),
    [
        ("gpt-5.1", "openai", "gpt-5.1"),
        ("gpt-5.1-2025-11-13", "openai", "gpt-5.1"),  # a snapshot is its family
        ("gpt-5.2", "openai", "gpt-5.2"),
        ("gpt-5", "openai", "gpt-5"),
        ("gpt-5-mini", "openai", "gpt-5"),
        ("gpt-5-nano", "openai", "gpt-5"),
        ("o3", "openai", "o3"),
        ("o3-mini", "openai", "o3-mini"),
        ("o4-mini", "openai", "o4-mini"),
        ("o1", "openai", "o1"),
        ("gpt-4.1-mini", "openai", "gpt-4.1"),
        ("gpt-4o-mini", "openai", "gpt-4o"),
        ("ft:gpt-4.1-mini-2025-04-14:acme::abc123", "openai", "gpt-4.1"),  # a fine-tune is its base
        ("gpt-50", "openai", "unknown"),  # not gpt-5: a family is its name or its name and "-…"
        ("llama3.2", "openai", "unknown"),
        ("llama3.2", "ollama", "ollama"),
        ("gpt-5.1", "ollama", "ollama"),  # on a local server the server decides, whatever the name
        ("qwen2.5", "llama.cpp", "llama.cpp"),
        ("qwen2.5", "vllm", "vllm"),
        ("qwen2.5", "lmstudio", "lmstudio"),
        ("qwen2.5", "some-new-server", "compatible"),  # a newer host's server name: OpenAI-compatible
    ],
)
def test_profile_for(model: str, server: str, family: str) -> None:
    assert profile_for(model, server).family == family


@pytest.mark.parametrize(
    ("model", "wanted", "sent"),
    [
        ("gpt-5.1", "none", "none"),  # ENV-21's default, taken as it is
        ("gpt-5.1", "high", "high"),
        ("gpt-5.1", "minimal", "none"),  # the nearest it takes; a tie goes to the lesser
        ("gpt-5.1", "xhigh", "high"),
        ("gpt-5.2", "xhigh", "xhigh"),
        ("gpt-5", "none", "minimal"),  # as little reasoning as gpt-5 does
        ("gpt-5-mini", "low", "low"),
        ("o3", "none", "low"),
        ("o4-mini", "high", "high"),
        ("gpt-4.1", "low", None),  # no reasoning model: nothing is sent
        ("gpt-4o", "none", None),
        ("llama3.2", "none", None),  # an unknown OpenAI name: nothing it might refuse
    ],
)
def test_the_effort_sent(model: str, wanted: str, sent: str | None) -> None:
    assert profile_for(model).effort_for(wanted) == sent


# ------------------------------------------------------------------ chat/completions (ENV-19, ENV-21)


def _messages() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are Pip."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "ann: look"},
                {"type": "image_url", "image_url": {"url": PNG}},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("model", "server", "temperature", "effort", "expected"),
    [
        pytest.param(  # the default model with tools: every SPEC-001 parameter (ENV-21: effort "none")
            "gpt-5.1", "openai", None, "none",
            {"max_completion_tokens": 1024, "response_format": STRICT_ENVELOPE, "reasoning_effort": "none"},
            id="gpt-5.1",
        ),
        pytest.param(  # temperature goes with effort none
            "gpt-5.1", "openai", 0.7, "none",
            {"max_completion_tokens": 1024, "response_format": STRICT_ENVELOPE, "reasoning_effort": "none",
             "temperature": 0.7},
            id="gpt-5.1-temperature",
        ),
        pytest.param(  # ... and not with any other effort
            "gpt-5.1", "openai", 0.7, "low",
            {"max_completion_tokens": 1024, "response_format": STRICT_ENVELOPE, "reasoning_effort": "low"},
            id="gpt-5.1-temperature-low",
        ),
        pytest.param(  # gpt-5 has no "none": its least effort, and no temperature
            "gpt-5-mini", "openai", 0.7, "none",
            {"max_completion_tokens": 1024, "response_format": STRICT_ENVELOPE, "reasoning_effort": "minimal"},
            id="gpt-5-mini",
        ),
        pytest.param(
            "o3", "openai", 0.7, "none",
            {"max_completion_tokens": 1024, "response_format": STRICT_ENVELOPE, "reasoning_effort": "low"},
            id="o3",
        ),
        pytest.param(  # not a reasoning model: no reasoning_effort (400 unsupported_parameter), temperature
            "gpt-4.1-mini", "openai", 0.7, "low",
            {"max_completion_tokens": 1024, "response_format": STRICT_ENVELOPE, "temperature": 0.7},
            id="gpt-4.1-mini",
        ),
        pytest.param(  # Ollama: max_tokens, the schema without strict, no reasoning parameter
            "llama3.2", "ollama", 0.7, "none",
            {"max_tokens": 1024, "response_format": _envelope("ollama", strict=False), "temperature": 0.7},
            id="ollama",
        ),
        pytest.param(
            "qwen2.5", "llama.cpp", None, "none",
            {"max_tokens": 1024, "response_format": _envelope("llama.cpp", strict=False)},
            id="llama.cpp",
        ),
        pytest.param(
            "qwen2.5", "vllm", None, "none", {"max_tokens": 1024, "response_format": _envelope("vllm")}, id="vllm"
        ),
        pytest.param(
            "qwen2.5", "lmstudio", None, "none",
            {"max_tokens": 1024, "response_format": _envelope("lmstudio")},
            id="lmstudio",
        ),
    ],
)  # fmt: skip
def test_a_chat_call_with_tools_carries_only_what_the_model_takes(
    model: str, server: str, temperature: float | None, effort: str, expected: dict[str, Any]
) -> None:
    settings = ResponderSettings(server=server, temperature=temperature, reasoning_effort=effort)
    body = chat_body(settings, model, _messages(), [SEARCH])
    tools = [SEARCH.chat_shape()]
    assert body == {"model": model, "messages": _messages(), "tools": tools, **expected}


@pytest.mark.parametrize("model", ["gpt-5.1", "gpt-5", "gpt-4.1"])
def test_env_21_a_tool_less_chat_call_never_carries_an_effort(model: str) -> None:
    body = chat_body(ResponderSettings(reasoning_effort="high"), model, _messages(), [])
    assert "reasoning_effort" not in body and "tools" not in body


def test_a_model_that_cannot_see_gets_a_note_where_the_image_was() -> None:
    body = chat_body(ResponderSettings(), "o3-mini", _messages(), [])
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "ann: look"},
        {"type": "text", "text": "[an image was attached here; this model cannot see images]"},
    ]
    assert chat_body(ResponderSettings(), "gpt-5.1", _messages(), [])["messages"] == _messages()


# ------------------------------------------------------------------ the Responses API (ENV-22, ENV-23)


@pytest.mark.parametrize(
    ("model", "effort", "temperature", "expected"),
    [
        pytest.param("gpt-5.1", "medium", None,
                     {"reasoning": {"effort": "medium"}, "include": ["reasoning.encrypted_content"]}, id="gpt-5.1"),
        pytest.param("gpt-5.1", "none", 0.5,
                     {"reasoning": {"effort": "none"}, "include": ["reasoning.encrypted_content"], "temperature": 0.5},
                     id="gpt-5.1-temperature"),
        pytest.param("gpt-5", "none", 0.5,
                     {"reasoning": {"effort": "minimal"}, "include": ["reasoning.encrypted_content"]}, id="gpt-5"),
        pytest.param("gpt-4.1", "medium", 0.5, {"temperature": 0.5}, id="gpt-4.1"),  # no reasoning to keep
    ],
)  # fmt: skip
def test_a_responses_call_carries_only_what_the_model_takes(
    model: str, effort: str, temperature: float | None, expected: dict[str, Any]
) -> None:
    settings = ResponderSettings(reasoning_effort=effort, temperature=temperature)
    items = [{"role": "user", "content": "ann: hi"}]
    body = responses_body(settings, model, "You are Pip.", items, [SEARCH])
    assert body == {
        "model": model,
        "instructions": "You are Pip.",
        "input": items,
        "max_output_tokens": 1024,
        "text": {"format": {"type": "json_schema", **STRICT_ENVELOPE["json_schema"]}},
        "store": False,
        "tools": [SEARCH.responses_shape()],
        **expected,
    }


def test_a_responses_call_to_a_model_that_cannot_see() -> None:
    items = responses_api.input_items(_messages()[1:])
    body = responses_body(ResponderSettings(), "o3-mini", "You are Pip.", items, [])
    assert body["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "ann: look"},
                {"type": "input_text", "text": "[an image was attached here; this model cannot see images]"},
            ],
        }
    ]


# ------------------------------------------------------------------ the memory's calls


@dataclass
class Recorder:
    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def call(self, path: str, body: dict[str, Any], purpose: str) -> ModelRequestResult:
        self.bodies.append(json.loads(json.dumps(body)))
        return ModelRequestResult(status=200, body={"choices": [{"message": {"content": '{"ok": true}'}}]})


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("model", "server", "expected"),
    [
        pytest.param("gpt-5.1", "openai", {"temperature": 0.4, "max_completion_tokens": 300,
                     "response_format": {"type": "json_schema", "json_schema": {"name": "appraisal", "strict": True, "schema": SCHEMA}}},
                     id="gpt-5.1"),  # no effort is sent, and its own is none: temperature is taken
        pytest.param("gpt-5-nano", "openai", {"max_completion_tokens": 300,
                     "response_format": {"type": "json_schema", "json_schema": {"name": "appraisal", "strict": True, "schema": SCHEMA}}},
                     id="gpt-5-nano"),  # its own effort is medium: no temperature
        pytest.param("o4-mini", "openai", {"max_completion_tokens": 300,
                     "response_format": {"type": "json_schema", "json_schema": {"name": "appraisal", "strict": True, "schema": SCHEMA}}},
                     id="o4-mini"),
        pytest.param("llama3.2", "ollama", {"temperature": 0.4, "max_tokens": 300,
                     "response_format": {"type": "json_schema", "json_schema": {"name": "appraisal", "schema": SCHEMA}}},
                     id="ollama"),
    ],
)  # fmt: skip
async def test_a_memory_call_carries_only_what_the_model_takes(
    model: str, server: str, expected: dict[str, Any]
) -> None:
    recorder = Recorder()
    memory = MemoryModel(recorder, MemorySettings(models={"appraisal": model}), "gpt-5.1", server=server)
    assert await memory.chat_json("appraisal", "sys", "user", temperature=0.4, schema=SCHEMA, max_tokens=300)
    [body] = recorder.bodies
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "user"}]
    assert body == {"model": model, "messages": messages, **expected}


# ------------------------------------------------------------------ refused at load, with a one-line fix


def load(model_table: str) -> str | None:
    """The first problem ``[model]`` has, as imp.toml's loader says it; None when it loads."""
    try:
        parse_config(f'name = "pip"\n[model]\n{model_table}', "imp.toml")
    except ImpConfigError as exc:
        assert len(str(exc).splitlines()) == len(exc.problems)  # one line each
        return str(exc.problems[0])
    return None


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        pytest.param('model = "gpt-4.1"\ntools = ["search"]\nreasoning_effort = "high"',
                     "imp.toml:5: key 'model.reasoning_effort': model gpt-4.1 does not reason, so it takes no "
                     'reasoning_effort (got "high"): remove reasoning_effort (or set it to "none"), or use a '
                     "reasoning model such as gpt-5.1", id="tools-and-reasoning-on-a-model-without-it"),
        pytest.param('model = "gpt-5.1"\nreasoning_effort = "minimal"',
                     "imp.toml:4: key 'model.reasoning_effort': model gpt-5.1 does not take reasoning_effort "
                     '"minimal" (it takes none, low, medium, high): set reasoning_effort = "none"', id="effort-value"),
        pytest.param('model = "gpt-5-mini"\nreasoning_effort = "none"',
                     "imp.toml:4: key 'model.reasoning_effort': model gpt-5-mini does not take reasoning_effort "
                     '"none" (it takes minimal, low, medium, high): set reasoning_effort = "minimal"', id="gpt-5-none"),
        pytest.param('model = "gpt-5"\ntemperature = 0.7',
                     "imp.toml:4: key 'model.temperature': model gpt-5 takes no temperature (only its own): "
                     "remove temperature", id="gpt-5-temperature"),
        pytest.param('model = "gpt-5.1"\ntemperature = 0.7\nreasoning_effort = "low"',
                     "imp.toml:4: key 'model.temperature': model gpt-5.1 takes temperature only with "
                     'reasoning_effort = "none" (got "low"): remove temperature or set reasoning_effort = "none"',
                     id="gpt-5.1-temperature-with-effort"),
        pytest.param('model = "gpt-5.2"\ntools = ["search"]\nreasoning_effort = "high"',
                     "imp.toml:5: key 'model.reasoning_effort': model gpt-5.2 takes tools on /chat/completions only "
                     'with reasoning_effort = "none" (ENV-21; got "high"): set reasoning_effort = "none", or '
                     "use_responses_api = true", id="gpt-5.2-chat-tools"),
        pytest.param('model = "llama3.2"\nserver = "ollama"\nuse_responses_api = true',
                     "imp.toml:5: key 'model.use_responses_api': llama3.2 on ollama has no Responses API impyard "
                     "can use: set use_responses_api = false", id="local-responses"),
        pytest.param('model = "llama3.2"\nserver = "ollama"\nreasoning_effort = "low"',
                     "imp.toml:5: key 'model.reasoning_effort': model llama3.2 on ollama does not reason, so it "
                     'takes no reasoning_effort (got "low"): remove reasoning_effort (or set it to "none"), or use '
                     "a reasoning model such as gpt-5.1", id="local-effort"),
        pytest.param('model = "gpt-5.1"\nvision_model = "o3-mini"',
                     "imp.toml:4: key 'model.vision_model': vision_model o3-mini cannot see images: name a model "
                     "that can (e.g. gpt-5.1), or remove it", id="blind-vision-model"),
        pytest.param('model = "gpt-5.1"\nretry_model = "gpt-4.1-nano"\nreasoning_effort = "low"\ntools = ["search"]',
                     "imp.toml:5: key 'model.reasoning_effort': retry_model gpt-4.1-nano does not reason, so it "
                     'takes no reasoning_effort (got "low"): remove reasoning_effort (or set it to "none"), or use '
                     "a reasoning model such as gpt-5.1", id="every-model-key-is-checked"),
    ],
)  # fmt: skip
def test_a_config_that_asks_for_the_impossible_is_refused_at_load(table: str, problem: str) -> None:
    assert load(table) == problem


@pytest.mark.parametrize(
    "table",
    [
        "",  # the defaults: gpt-5.1, effort none
        'tools = ["search", "web_fetch"]\nuse_responses_api = true\nreasoning_effort = "high"',
        'model = "gpt-4.1-mini"\ntools = ["search"]',  # a default effort is adapted, never refused
        'model = "gpt-4.1-mini"\nreasoning_effort = "none"\ntemperature = 0.3',
        'model = "gpt-5"\ntools = ["search"]',  # the default "none" becomes gpt-5's "minimal"
        'model = "gpt-5.1"\ntemperature = 0.2',
        'model = "gpt-5.2"\ntools = ["search"]\nuse_responses_api = true\nreasoning_effort = "xhigh"',
        'model = "llama3.2"\nserver = "ollama"\ntools = ["search"]\ntemperature = 0.8',
        'model = "o3"\nreasoning_effort = "high"',
    ],
)
def test_what_the_models_take_loads(table: str) -> None:
    assert load(table) is None


def test_tools_on_a_server_whose_models_cannot_call_them_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every shipped profile takes function tools; a server without them (a newer table's entry) is refused.
    monkeypatch.setitem(
        SERVER_PROFILES, "toolless", ModelProfile("toolless", tools=False, responses_api=False)
    )
    assert config_problems(models={"model": "m"}, server="toolless", tools=True) == [
        SettingProblem("tools", "model m on toolless cannot call tools: remove tools (tools = [])")
    ]
    assert config_problems(models={"model": "m"}, server="toolless", tools=False) == []


def test_an_unknown_openai_name_is_a_warning_never_a_refusal() -> None:
    assert load('model = "gpt-7-preview"\ntools = ["search"]') is None
    [note] = model_notes("gpt-7-preview")
    assert note.startswith(
        "impyard has no profile for model 'gpt-7-preview': it sends it no reasoning parameters"
    )
    assert model_notes("gpt-5.1") == [] and model_notes("llama3.2", "ollama") == []


@pytest.mark.parametrize("server", ["openai", "ollama", "llama.cpp", "vllm", "lmstudio", "compatible"])
def test_each_server_with_a_profile_is_a_server_value(server: str) -> None:
    assert load(f'model = "m1"\nserver = "{server}"') is None
    assert server == "openai" or profile_for("m1", server).family == server


def test_a_server_without_a_profile_is_refused_with_the_list() -> None:
    assert load('model = "m1"\nserver = "olama"') == (
        'imp.toml:4: key \'model.server\': must be one of "openai", "ollama", "llama.cpp", "vllm", '
        '"lmstudio", "compatible", "llama-cpp-python" (got "olama")'
    )
