"""The loopback fake OpenAI refuses what the real API refuses (issue 16), driven by the real openai SDK.

Each refusal is compared with the status and error body the real API answers (written out here, quoted
from the API reference and from real 400s; see the sources in testing/fake_openai.py), and each
shape the real API takes is shown to pass. SPEC-001 ENV-21 (tools + reasoning effort on chat), ENV-22
(Responses reasoning) and ENV-23 (response-only fields refused in passed-back input items) are pinned.
"""

from __future__ import annotations

import http.client
import json
import logging
from typing import Any

import openai
import pytest

from testing.fake_openai import (
    LOCAL_SERVER_MODEL,
    OPENAI_MODELS,
    FakeOpenAI,
    ModelSpec,
    envelope,
    function_call,
)

KEY = "sk-test-fake"
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture
def fake():
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def client(fake: FakeOpenAI):
    with fake.client() as sdk:
        yield sdk


def refused(call: Any, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """(status, the error object) of a call the fake must refuse."""
    with pytest.raises(openai.APIStatusError) as caught:
        call(*args, **kwargs)
    return caught.value.status_code, caught.value.body


def bad_request(
    message: str, param: str | None = None, code: str | None = None
) -> tuple[int, dict[str, Any]]:
    return 400, {"message": message, "type": "invalid_request_error", "param": param, "code": code}


def post(fake: FakeOpenAI, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(status, parsed body) of a raw request, for bodies the SDK would not send as written."""
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    try:
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        conn.request("POST", f"/v1{path}", body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def strict_format(schema: dict[str, Any], name: str = "envelope") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


def obj(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A strict object schema: every property required, nothing else allowed."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
        **extra,
    }


def chat_tool(name: str = "search", parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "look something up",
            "parameters": parameters if parameters is not None else obj({"query": {"type": "string"}}),
            "strict": True,
        },
    }


def flat_tool(name: str = "search", parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": "look something up",
        "parameters": parameters if parameters is not None else obj({"query": {"type": "string"}}),
        "strict": True,
    }


# --------------------------------------------------------------------------- models


def test_an_unknown_model_is_a_404_model_not_found_on_every_text_endpoint(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    expected = (
        404,
        {
            "message": "The model `gpt-x` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        },
    )
    assert refused(client.chat.completions.create, model="gpt-x", messages=USER) == expected
    assert refused(client.responses.create, model="gpt-x", input="hi") == expected
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="gpt-x", input="hi")
    assert [r.rejection["code"] for r in fake.rejections] == ["model_not_found"] * 3


def test_a_missing_model_is_refused(fake: FakeOpenAI) -> None:
    status, body = post(fake, "/chat/completions", {"messages": USER})
    assert status == 400
    assert body["error"] == {
        "message": "you must provide a model parameter",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_a_dated_snapshot_is_served_as_its_family(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="gpt-4.1-mini-2025-04-14", messages=USER, max_tokens=50)
    assert completion.model == "gpt-4.1-mini-2025-04-14"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4.1-mini-2025-4-14", messages=USER)


def test_the_shipped_table_holds_the_models_the_reference_names() -> None:
    text = {name for name, spec in OPENAI_MODELS.items() if spec.kind == "text"}
    assert text == {
        "gpt-5.2", "gpt-5.1", "gpt-5", "gpt-5-mini", "gpt-5-nano", "o1", "o3", "o3-mini", "o4-mini",
        "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "gpt-4o", "gpt-4o-mini",
    }  # fmt: skip
    assert OPENAI_MODELS["gpt-5.1"].efforts == ("none", "low", "medium", "high")
    assert OPENAI_MODELS["gpt-5.1"].default_effort == "none"
    assert OPENAI_MODELS["gpt-5.2"].efforts == ("none", "low", "medium", "high", "xhigh")
    assert OPENAI_MODELS["gpt-5-mini"].efforts == ("minimal", "low", "medium", "high")
    assert OPENAI_MODELS["o3"].efforts == ("low", "medium", "high")
    assert OPENAI_MODELS["gpt-4.1-mini"].efforts == ()


def test_a_test_registers_a_name_like_a_served_model_and_can_remove_it(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    added = fake.add_model("gpt-x", like="gpt-5.1")
    assert added == OPENAI_MODELS["gpt-5.1"]
    assert (
        client.chat.completions.create(model="gpt-x", messages=USER, reasoning_effort="high").model == "gpt-x"
    )
    status, body = refused(client.chat.completions.create, model="gpt-x", messages=USER, max_tokens=5)
    assert (status, body["code"]) == (400, "unsupported_parameter")
    fake.remove_model("gpt-x")
    assert refused(client.chat.completions.create, model="gpt-x", messages=USER)[0] == 404


def test_a_registered_model_takes_field_overrides_and_a_plain_default(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.add_model("blind-5.1", like="gpt-5.1", vision=False)
    fake.add_model("plain")
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    status, body = refused(
        client.chat.completions.create, model="blind-5.1", messages=[{"role": "user", "content": image}]
    )
    assert (status, body["message"]) == (
        400,
        "Invalid content type. image_url is only supported by certain models.",
    )
    assert fake.models["plain"] == ModelSpec()
    client.chat.completions.create(model="plain", messages=USER, max_tokens=5, temperature=1.5)
    with pytest.raises(TypeError):
        fake.add_model("both", ModelSpec(), like="gpt-4.1")
    with pytest.raises(KeyError):
        fake.add_model("copy", like="no-such-model")


def test_models_given_to_the_constructor_are_served() -> None:
    reasoner = ModelSpec(efforts=("low", "high"), default_effort="low", max_tokens=False)
    with FakeOpenAI(models={"my-reasoner": reasoner}) as fake, fake.client() as sdk:
        sdk.chat.completions.create(model="my-reasoner", messages=USER, reasoning_effort="high")
        status, body = refused(
            sdk.chat.completions.create, model="my-reasoner", messages=USER, reasoning_effort="none"
        )
        assert (status, body["code"]) == (400, "unsupported_value")
        assert "my-reasoner" not in OPENAI_MODELS  # the shipped table is untouched


def test_a_model_spec_refuses_an_impossible_description() -> None:
    with pytest.raises(ValueError):
        ModelSpec(kind="audio")
    with pytest.raises(ValueError):
        ModelSpec(temperature="sometimes")
    with pytest.raises(ValueError):
        ModelSpec(efforts=("low",), default_effort="high")
    with pytest.raises(ValueError):
        ModelSpec(default_effort="low")


def test_a_local_server_model_takes_what_openai_would_refuse(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.add_model("llama3.2", LOCAL_SERVER_MODEL)
    loose_schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    completion = client.chat.completions.create(
        model="llama3.2",
        messages=USER,
        max_tokens=100,
        reasoning_effort="high",
        temperature=0.7,
        response_format=strict_format(loose_schema),
        extra_body={"num_ctx": 4096},
    )
    assert completion.model == "llama3.2"
    assert fake.rejections == []


def test_a_model_of_another_kind_is_refused_on_each_endpoint(client: openai.OpenAI) -> None:
    assert refused(client.chat.completions.create, model="text-embedding-3-small", messages=USER) == (
        404,
        {
            "message": "This is not a chat model and thus not supported in the v1/chat/completions endpoint. "
            "Did you mean to use v1/completions?",
            "type": "invalid_request_error",
            "param": "model",
            "code": None,
        },
    )
    status, body = refused(client.embeddings.create, model="gpt-4.1", input="hi")
    assert (status, body["param"]) == (400, "model")


# --------------------------------------------------------------------------- body parameters


def test_chat_refuses_an_unknown_body_parameter(client: openai.OpenAI) -> None:
    assert refused(
        client.chat.completions.create, model="gpt-4.1-mini", messages=USER, extra_body={"thinking": True}
    ) == bad_request("Unrecognized request argument supplied: thinking")


def test_responses_refuses_an_unknown_body_parameter(client: openai.OpenAI) -> None:
    assert refused(
        client.responses.create, model="gpt-4.1-mini", input="hi", extra_body={"messages": USER}
    ) == bad_request("Unknown parameter: 'messages'.", "messages", "unknown_parameter")


def test_every_parameter_of_the_reference_is_taken(fake: FakeOpenAI) -> None:
    body = {
        "model": "gpt-4.1-mini",
        "messages": USER,
        "frequency_penalty": 0,
        "logit_bias": {},
        "logprobs": False,
        "max_completion_tokens": 100,
        "max_tokens": 100,
        "metadata": {"k": "v"},
        "n": 1,
        "parallel_tool_calls": True,
        "presence_penalty": 0,
        "prompt_cache_key": "imp",
        "safety_identifier": "u",
        "seed": 1,
        "service_tier": "auto",
        "stop": None,
        "store": False,
        "temperature": 0.5,
        "top_p": 0.9,
        "user": "u",
    }
    assert post(fake, "/chat/completions", body)[0] == 200


# --------------------------------------------------------------------------- reasoning parameters


def test_reasoning_effort_is_refused_for_a_model_that_does_not_reason(client: openai.OpenAI) -> None:
    assert refused(
        client.chat.completions.create, model="gpt-4.1-mini", messages=USER, reasoning_effort="low"
    ) == bad_request(
        "Unsupported parameter: 'reasoning_effort' is not supported with this model.",
        "reasoning_effort",
        "unsupported_parameter",
    )


def test_an_explicit_null_reasoning_effort_is_taken_by_any_model(fake: FakeOpenAI) -> None:
    body = {"model": "gpt-4.1-mini", "messages": USER, "reasoning_effort": None}
    assert post(fake, "/chat/completions", body)[0] == 200


def test_responses_reasoning_is_refused_for_a_model_that_does_not_reason(client: openai.OpenAI) -> None:
    assert refused(
        client.responses.create, model="gpt-4.1", input="hi", reasoning={"effort": "low"}
    ) == bad_request(
        "Unsupported parameter: 'reasoning.effort' is not supported with this model.",
        "reasoning.effort",
        "unsupported_parameter",
    )


@pytest.mark.parametrize(
    ("model", "effort", "supported"),
    [
        ("gpt-5.1", "minimal", "'none', 'low', 'medium', and 'high'"),
        ("gpt-5.1", "xhigh", "'none', 'low', 'medium', and 'high'"),
        ("gpt-5-mini", "none", "'minimal', 'low', 'medium', and 'high'"),
        ("o3", "minimal", "'low', 'medium', and 'high'"),
    ],
)
def test_an_effort_the_model_does_not_take_is_an_unsupported_value(
    client: openai.OpenAI, model: str, effort: str, supported: str
) -> None:
    message = f"Unsupported value: '{effort}' is not supported with the '{model}' model. Supported values are: {supported}."
    assert refused(
        client.chat.completions.create, model=model, messages=USER, reasoning_effort=effort
    ) == bad_request(message, "reasoning_effort", "unsupported_value")
    assert refused(
        client.responses.create, model=model, input="hi", reasoning={"effort": effort}
    ) == bad_request(message, "reasoning.effort", "unsupported_value")


@pytest.mark.parametrize(
    ("model", "efforts"),
    [
        ("gpt-5.1", ["none", "low", "medium", "high"]),
        ("gpt-5.2", ["none", "low", "medium", "high", "xhigh"]),
        ("gpt-5-nano", ["minimal", "low", "medium", "high"]),
        ("o4-mini", ["low", "medium", "high"]),
    ],
)
def test_each_effort_the_model_takes_passes_on_both_apis(
    client: openai.OpenAI, model: str, efforts: list[str]
) -> None:
    for effort in efforts:
        client.chat.completions.create(model=model, messages=USER, reasoning_effort=effort)
        client.responses.create(model=model, input="hi", reasoning={"effort": effort})


def test_encrypted_reasoning_is_refused_for_a_model_that_does_not_reason(client: openai.OpenAI) -> None:
    assert refused(
        client.responses.create,
        model="gpt-4.1",
        input="hi",
        store=False,
        include=["reasoning.encrypted_content"],
    ) == bad_request("Encrypted content is not supported with this model.", "include")
    client.responses.create(model="gpt-5.1", input="hi", store=False, include=["reasoning.encrypted_content"])


def test_max_tokens_is_refused_for_a_reasoning_model_and_taken_by_the_others(client: openai.OpenAI) -> None:
    expected = bad_request(
        "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
        "max_tokens",
        "unsupported_parameter",
    )
    for model in ("gpt-5.1", "gpt-5-mini", "o3-mini"):
        assert refused(client.chat.completions.create, model=model, messages=USER, max_tokens=100) == expected
        client.chat.completions.create(model=model, messages=USER, max_completion_tokens=100)
    client.chat.completions.create(model="gpt-4o-mini", messages=USER, max_tokens=100)
    client.chat.completions.create(model="gpt-4o-mini", messages=USER, max_completion_tokens=100)


def test_responses_max_output_tokens_below_16_is_refused(client: openai.OpenAI) -> None:
    assert refused(client.responses.create, model="gpt-4.1", input="hi", max_output_tokens=10) == bad_request(
        "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got 10 instead.",
        "max_output_tokens",
        "integer_below_min_value",
    )
    client.responses.create(model="gpt-4.1", input="hi", max_output_tokens=16)


# --------------------------------------------------------------------------- temperature


def test_gpt_5_1_takes_temperature_only_while_its_effort_is_none(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="gpt-5.1", messages=USER, temperature=0.3)  # default effort: none
    client.chat.completions.create(model="gpt-5.1", messages=USER, temperature=0.3, reasoning_effort="none")
    client.responses.create(model="gpt-5.1", input="hi", temperature=0.3, reasoning={"effort": "none"})
    unsupported = bad_request(
        "Unsupported parameter: 'temperature' is not supported with this model.",
        "temperature",
        "unsupported_parameter",
    )
    assert (
        refused(
            client.chat.completions.create,
            model="gpt-5.1",
            messages=USER,
            temperature=0.3,
            reasoning_effort="low",
        )
        == unsupported
    )
    assert (
        refused(
            client.responses.create,
            model="gpt-5.1",
            input="hi",
            temperature=0.3,
            reasoning={"effort": "high"},
        )
        == unsupported
    )
    status, body = refused(
        client.chat.completions.create, model="gpt-5.1", messages=USER, top_p=0.5, reasoning_effort="medium"
    )
    assert (status, body["param"], body["code"]) == (400, "top_p", "unsupported_parameter")


def test_gpt_5_takes_only_the_default_temperature(client: openai.OpenAI) -> None:
    assert refused(
        client.chat.completions.create, model="gpt-5-mini", messages=USER, temperature=0.2
    ) == bad_request(
        "Unsupported value: 'temperature' does not support 0.2 with this model. Only the default (1) value is supported.",
        "temperature",
        "unsupported_value",
    )
    client.chat.completions.create(model="gpt-5-mini", messages=USER, temperature=1)


def test_o_series_takes_no_temperature_at_all(client: openai.OpenAI) -> None:
    status, body = refused(client.chat.completions.create, model="o3", messages=USER, temperature=1)
    assert (status, body["param"], body["code"]) == (400, "temperature", "unsupported_parameter")


def test_a_plain_model_takes_temperature_between_0_and_2(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="gpt-4.1", messages=USER, temperature=0)
    client.chat.completions.create(model="gpt-4.1", messages=USER, temperature=2)
    assert refused(
        client.chat.completions.create, model="gpt-4.1", messages=USER, temperature=3
    ) == bad_request(
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3 instead.",
        "temperature",
        "decimal_above_max_value",
    )
    status, body = refused(client.chat.completions.create, model="gpt-4.1", messages=USER, temperature=-0.5)
    assert (status, body["code"]) == (400, "decimal_below_min_value")


# --------------------------------------------------------------------------- ENV-21: tools and reasoning effort on chat


def test_env_21_gpt_5_2_refuses_function_tools_with_an_effort_other_than_none_on_chat(
    client: openai.OpenAI,
) -> None:
    assert refused(
        client.chat.completions.create,
        model="gpt-5.2",
        messages=USER,
        tools=[chat_tool()],
        reasoning_effort="low",
    ) == bad_request(
        "Function tools with reasoning_effort are not supported for gpt-5.2 in /v1/chat/completions. "
        "Please use /v1/responses instead.",
        "reasoning_effort",
    )
    client.chat.completions.create(
        model="gpt-5.2", messages=USER, tools=[chat_tool()], reasoning_effort="none"
    )
    client.chat.completions.create(
        model="gpt-5.2", messages=USER, tools=[chat_tool()]
    )  # default effort: none
    client.chat.completions.create(model="gpt-5.2", messages=USER, reasoning_effort="xhigh")  # no tools: fine


def test_env_21_a_model_whose_default_effort_is_not_none_needs_it_sent(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.add_model("gpt-5.6", like="gpt-5.2", default_effort="medium")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-5.6", messages=USER, tools=[chat_tool()])
    client.chat.completions.create(
        model="gpt-5.6", messages=USER, tools=[chat_tool()], reasoning_effort="none"
    )


def test_env_21_gpt_5_1_takes_tools_with_every_effort(client: openai.OpenAI) -> None:
    for effort in ("none", "low", "medium", "high"):
        client.chat.completions.create(
            model="gpt-5.1", messages=USER, tools=[chat_tool()], reasoning_effort=effort
        )


def test_env_22_responses_takes_tools_with_reasoning(client: openai.OpenAI) -> None:
    client.responses.create(model="gpt-5.2", input="hi", tools=[flat_tool()], reasoning={"effort": "high"})


# --------------------------------------------------------------------------- strict json_schema


ENVELOPE_LIKE = obj(
    {
        "answer": {"type": ["string", "null"], "description": "what to say"},
        "mood": {"type": "string", "enum": ["calm", "cross"]},
        "count": {"type": ["integer", "null"], "minimum": 1, "maximum": 4},
        "when": {"type": "string", "format": "date-time"},
        "handle": {"type": "string", "pattern": "^@[a-z]+$"},
        "action": obj(
            {"type": {"type": "string", "enum": ["none", "react"]}, "text": {"type": ["string", "null"]}}
        ),
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 0, "maxItems": 5},
        "moment": {"anyOf": [{"$ref": "#/$defs/moment"}, {"type": "null"}]},
    },
    title="Envelope",
    **{"$defs": {"moment": obj({"feeling": {"type": "string"}, "weight": {"type": "number"}})}},
)


def test_a_schema_inside_the_strict_subset_is_taken_on_both_apis(client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="gpt-4.1-mini", messages=USER, response_format=strict_format(ENVELOPE_LIKE)
    )
    text = {"format": {"type": "json_schema", "name": "envelope", "strict": True, "schema": ENVELOPE_LIKE}}
    client.responses.create(model="gpt-5.1", input="hi", text=text)


def test_a_recursive_schema_is_taken(client: openai.OpenAI) -> None:
    tree = obj({"label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}})
    client.chat.completions.create(
        model="gpt-4.1-mini", messages=USER, response_format=strict_format(tree, "tree")
    )


def test_a_schema_outside_the_subset_is_taken_when_not_strict(client: openai.OpenAI) -> None:
    loose = {"type": "object", "properties": {"a": {"type": "string"}}, "oneOf": []}
    fmt = {"type": "json_schema", "json_schema": {"name": "loose", "strict": False, "schema": loose}}
    client.chat.completions.create(model="gpt-4.1-mini", messages=USER, response_format=fmt)


def _with(schema: dict[str, Any], path: tuple[str, ...], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``schema`` with the node at ``path`` changed (None removes a key)."""
    copy = json.loads(json.dumps(schema))
    node = copy
    for part in path:
        node = node[int(part)] if isinstance(node, list) else node[part]
    for key, value in changes.items():
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    return copy


SMALL = obj({"answer": {"type": "string"}, "action": obj({"text": {"type": "string"}})})


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (
            _with(SMALL, (), additionalProperties=None),
            "In context=(), 'additionalProperties' is required to be supplied and to be false.",
        ),
        (
            _with(SMALL, ("properties", "action"), additionalProperties=True),
            "In context=('properties', 'action'), 'additionalProperties' is required to be supplied and to be false.",
        ),
        (
            _with(SMALL, (), required=["answer"]),
            "In context=(), 'required' is required to be supplied and to be an array including every key in "
            "properties. Missing 'action'.",
        ),
        (
            _with(SMALL, ("properties", "action"), required=None),
            "In context=('properties', 'action'), 'required' is required to be supplied and to be an array "
            "including every key in properties. Missing 'text'.",
        ),
        (
            _with(SMALL, (), required=["answer", "action", "extra"]),
            "In context=(), Extra required key 'extra' supplied.",
        ),
        (_with(SMALL, (), oneOf=[{"required": ["answer"]}]), "In context=(), 'oneOf' is not permitted."),
        (_with(SMALL, ("properties", "answer"), allOf=[{"type": "string"}]), None),
        (_with(SMALL, ("properties", "answer"), **{"not": {"type": "null"}}), None),
        (_with(SMALL, ("properties", "answer"), uniqueItems=True), None),
        (_with(SMALL, ("properties", "answer"), minimum=3), None),
        (_with(SMALL, ("properties", "answer"), format="uri"), None),
        (_with(SMALL, ("properties", "answer"), type=None), None),
        (
            {"type": "array", "items": {"type": "string"}},
            "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"array\"'.",
        ),
        (
            {"anyOf": [SMALL, {"type": "null"}]},
            "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"None\"'.",
        ),
        (
            obj({"list": {"type": "array"}}),
            "In context=('properties', 'list'), array schema missing items.",
        ),
        (
            {"type": "object", "additionalProperties": False},
            "In context=(), object schema missing properties.",
        ),
        (obj({"ref": {"$ref": "#/$defs/missing"}}), None),
        (obj({"ref": {"$ref": "#/$defs/m", "type": "object"}}, **{"$defs": {"m": SMALL}}), None),
    ],
)
def test_a_strict_schema_outside_the_subset_is_refused(
    client: openai.OpenAI, schema: dict[str, Any], problem: str | None
) -> None:
    status, body = refused(
        client.chat.completions.create,
        model="gpt-4.1-mini",
        messages=USER,
        response_format=strict_format(schema),
    )
    assert (status, body["type"], body["param"], body["code"]) == (
        400,
        "invalid_request_error",
        "response_format",
        "invalid_json_schema",
    )
    assert body["message"].startswith("Invalid schema for response_format 'envelope': ")
    if problem is not None:
        assert body["message"] == f"Invalid schema for response_format 'envelope': {problem}"


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("allOf", [{"type": "string"}]),
        ("not", {"type": "null"}),
        ("if", {}),
        ("dependentRequired", {}),
        ("uniqueItems", True),
    ],
)
def test_each_unsupported_keyword_is_named_as_not_permitted(
    client: openai.OpenAI, keyword: str, value: Any
) -> None:
    schema = _with(SMALL, ("properties", "answer"), **{keyword: value})
    _, body = refused(
        client.chat.completions.create,
        model="gpt-4.1-mini",
        messages=USER,
        response_format=strict_format(schema),
    )
    assert body["message"] == (
        f"Invalid schema for response_format 'envelope': In context=('properties', 'answer'), '{keyword}' is not permitted."
    )


