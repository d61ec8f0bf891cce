"""The loopback fake OpenAI server, driven by the real openai SDK (docs/contributing.md)."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from testing.fake_openai import (
    DEFAULT_ENVELOPE,
    PURPOSE_HEADER,
    TINY_PNG,
    FakeOpenAI,
    FakeResponse,
    FormFile,
    RecordedRequest,
    embedding_vector,
    envelope,
    error,
    function_call,
    refusal,
    slow,
    tool_call,
)

ENVELOPE_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": ["string", "null"]}, "answer_needed": {"type": "boolean"}},
    "required": ["answer", "answer_needed"],
    "additionalProperties": False,
}


def json_schema_format(name: str = "envelope") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": ENVELOPE_SCHEMA}}


def chat(client: openai.OpenAI, text: str = "hello", **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model="gpt-4.1-mini", messages=[{"role": "user", "content": text}], **kwargs
    )


def content_of(completion: Any) -> Any:
    return json.loads(completion.choices[0].message.content)


def raw_request(
    fake: FakeOpenAI, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
):
    """One request over http.client; returns (status, headers, parsed body)."""
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    try:
        payload = None if body is None else json.dumps(body).encode()
        conn.request(
            method, path, body=payload, headers={"Content-Type": "application/json", **(headers or {})}
        )
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"null")
    finally:
        conn.close()


@pytest.fixture
def fake():
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def client(fake: FakeOpenAI):
    with openai.OpenAI(base_url=fake.base_url, api_key="sk-test-fake", max_retries=0) as sdk:
        yield sdk


def fake_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fake-openai")]


# --------------------------------------------------------------------------- lifecycle and HTTP


def test_base_url_is_loopback_v1_and_stop_leaves_no_thread_even_with_idle_keepalive() -> None:
    before = fake_threads()
    with FakeOpenAI() as fake:
        assert fake.base_url == f"http://127.0.0.1:{fake.port}/v1"
        idle = openai.OpenAI(base_url=fake.base_url, api_key="sk-test-fake", max_retries=0)
        chat(idle)  # leaves a pooled keep-alive connection open on purpose
        assert fake_threads()
    assert fake_threads() == before
    idle.close()


def test_stop_interrupts_a_pending_delay_and_joins_its_thread() -> None:
    fake = FakeOpenAI().start()
    fake.script(slow("late", 30))
    sdk = fake.client(timeout=60)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            chat(sdk)
        except openai.APIError as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    fake.wait_for_requests(1)
    fake.stop()
    caller.join(10)
    assert not caller.is_alive()
    assert [type(e) for e in outcome] == [openai.APIConnectionError]
    assert fake_threads() == []


def test_keep_alive_serves_several_requests_on_one_connection(fake: FakeOpenAI) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    headers = {"Authorization": "Bearer sk-test-fake", "Content-Type": "application/json"}
    body = json.dumps({"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "x"}]})
    sockets = set()
    for _ in range(3):
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = conn.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["object"] == "chat.completion"
        sockets.add(id(conn.sock))
    conn.close()
    assert len(sockets) == 1 and len(fake.requests) == 3


def test_unknown_path_is_a_404_with_an_openai_error_body(fake: FakeOpenAI) -> None:
    status, _, body = raw_request(fake, "POST", "/v1/nope", {}, {"Authorization": "Bearer sk-test-fake"})
    assert status == 404
    assert set(body["error"]) >= {"message", "type", "code"}
    assert fake.requests[0].path == "/v1/nope" and fake.requests[0].status == 404


def test_missing_authorization_is_a_401(fake: FakeOpenAI) -> None:
    status, _, body = raw_request(fake, "POST", "/v1/chat/completions", {"model": "m", "messages": []})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


def test_wrong_key_raises_authentication_error(fake: FakeOpenAI) -> None:
    sdk = openai.OpenAI(base_url=fake.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        chat(sdk)
    assert caught.value.status_code == 401
    assert fake.requests[0].headers["authorization"] == "Bearer sk-wrong"


def test_api_key_none_accepts_any_bearer_token() -> None:
    with FakeOpenAI(api_key=None) as fake:
        assert content_of(chat(fake.client(api_key="sk-anything"))) == DEFAULT_ENVELOPE


def test_bad_json_is_a_400(fake: FakeOpenAI) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    conn.request(
        "POST", "/v1/chat/completions", body=b"{not json", headers={"Authorization": "Bearer sk-test-fake"}
    )
    response = conn.getresponse()
    assert response.status == 400 and "error" in json.loads(response.read())
    conn.close()
    assert fake.requests[0].body == "{not json"


def test_a_plain_httpx_client_works(fake: FakeOpenAI) -> None:
    try:
        import httpx2 as httpx
    except ImportError:
        import httpx
    fake.script("plain")
    with httpx.Client(base_url=fake.base_url, headers={"Authorization": "Bearer sk-test-fake"}) as plain:
        response = plain.post(
            "/chat/completions",
            json={"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "x"}]},
        )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "plain"


# --------------------------------------------------------------------------- chat completions


def test_chat_strict_schema_gets_scripted_envelope_and_the_body_is_recorded_as_sent(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    reply = envelope(answer="hi there", told="Ann greeted the imp.")
    fake.script(reply)
    params = {
        "model": "gpt-4.1-mini",
        "messages": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hello"}],
        "response_format": json_schema_format(),
        "temperature": 0.3,
        "max_completion_tokens": 400,
    }
    completion = client.chat.completions.create(**params)
    assert content_of(completion) == reply
    assert completion.model == "gpt-4.1-mini"
    assert completion.object == "chat.completion"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.refusal is None
    (recorded,) = fake.requests_for("/chat/completions")
    assert recorded.body == params
    assert recorded.path == "/v1/chat/completions"
    assert recorded.schema_name == "envelope"
    assert recorded.headers["content-type"] == "application/json"
    assert recorded.status == 200


def test_default_answer_is_a_valid_envelope(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    body = content_of(chat(client))
    assert body == DEFAULT_ENVELOPE
    assert body["answer"] == "ok" and body["answer_needed"] is True
    assert body["action"] == {"type": "none", "text": None}
    envelope_model = pytest.importorskip("box.common.envelope", reason="box package not importable").Envelope
    envelope_model.model_validate(body)


def test_default_answer_none_makes_unscripted_calls_fail(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.default_answer = None
    with pytest.raises(openai.InternalServerError):
        chat(client)
    assert fake.errors


def test_purpose_header_selects_the_rule(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(envelope(answer="appraised"), purpose="appraisal")
    fake.script(envelope(answer="replied"), purpose="reply")
    got_reply = chat(client, extra_headers={PURPOSE_HEADER: "reply"})
    got_appraisal = chat(client, extra_headers={PURPOSE_HEADER: "appraisal"})
    got_none = chat(client)
    assert content_of(got_reply)["answer"] == "replied"
    assert content_of(got_appraisal)["answer"] == "appraised"
    assert content_of(got_none) == DEFAULT_ENVELOPE
    assert [r.purpose for r in fake.requests] == ["reply", "appraisal", None]


def test_schema_name_selects_the_rule(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script({"summary": "s"}, schema_name="summary")
    fake.script(envelope(answer="env"), schema_name="envelope")
    assert content_of(chat(client, response_format=json_schema_format("summary"))) == {"summary": "s"}
    assert content_of(chat(client, response_format=json_schema_format("envelope")))["answer"] == "env"


def test_rules_combine_criteria_and_first_match_wins(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script("narrow", path="/v1/chat/completions", purpose="reply", schema_name="envelope")
    fake.script("broad")
    fake.script("never reached")
    narrow = chat(client, response_format=json_schema_format(), extra_headers={PURPOSE_HEADER: "reply"})
    assert narrow.choices[0].message.content == "narrow"
    assert chat(client, extra_headers={PURPOSE_HEADER: "reply"}).choices[0].message.content == "broad"


def test_times_exhausts_then_falls_back_to_default(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    rule = fake.script(envelope(answer="once"), times=2)
    answers = [content_of(chat(client))["answer"] for _ in range(3)]
    assert answers == ["once", "once", "ok"]
    assert rule.used == 2 and rule.remaining == 0


def test_callable_answer_sees_the_request(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    def echo(request: RecordedRequest) -> dict[str, Any]:
        return envelope(answer=request.body["messages"][-1]["content"].upper())

    fake.script(echo)
    assert content_of(chat(client, "shout"))["answer"] == "SHOUT"


def test_a_failing_callable_is_a_500_and_is_kept(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    def broken(request: RecordedRequest) -> str:
        raise RuntimeError("boom")

    fake.script(broken)
    with pytest.raises(openai.InternalServerError):
        chat(client)
    assert [str(e) for e in fake.errors] == ["boom"]


def test_default_usage_is_deterministic_and_rule_usage_overrides(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.script("x" * 40, times=1)
    usage = chat(client, "y" * 100).usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (25, 10, 35)
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details.reasoning_tokens == 0
    fake.script(
        "z",
        usage={"prompt_tokens": 1000, "completion_tokens": 50, "cached_tokens": 800, "reasoning_tokens": 7},
    )
    usage = chat(client).usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (1000, 50, 1050)
    assert usage.prompt_tokens_details.cached_tokens == 800
    assert usage.completion_tokens_details.reasoning_tokens == 7


def test_chat_refusal(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(refusal("I can't help with that."))
    message = chat(client).choices[0].message
    assert message.refusal == "I can't help with that." and message.content is None


def test_chat_tool_call(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(tool_call("search_memory", {"query": "cats"}, "call_1"))
    choice = chat(client).choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert (call.id, call.type, call.function.name) == ("call_1", "function", "search_memory")
    assert json.loads(call.function.arguments) == {"query": "cats"}


def test_chat_parallel_tool_calls_get_fresh_ids(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script([tool_call("a"), tool_call("b", {"x": 1})])
    calls = chat(client).choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["a", "b"]
    assert len({c.id for c in calls}) == 2


# --------------------------------------------------------------------------- errors and delays


def test_429_with_retry_after_raises_rate_limit_error(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(error(429, "Rate limit reached", retry_after=2), times=1)
    with pytest.raises(openai.RateLimitError) as caught:
        chat(client)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "2"
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.body["message"] == "Rate limit reached"
    assert content_of(chat(client)) == DEFAULT_ENVELOPE


def test_500_raises_internal_server_error(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(error(500, "upstream broke"))
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client)
    assert caught.value.status_code == 500 and caught.value.type == "server_error"


def test_400_raises_bad_request(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(error(400, "bad schema", code="invalid_schema"))
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client)
    assert caught.value.code == "invalid_schema"


def test_raw_fake_response_without_path_answers_every_endpoint(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.script(FakeResponse(503, {"error": {"message": "down", "type": "server_error", "code": None}}))
    with pytest.raises(openai.InternalServerError):
        client.embeddings.create(model="text-embedding-3-small", input="x")
    with pytest.raises(openai.InternalServerError):
        chat(client)


def test_content_rule_without_path_leaves_embeddings_alone(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    rule = fake.script(envelope(answer="for the reply"), times=1)
    client.embeddings.create(model="text-embedding-3-small", input="x")
    assert rule.used == 0
    assert content_of(chat(client))["answer"] == "for the reply"


def test_slow_answer_honours_its_delay(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(slow(envelope(answer="late"), 0.2))
    started = time.perf_counter()
    assert content_of(chat(client))["answer"] == "late"
    assert time.perf_counter() - started >= 0.2


def test_latency_applies_to_every_answer(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.latency_s = 0.1
    started = time.perf_counter()
    chat(client)
    client.embeddings.create(model="text-embedding-3-small", input="x")
    assert time.perf_counter() - started >= 0.2


# --------------------------------------------------------------------------- responses API


def test_responses_returns_output_text(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    reply = envelope(answer="from responses")
    fake.script(reply, path="/responses", schema_name="envelope")
    params = {
        "model": "gpt-5-mini",
        "instructions": "be brief",
        "input": [{"role": "user", "content": "hi"}],
        "text": {
            "format": {"type": "json_schema", "name": "envelope", "strict": True, "schema": ENVELOPE_SCHEMA}
        },
    }
    response = client.responses.create(**params)
    assert json.loads(response.output_text) == reply
    assert response.status == "completed" and response.model == "gpt-5-mini"
    assert response.usage.input_tokens >= 1 and response.usage.input_tokens_details.cached_tokens == 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    (recorded,) = fake.requests_for("/responses")
    assert recorded.body == params and recorded.schema_name == "envelope"


def test_responses_plain_text(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script("just text", path="/responses")
    assert client.responses.create(model="gpt-4.1-mini", input="hi").output_text == "just text"


def test_responses_function_call(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(function_call("lookup", {"id": 7}, call_id="call_abc"))
    response = client.responses.create(model="gpt-4.1-mini", input="hi", tools=[])
    (item,) = response.output
    assert (item.type, item.name, item.call_id, item.status) == (
        "function_call",
        "lookup",
        "call_abc",
        "completed",
    )
    assert json.loads(item.arguments) == {"id": 7}
    assert item.id


def test_responses_refusal(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(refusal("no"), path="/responses")
    (message,) = client.responses.create(model="gpt-4.1-mini", input="hi").output
    assert message.content[0].type == "refusal" and message.content[0].refusal == "no"


# --------------------------------------------------------------------------- embeddings and images


def test_embeddings_are_deterministic_in_both_encodings(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    first = client.embeddings.create(model="text-embedding-3-small", input=["cat", "dog"])
    again = client.embeddings.create(model="text-embedding-3-small", input="cat", encoding_format="float")
    cat, dog = (d.embedding for d in first.data)
    assert cat == again.data[0].embedding == embedding_vector("cat")
    assert dog != cat and len(cat) == 64
    assert abs(sum(v * v for v in cat) - 1.0) < 1e-5
    assert first.usage.prompt_tokens == first.usage.total_tokens >= 2
    assert fake.requests[0].body["encoding_format"] == "base64"  # the SDK's default


def test_embeddings_honour_dimensions(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    result = client.embeddings.create(model="text-embedding-3-small", input="cat", dimensions=8)
    assert result.data[0].embedding == embedding_vector("cat", 8)


def test_images_generate_returns_b64_png(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    result = client.images.generate(model="gpt-image-1", prompt="a cat", n=2, size="1024x1024")
    assert len(result.data) == 2
    assert base64.b64decode(result.data[0].b64_json) == TINY_PNG and TINY_PNG.startswith(b"\x89PNG")
    assert result.created > 0
    assert result.usage.total_tokens == result.usage.input_tokens + result.usage.output_tokens
    assert fake.requests_for("/images/generations")[0].body["prompt"] == "a cat"


def test_images_edit_records_the_multipart_form(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    picture = TINY_PNG + b"\x00" * 100
    result = client.images.edit(
        model="gpt-image-1", image=("cat.png", picture, "image/png"), prompt="add a hat", n=1
    )
    assert base64.b64decode(result.data[0].b64_json) == TINY_PNG
    (recorded,) = fake.requests_for("/images/edits")
    assert recorded.headers["content-type"].startswith("multipart/form-data")
    assert recorded.body["prompt"] == "add a hat" and recorded.body["model"] == "gpt-image-1"
    upload = recorded.body["image"]
    assert isinstance(upload, FormFile)
    assert (upload.filename, upload.size, upload.data) == ("cat.png", len(picture), picture)


def test_images_edit_with_several_images(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    client.images.edit(
        model="gpt-image-1",
        image=[("a.png", b"aa", "image/png"), ("b.png", b"bbb", "image/png")],
        prompt="merge",
    )
    form = fake.requests[0].body
    files = next(v for k, v in form.items() if k.startswith("image"))
    assert [(f.filename, f.size) for f in files] == [("a.png", 2), ("b.png", 3)]


def test_image_errors_can_be_scripted_by_path(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(error(400, "moderation_blocked", code="moderation_blocked"), path="/images/generations")
    with pytest.raises(openai.BadRequestError):
        client.images.generate(model="gpt-image-1", prompt="x")


# --------------------------------------------------------------------------- concurrency and async


def test_twenty_parallel_requests_are_all_answered_and_recorded(fake: FakeOpenAI) -> None:
    fake.script(lambda request: envelope(answer=request.body["messages"][0]["content"]))
    sdk = fake.client()

    def one(index: int) -> str:
        return content_of(chat(sdk, f"m{index}"))["answer"]

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(one, range(20)))
    assert answers == [f"m{i}" for i in range(20)]
    assert sorted(r.body["messages"][0]["content"] for r in fake.requests) == sorted(answers)
    assert fake.errors == []
    sdk.close()


def test_wait_for_requests_and_clear(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    threading.Thread(target=chat, args=(client,), daemon=True).start()
    (request,) = fake.wait_for_requests(1, path="/chat/completions")
    assert request.endpoint == "/chat/completions"
    with pytest.raises(TimeoutError):
        fake.wait_for_requests(5, timeout_s=0.05)
    fake.clear()
    assert fake.requests == []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_async_client_from_an_async_test() -> None:
    async with FakeOpenAI() as fake:
        fake.script(envelope(answer="async"), purpose="reply")
        async with fake.async_client() as sdk:
            completion = await sdk.chat.completions.create(
                model="gpt-4.1-mini",
                messages=[{"role": "user", "content": "x"}],
                extra_headers={PURPOSE_HEADER: "reply"},
            )
    assert json.loads(completion.choices[0].message.content)["answer"] == "async"