def test_nesting_deeper_than_ten_levels_is_refused(client: openai.OpenAI) -> None:
    def nest(levels: int) -> dict[str, Any]:
        node = obj({"leaf": {"type": "string"}})
        for _ in range(levels - 1):
            node = obj({"child": node})
        return node

    client.chat.completions.create(
        model="gpt-4.1-mini", messages=USER, response_format=strict_format(nest(10))
    )
    _, body = refused(
        client.chat.completions.create,
        model="gpt-4.1-mini",
        messages=USER,
        response_format=strict_format(nest(11)),
    )
    assert (
        body["message"]
        == "Invalid schema for response_format 'envelope': 11 levels of nesting exceeds limit of 10."
    )


def test_more_than_five_thousand_properties_or_a_thousand_enum_values_are_refused(
    client: openai.OpenAI,
) -> None:
    wide = obj({f"p{i}": {"type": "string"} for i in range(5001)})
    _, body = refused(
        client.chat.completions.create,
        model="gpt-4.1-mini",
        messages=USER,
        response_format=strict_format(wide),
    )
    assert "5001 object properties exceeds limit of 5000" in body["message"]
    many = obj({"pick": {"type": "string", "enum": [f"v{i}" for i in range(1001)]}})
    _, body = refused(
        client.chat.completions.create,
        model="gpt-4.1-mini",
        messages=USER,
        response_format=strict_format(many),
    )
    assert "1001 enum values exceeds limit of 1000" in body["message"]


def test_responses_text_format_is_held_to_the_same_rules(client: openai.OpenAI) -> None:
    text = {
        "format": {
            "type": "json_schema",
            "name": "envelope",
            "strict": True,
            "schema": _with(SMALL, (), required=[]),
        }
    }
    assert refused(client.responses.create, model="gpt-5.1", input="hi", text=text) == bad_request(
        "Invalid schema for response_format 'envelope': In context=(), 'required' is required to be supplied and "
        "to be an array including every key in properties. Missing 'answer'.",
        "text.format.schema",
        "invalid_json_schema",
    )
    nameless = {"format": {"type": "json_schema", "strict": True, "schema": SMALL}}
    assert refused(client.responses.create, model="gpt-5.1", input="hi", text=nameless) == bad_request(
        "Missing required parameter: 'text.format.name'.", "text.format.name", "missing_required_parameter"
    )


def test_a_format_name_outside_the_alphabet_is_refused(client: openai.OpenAI) -> None:
    assert refused(
        client.chat.completions.create,
        model="gpt-4.1-mini",
        messages=USER,
        response_format=strict_format(SMALL, "my envelope"),
    ) == bad_request(
        "Invalid 'response_format.json_schema.name': string does not match pattern. Expected a string that "
        "matches the pattern '^[a-zA-Z0-9_-]+$'.",
        "response_format.json_schema.name",
        "invalid_value",
    )


def test_a_format_without_its_json_schema_is_refused(client: openai.OpenAI) -> None:
    assert refused(
        client.chat.completions.create,
        model="gpt-4.1-mini",
        messages=USER,
        response_format={"type": "json_schema"},
    ) == bad_request(
        "Missing required parameter: 'response_format.json_schema'.",
        "response_format.json_schema",
        "missing_required_parameter",
    )


def test_json_object_mode_needs_the_word_json_in_the_messages(client: openai.OpenAI) -> None:
    assert refused(
        client.chat.completions.create,
        model="gpt-4.1-mini",
        messages=USER,
        response_format={"type": "json_object"},
    ) == bad_request(
        "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'.",
        "messages",
    )
    client.chat.completions.create(
        model="gpt-4.1-mini",
        messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format={"type": "json_object"},
    )


def test_a_model_without_structured_outputs_refuses_json_schema(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.add_model("old-chat", structured_outputs=False)
    status, body = refused(
        client.chat.completions.create, model="old-chat", messages=USER, response_format=strict_format(SMALL)
    )
    assert (status, body["param"]) == (400, "response_format")


# --------------------------------------------------------------------------- strict function tools


def test_a_strict_chat_function_is_held_to_the_subset(client: openai.OpenAI) -> None:
    loose = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    assert refused(
        client.chat.completions.create,
        model="gpt-4.1-mini",
        messages=USER,
        tools=[chat_tool("search", loose)],
    ) == bad_request(
        "Invalid schema for function 'search': In context=(), 'additionalProperties' is required to be supplied "
        "and to be false.",
        "tools[0].function.parameters",
        "invalid_function_parameters",
    )


def test_a_strict_responses_function_is_held_to_the_subset(client: openai.OpenAI) -> None:
    loose = obj({"query": {"type": "string"}, "limit": {"type": "integer"}}, required=["query"])
    assert refused(
        client.responses.create, model="gpt-5.1", input="hi", tools=[flat_tool("search", loose)]
    ) == bad_request(
        "Invalid schema for function 'search': In context=(), 'required' is required to be supplied and to be an "
        "array including every key in properties. Missing 'limit'.",
        "tools[0].parameters",
        "invalid_function_parameters",
    )


def test_a_chat_shaped_tool_on_responses_is_missing_its_name(client: openai.OpenAI) -> None:
    assert refused(client.responses.create, model="gpt-5.1", input="hi", tools=[chat_tool()]) == bad_request(
        "Missing required parameter: 'tools[0].name'.", "tools[0].name", "missing_required_parameter"
    )


def test_a_function_name_longer_than_64_is_refused(client: openai.OpenAI) -> None:
    assert refused(
        client.chat.completions.create, model="gpt-4.1-mini", messages=USER, tools=[chat_tool("x" * 65)]
    ) == bad_request(
        "Invalid 'tools[0].function.name': string too long. Expected a string with maximum length 64, but got a "
        "string with length 65 instead.",
        "tools[0].function.name",
        "string_above_max_length",
    )


def test_a_non_strict_function_may_leave_properties_optional(client: openai.OpenAI) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    client.chat.completions.create(model="gpt-4.1-mini", messages=USER, tools=[tool])


def test_a_model_without_tools_refuses_them(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.add_model("toolless", tools=False)
    status, body = refused(
        client.chat.completions.create, model="toolless", messages=USER, tools=[chat_tool()]
    )
    assert (status, body["param"], body["code"]) == (400, "tools", "unsupported_parameter")


# --------------------------------------------------------------------------- chat messages


def test_chat_takes_a_whole_tool_round(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "be kind"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
                {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
    ]
    client.chat.completions.create(model="gpt-4.1", messages=messages, tools=[chat_tool()])


def test_an_unanswered_tool_call_is_refused(client: openai.OpenAI) -> None:
    messages = [
        *USER,
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "s", "arguments": "{}"}}
            ],
        },
        {"role": "user", "content": "and?"},
    ]
    assert refused(client.chat.completions.create, model="gpt-4.1", messages=messages) == bad_request(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: call_1",
        "messages.[2].role",
    )


def test_a_tool_call_left_unanswered_at_the_end_is_refused(client: openai.OpenAI) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "s", "arguments": "{}"}}
    messages = [*USER, {"role": "assistant", "tool_calls": [call]}]
    assert refused(client.chat.completions.create, model="gpt-4.1", messages=messages) == bad_request(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: call_1",
        "messages",
    )


def test_a_tool_message_without_its_call_is_refused(client: openai.OpenAI) -> None:
    messages = [*USER, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]
    assert refused(client.chat.completions.create, model="gpt-4.1", messages=messages) == bad_request(
        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
        "messages.[1].role",
    )


def test_a_tool_message_without_tool_call_id_is_refused(fake: FakeOpenAI) -> None:
    messages = [
        *USER,
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "s", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "x"},
    ]
    status, body = post(fake, "/chat/completions", {"model": "gpt-4.1", "messages": messages})
    assert (status, body["error"]["param"]) == (400, "messages.[2].tool_call_id")


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (
            [],
            bad_request(
                "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
                "messages",
                "empty_array",
            ),
        ),
        (
            [{"role": "robot", "content": "x"}],
            bad_request(
                "Invalid value: 'robot'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', "
                "and 'developer'.",
                "messages.[0].role",
                "invalid_value",
            ),
        ),
        (
            [{"role": "user", "content": None}],
            bad_request("Invalid value for 'content': expected a string, got null.", "messages.[0].content"),
        ),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}],
            bad_request(
                "Invalid value: 'input_text'. Supported values are: 'text', 'image_url', 'input_audio', and 'file'.",
                "messages.[0].content.[0].type",
                "invalid_value",
            ),
        ),
        (
            [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}],
            bad_request(
                "Invalid value: 'image_url'. Supported values are: 'text'.",
                "messages.[0].content.[0].type",
                "invalid_value",
            ),
        ),
    ],
)
def test_chat_messages_out_of_shape_are_refused(
    fake: FakeOpenAI, messages: list[Any], expected: tuple[int, dict[str, Any]]
) -> None:
    status, body = post(fake, "/chat/completions", {"model": "gpt-4.1", "messages": messages})
    assert (status, body["error"]) == expected


def test_an_image_for_a_model_without_vision_is_refused(client: openai.OpenAI) -> None:
    content = [
        {"type": "text", "text": "what is it"},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
    ]
    status, body = refused(
        client.chat.completions.create, model="o3-mini", messages=[{"role": "user", "content": content}]
    )
    assert (status, body["message"], body["param"]) == (
        400,
        "Invalid content type. image_url is only supported by certain models.",
        "messages.[0].content.[1].type",
    )


# --------------------------------------------------------------------------- Responses input items (ENV-23)


def test_responses_takes_the_documented_input_shapes(client: openai.OpenAI) -> None:
    items = [
        {"role": "developer", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            ],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "message", "role": "user", "content": "again"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "abc"},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "search",
            "arguments": "{}",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "found"},
    ]
    client.responses.create(model="gpt-5.1", input=items, tools=[flat_tool()], store=False)


def test_env_23_a_reasoning_item_passed_back_with_its_status_is_refused(client: openai.OpenAI) -> None:
    items = [
        *USER,
        {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed"},
    ]
    assert refused(client.responses.create, model="gpt-5.1", input=items) == bad_request(
        "Unknown parameter: 'input[1].status'.", "input[1].status", "unknown_parameter"
    )


def test_env_23_the_output_passed_back_raw_is_refused_and_reduced_is_taken(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.script(function_call("search", {"query": "cats"}, call_id="call_7"), path="/responses", times=1)
    fake.script(envelope(answer="cats!"), path="/responses")
    params: dict[str, Any] = {
        "model": "gpt-5.1",
        "reasoning": {"effort": "low"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "tools": [flat_tool()],
    }
    first = client.responses.create(input=USER, **params).model_dump(exclude_none=True)["output"]
    assert [item["type"] for item in first] == ["reasoning", "function_call"]
    assert first[0]["status"] == "completed" and first[0]["encrypted_content"]
    answer = {"type": "function_call_output", "call_id": "call_7", "output": "three cats"}
    status, body = refused(client.responses.create, input=[*USER, *first, answer], **params)
    assert (status, body["param"], body["code"]) == (400, "input[1].status", "unknown_parameter")
    keep = {
        "reasoning": ("type", "id", "summary", "encrypted_content"),
        "function_call": ("type", "id", "call_id", "name", "arguments"),
    }
    reduced = [{k: item[k] for k in keep[item["type"]] if k in item} for item in first]
    second = client.responses.create(input=[*USER, *reduced, answer], **params)
    assert json.loads(second.output_text)["answer"] == "cats!"


def test_env_23_without_store_a_reasoning_item_needs_its_encrypted_content(client: openai.OpenAI) -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "search", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "x"}
    bare = {"type": "reasoning", "id": "rs_1", "summary": []}
    assert refused(
        client.responses.create, model="gpt-5.1", input=[*USER, bare, call, output], store=False
    ) == (
        404,
        {
            "message": "Item with id 'rs_1' not found. Items are not persisted when `store` is set to false. "
            "Try again with `store` set to true, or remove this item from your input.",
            "type": "invalid_request_error",
            "param": "input",
            "code": None,
        },
    )
    carried = {**bare, "encrypted_content": "opaque"}
    client.responses.create(model="gpt-5.1", input=[*USER, carried, call, output], store=False)
    client.responses.create(model="gpt-5.1", input=[*USER, bare, call, output])  # stored: found by its id


def test_no_reasoning_item_while_the_effort_is_none_or_the_model_does_not_reason(
    client: openai.OpenAI,
) -> None:
    assert [i.type for i in client.responses.create(model="gpt-5.1", input="hi").output] == ["message"]
    assert [i.type for i in client.responses.create(model="gpt-4.1", input="hi").output] == ["message"]
    assert [i.type for i in client.responses.create(model="o3", input="hi").output] == [
        "reasoning",
        "message",
    ]


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (
            [{"type": "reasoning", "id": "rs_1"}],
            bad_request(
                "Missing required parameter: 'input[0].summary'.",
                "input[0].summary",
                "missing_required_parameter",
            ),
        ),
        (
            [{"type": "function_call_output", "call_id": "call_9", "output": "x"}],
            bad_request("No tool call found for function call output with call_id call_9.", "input"),
        ),
        (
            [{"type": "function_call", "call_id": "call_9", "name": "s", "arguments": "{}"}],
            bad_request("No tool output found for function call call_9.", "input"),
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
            bad_request(
                "Invalid value: 'text'. Supported values are: 'input_text', 'input_image', 'output_text', 'refusal', "
                "'input_file', 'computer_screenshot', and 'summary_text'.",
                "input[0].content[0]",
                "invalid_value",
            ),
        ),
        (
            [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}],
            bad_request(
                "Invalid value: 'input_text'. Supported values are: 'output_text' and 'refusal'.",
                "input[0].content[0].type",
                "invalid_value",
            ),
        ),
        (
            [{"role": "user", "content": "x", "name": "ann"}],
            bad_request("Unknown parameter: 'input[0].name'.", "input[0].name", "unknown_parameter"),
        ),
        (
            [{"role": "tool", "content": "x"}],
            bad_request(
                "Invalid value: 'tool'. Supported values are: 'user', 'assistant', 'system', and 'developer'.",
                "input[0].role",
                "invalid_value",
            ),
        ),
    ],
)
def test_responses_input_out_of_shape_is_refused(
    fake: FakeOpenAI, items: list[Any], expected: tuple[int, dict[str, Any]]
) -> None:
    status, body = post(fake, "/responses", {"model": "gpt-5.1", "input": items})
    assert (status, body["error"]) == expected


def test_an_unknown_input_item_type_is_refused(fake: FakeOpenAI) -> None:
    status, body = post(fake, "/responses", {"model": "gpt-5.1", "input": [{"type": "thought", "text": "x"}]})
    error = body["error"]
    assert (status, error["param"], error["code"]) == (400, "input[0].type", "invalid_value")
    assert error["message"].startswith(
        "Invalid value: 'thought'. Supported values are: 'message', 'function_call',"
    )


# --------------------------------------------------------------------------- embeddings and images


def test_dimensions_are_taken_only_by_the_v3_embedding_models(client: openai.OpenAI) -> None:
    client.embeddings.create(model="text-embedding-3-large", input="cat", dimensions=8)
    assert refused(
        client.embeddings.create, model="text-embedding-ada-002", input="cat", dimensions=8
    ) == bad_request("This model does not support specifying dimensions.")


def test_embeddings_refuse_an_unknown_parameter(client: openai.OpenAI) -> None:
    assert refused(
        client.embeddings.create, model="text-embedding-3-small", input="cat", extra_body={"truncate": True}
    ) == bad_request("Unrecognized request argument supplied: truncate")


def test_images_take_a_missing_model_and_refuse_an_unknown_one(client: openai.OpenAI) -> None:
    assert client.images.generate(prompt="a cat").data
    status, body = refused(client.images.generate, model="img-x", prompt="a cat")
    assert (status, body["code"]) == (404, "model_not_found")


# --------------------------------------------------------------------------- refusals and rules


def test_a_refusal_comes_before_the_rules_uses_none_and_is_logged(
    fake: FakeOpenAI, client: openai.OpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    rule = fake.script(envelope(answer="scripted"), times=1)
    with caplog.at_level(logging.WARNING, logger="testing.fake_openai"):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="gpt-4.1", messages=USER, reasoning_effort="low")
    assert rule.used == 0
    (rejected,) = fake.rejections
    assert rejected.status == 400 and rejected.rejection is not None
    assert rejected.rejection["param"] == "reasoning_effort"
    assert "fake OpenAI refused POST /v1/chat/completions (model 'gpt-4.1')" in caplog.text
    assert "unsupported_parameter" in caplog.text
    completion = client.chat.completions.create(model="gpt-4.1", messages=USER)
    assert json.loads(completion.choices[0].message.content)["answer"] == "scripted"
    assert rule.used == 1 and len(fake.rejections) == 1


def test_a_scripted_error_is_not_a_rejection(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    from testing.fake_openai import error

    fake.script(error(429, "slow down"), times=1)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="gpt-4.1", messages=USER)
    assert fake.rejections == [] and fake.requests[0].status == 429
