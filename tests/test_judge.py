"""The pure rules of the gateway, as tables: the judge, its facts, the trust ladder, the approver
policy, the egress address check and the host-side text extraction."""

from __future__ import annotations

import base64
import ipaddress
from datetime import UTC, datetime
from typing import Any

import pytest

from box import chat_api, responses_api
from box.common.envelope import Envelope
from box.common.request_bodies import chat_body, responses_body
from box.images import image_request
from box.protocol.models import (
    DiscordSendParams,
    HttpFetchParams,
    ModelRequestParams,
    ResponderSettings,
    SendFile,
)
from box.tools import Tool, ToolCall
from impyard.gateway.fetch import address_refusal, extract_text, html_to_text
from impyard.gateway.gates import Approver, Gate, may_decide
from impyard.gateway.judge import (
    DEFAULT_DENY,
    MALFORMED,
    BodyFacts,
    RequestFacts,
    discord_send_facts,
    host_selected,
    http_fetch_facts,
    inspect_body,
    judge,
    model_request_facts,
)
from impyard.gateway.policy import policy_from_text
from impyard.gateway.policy_models import TrustSettings
from impyard.gateway.trust import ChannelInfo, channel_is_trusted, decide_trust
from testing.fake_openai import envelope as full_envelope

POLICY = policy_from_text(
    """
[channels]
staff = ["staff-1"]

[[rules]]
name = "quiet-imp"
scope = "grumpy"
method = "*"
action = "deny"
reason = "grumpy is suspended"

[[rules]]
name = "rich"
scope = "richie"
method = "model.request"
action = "allow"
paths = ["/responses"]
purposes = { reply = ["gpt-a"] }
image_hosts = ["*.example.org"]
stored_context_tokens = 20000

[[rules]]
name = "chat"
method = "model.request"
action = "allow"
paths = ["/chat/completions", "/responses"]
max_body_bytes = 1000
max_tokens = 500
purposes = { reply = ["gpt-a", "gpt-b"], summary = ["gpt-a"] }

[[rules]]
name = "embed-anything"
method = "model.request"
action = "allow"
paths = ["/embeddings"]
purposes = { "*" = ["*"] }

[[rules]]
name = "images"
method = "model.request"
action = "allow"
paths = ["/images/generations"]
max_images = 2
purposes = { image = ["img-1"] }

[[rules]]
name = "send-own"
method = "discord.send"
action = "allow"
channels = ["own"]
max_content_chars = 100
max_files = 1
max_file_bytes = 10

[[rules]]
name = "send-staff"
method = "discord.send"
action = "allow"
channels = ["staff", "announce-9"]
trust = "auto"

[[rules]]
name = "fetch-wiki"
method = "http.fetch"
action = "allow"
hosts = ["en.wikipedia.org", "*.wikimedia.org"]
""",
    "judge-test.toml",
)


def model(**overrides: object) -> RequestFacts:
    values: dict[str, object] = dict(
        imp="pip", method="model.request", session_channel="c1", path="/chat/completions", purpose="reply",
        model="gpt-a", body_bytes=100, output_tokens=100,
    )  # fmt: skip
    values.update(overrides)
    return RequestFacts(**values)  # type: ignore[arg-type]


def send(**overrides: object) -> RequestFacts:
    values: dict[str, object] = dict(
        imp="pip", method="discord.send", session_channel="c1", target_channel="c1", content_chars=10
    )
    values.update(overrides)
    return RequestFacts(**values)  # type: ignore[arg-type]


def fetch(host: str) -> RequestFacts:
    return RequestFacts(imp="pip", method="http.fetch", session_channel="c1", host=host)


@pytest.mark.parametrize(
    ("facts", "allowed", "rule", "reason"),
    [
        pytest.param(model(), True, "chat", "allowed", id="chat-allowed"),
        pytest.param(
            model(path="/responses", purpose="summary"), True, "chat", "allowed", id="responses-summary"
        ),
        pytest.param(  # issue 16: the purposes list is a selector; no later rule lists gpt-b for summary
            model(model="gpt-b", purpose="summary"),
            False,
            DEFAULT_DENY,
            "no rule allows model 'gpt-b' for purpose 'summary' on /chat/completions (the rules list: gpt-a)",
            id="model-not-for-purpose",
        ),
        pytest.param(
            model(purpose="gossip"), False, DEFAULT_DENY, "for purpose 'gossip'", id="unknown-purpose"
        ),
        pytest.param(
            model(path="/images/edits", purpose="image"),
            False,
            DEFAULT_DENY,
            "/images/edits",
            id="path-not-allowed",
        ),
        pytest.param(
            model(body_bytes=1001), False, "chat", "1001 bytes, over the limit of 1000", id="body-too-big"
        ),
        pytest.param(
            model(output_tokens=501),
            False,
            "chat",
            "output cap 501 tokens is over the limit of 500",
            id="too-many-tokens",
        ),
        pytest.param(model(output_tokens=None), True, "chat", "allowed", id="no-cap-is-judged-by-budget"),
        pytest.param(model(model=None), False, DEFAULT_DENY, "names no model", id="no-model"),
        pytest.param(
            model(path="/embeddings", purpose="anything", model="emb-x"),
            True,
            "embed-anything",
            "allowed",
            id="wildcards",
        ),
        pytest.param(
            model(path="/images/generations", purpose="image", model="img-1", images=3),
            False,
            "images",
            "3 images",
            id="too-many-images",
        ),
        pytest.param(model(imp="grumpy"), False, "quiet-imp", "grumpy is suspended", id="scoped-deny-first"),
        pytest.param(
            model(malformed="max_tokens must be a positive integer"),
            False,
            MALFORMED,
            "positive integer",
            id="malformed",
        ),
        # issue 11 #4: what the provider would do beyond the prompt is refused by the matched rule, by name
        pytest.param(
            model(body_problem="tools[0]: tool type 'mcp' is not allowed (function tools only)"),
            False,
            "chat",
            "tool type 'mcp'",
            id="body-outside-the-allow-list",
        ),
        pytest.param(
            model(image_hosts=("img.example.org",)),
            False,
            "chat",
            "only inline data:image/",
            id="image-url-without-image-hosts",
        ),
        pytest.param(
            model(imp="richie", path="/responses", image_hosts=("img.example.org",)),
            True,
            "rich",
            "allowed",
            id="image-host-named",
        ),
        pytest.param(
            model(imp="richie", path="/responses", image_hosts=("example.org",)),
            False,
            "rich",
            "'example.org'",
            id="image-host-apex-not-named",
        ),
        pytest.param(
            model(imp="richie", path="/responses", image_hosts=("img.example.org", "evil.example")),
            False,
            "rich",
            "'evil.example'",
            id="every-image-host-must-be-named",
        ),
        pytest.param(
            model(path="/responses", stored_context=("previous_response_id",)),
            False,
            "chat",
            "previous_response_id pulls stored context",
            id="stored-context-without-a-worst-case",
        ),
        pytest.param(
            model(imp="richie", path="/responses", stored_context=("conversation",)),
            True,
            "rich",
            "allowed",
            id="stored-context-with-a-worst-case",
        ),
        pytest.param(send(), True, "send-own", "allowed", id="own-channel"),
        pytest.param(send(target_channel="staff-1"), True, "send-staff", "allowed", id="staff-channel"),
        pytest.param(
            send(target_channel="announce-9"), True, "send-staff", "allowed", id="explicit-channel-id"
        ),
        pytest.param(
            send(target_channel="c2"),
            False,
            DEFAULT_DENY,
            "neither this session's channel nor a staff",
            id="other-channel",
        ),
        pytest.param(
            send(content_chars=101),
            False,
            "send-own",
            "101 characters, over the limit of 100",
            id="content-too-long",
        ),
        pytest.param(send(files=2), False, "send-own", "2 files attached", id="too-many-files"),
        pytest.param(
            send(files=1, largest_file_bytes=11),
            False,
            "send-own",
            "11 bytes is over the limit of 10",
            id="file-too-big",
        ),
        pytest.param(fetch("en.wikipedia.org"), True, "fetch-wiki", "allowed", id="fetch-listed-host"),
        pytest.param(
            fetch("upload.wikimedia.org"), True, "fetch-wiki", "allowed", id="fetch-wildcard-subdomain"
        ),
        pytest.param(
            fetch("wikimedia.org"),
            False,
            DEFAULT_DENY,
            "not on the allow-list",
            id="wildcard-is-not-the-apex",
        ),
        pytest.param(
            fetch("evil.example"), False, DEFAULT_DENY, "not on the allow-list", id="fetch-unlisted-host"
        ),
        pytest.param(
            fetch("en.wikipedia.org.evil.example"),
            False,
            DEFAULT_DENY,
            "not on the allow-list",
            id="suffix-trick",
        ),
        pytest.param(
            RequestFacts(imp="pip", method="teleport"),
            False,
            DEFAULT_DENY,
            "no rule allows teleport",
            id="unknown-method",
        ),
    ],
)
def test_judge(facts: RequestFacts, allowed: bool, rule: str, reason: str) -> None:
    verdict = judge(facts, POLICY)
    assert (verdict.allowed, verdict.rule) == (allowed, rule), verdict
    assert reason in verdict.reason


def test_the_default_is_deny() -> None:
    empty = policy_from_text("")
    verdict = judge(model(), empty)
    assert not verdict.allowed and verdict.rule == DEFAULT_DENY and verdict.matched is None


@pytest.mark.parametrize(
    ("pattern", "host", "selected"),
    [
        ("a.com", "a.com", True),
        ("a.com", "b.a.com", False),
        ("*.a.com", "b.a.com", True),
        ("*.a.com", "a.com", False),
        ("*.a.com", "xa.com", False),
        ("a.com", None, False),
    ],
)
def test_host_selection(pattern: str, host: str | None, selected: bool) -> None:
    assert host_selected(pattern, host) is selected


# --- facts from params -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "path", "malformed", "output_tokens", "images"),
    [
        ({"model": "m", "max_completion_tokens": 50}, "/chat/completions", None, 50, None),
        ({"model": "m", "max_tokens": 10, "max_completion_tokens": 70}, "/chat/completions", None, 70, None),
        ({"model": "m", "max_output_tokens": 30}, "/responses", None, 30, None),
        ({"model": "m"}, "/chat/completions", None, None, None),
        ({"model": "m", "max_tokens": "lots"}, "/chat/completions", "positive integer", None, None),
        ({"model": "m", "max_tokens": True}, "/chat/completions", "positive integer", None, None),
        ({"model": "m", "max_tokens": -1}, "/chat/completions", "positive integer", None, None),
        ({"model": 7}, "/chat/completions", "model must be a string", None, None),
        ({"model": "m", "stream": True}, "/chat/completions", "streaming is not supported", None, None),
        ({"model": "img", "n": 3}, "/images/generations", None, None, 3),
        ({"model": "img"}, "/images/generations", None, None, 1),
        ({"model": "img", "n": "3"}, "/images/generations", "n must be a positive integer", None, None),
    ],
)
def test_model_request_facts(
    body: dict, path: str, malformed: str | None, output_tokens: int | None, images: int | None
) -> None:
    facts = model_request_facts("pip", "c1", ModelRequestParams(path=path, body=body, purpose="reply"), 123)  # type: ignore[arg-type]
    assert facts.body_bytes == 123 and facts.purpose == "reply" and facts.path == path
    if malformed:
        assert facts.malformed and malformed in facts.malformed
    else:
        assert facts.malformed is None
        assert (facts.output_tokens, facts.images) == (output_tokens, images)


# --- the model body allow-list (issue 11 #4) ------------------------------------------------------

CHAT = "/chat/completions"
RESP = "/responses"
PNG = "data:image/png;base64,iVBORw0KGgo="
SAY = {"role": "user", "content": "hi"}
FN_CHAT = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
FN_RESP = {"type": "function", "name": "search", "parameters": {"type": "object"}}


def _chat(**extra: object) -> dict:
    return {"model": "m", "messages": [SAY], **extra}


def _parts(*parts: dict) -> dict:
    return _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}])


def _resp(*items: object, **extra: object) -> dict:
    return {"model": "m", "input": list(items) or "hi", **extra}


@pytest.mark.parametrize(
    ("path", "body", "problem"),
    [
        # hosted tools make the provider reach hosts of the box's choosing, and cost outside the price table
        pytest.param(RESP, _resp(tools=[{"type": "mcp", "server_label": "x", "server_url": "https://evil.example/mcp",
                                          "headers": {"x": "memories"}}]), "tools[0]: tool type 'mcp'", id="mcp"),
        pytest.param(RESP, _resp(tools=[FN_RESP, {"type": "web_search"}]), "tools[1]: tool type 'web_search'", id="web-search"),
        pytest.param(RESP, _resp(tools=[{"type": "web_search_preview"}]), "'web_search_preview'", id="web-search-preview"),
        pytest.param(RESP, _resp(tools=[{"type": "code_interpreter", "container": {"type": "auto"}}]), "'code_interpreter'", id="code-interpreter"),
        pytest.param(RESP, _resp(tools=[{"type": "image_generation"}]), "'image_generation'", id="image-generation"),
        pytest.param(RESP, _resp(tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}]), "'file_search'", id="file-search"),
        pytest.param(CHAT, _chat(tools=[{"type": "custom", "custom": {"name": "x"}}]), "tool type 'custom'", id="chat-custom-tool"),
        pytest.param(CHAT, _chat(tools={"type": "function"}), "tools must be a list", id="tools-not-a-list"),
        pytest.param(RESP, _resp(tool_choice={"type": "web_search_preview"}), "tool_choice", id="tool-choice-hosted"),
        pytest.param(RESP, _resp(tool_choice=["auto"]), "tool_choice", id="tool-choice-unhashable"),
        pytest.param(RESP, _resp(tools=[{"type": {"mcp": 1}}]), "tool type {'mcp': 1}", id="tool-type-unhashable"),
        pytest.param(RESP, _resp({"type": ["message"], "role": "user"}), "input item type ['message']", id="item-type-unhashable"),
        pytest.param(CHAT, _parts({"type": {"x": 1}}), "content part type {'x': 1}", id="part-type-unhashable"),
        # body keys the gateway cannot judge or price
        pytest.param(CHAT, _chat(web_search_options={}), "body key 'web_search_options' is not allowed on /chat/completions", id="chat-web-search"),
        pytest.param(CHAT, _chat(modalities=["text", "audio"], audio={"voice": "alloy"}), "body key 'audio'", id="chat-audio"),
        pytest.param(CHAT, _chat(prediction={"type": "content", "content": "x"}), "'prediction'", id="chat-prediction"),
        pytest.param(CHAT, _chat(max_output_tokens=5), "'max_output_tokens' is not allowed on /chat/completions", id="another-paths-cap"),
        pytest.param(RESP, _resp(prompt={"id": "pmpt_1"}), "body key 'prompt'", id="stored-prompt"),
        pytest.param(RESP, _resp(background=True), "body key 'background'", id="background"),
        pytest.param(RESP, _resp(max_tokens=5), "'max_tokens' is not allowed on /responses", id="responses-chat-cap"),
        pytest.param("/embeddings", {"model": "e", "input": "x", "tools": []}, "body key 'tools'", id="embeddings-tools"),
        pytest.param("/images/generations", {"model": "i", "prompt": "x", "images": []}, "body key 'images'", id="generations-images"),
        # content parts and image URLs: inline data:image/ only
        pytest.param(CHAT, _parts({"type": "image_url", "image_url": {"url": "http://evil.example/x.png"}}),
                     "messages[0].content[1].image_url.url: a 'http' URL is not allowed", id="chat-image-http"),
        pytest.param(CHAT, _parts({"type": "image_url", "image_url": {"url": "https://u:p@evil.example/x.png"}}), "credentials", id="image-url-credentials"),
        pytest.param(CHAT, _parts({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}), "'file' URL", id="image-file-url"),
        pytest.param(CHAT, _parts({"type": "image_url", "image_url": {"url": PNG, "fetch": "x"}}), "image_url.fetch is not allowed", id="image-extra-key"),
        pytest.param(CHAT, _parts({"type": "file", "file": {"file_id": "file-1"}}), "content part type 'file'", id="chat-file"),
        pytest.param(CHAT, _parts({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}), "'input_audio'", id="chat-audio-part"),
        pytest.param(CHAT, _chat(messages=[{"role": "assistant", "audio": {"id": "audio_1"}}]), "messages[0].audio is not allowed", id="stored-audio"),
        pytest.param(CHAT, _chat(messages=[{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom"}]}]),
                     "tool call type 'custom'", id="custom-tool-call"),
        pytest.param(CHAT, _chat(messages={"role": "user"}), "messages must be a list", id="messages-not-a-list"),
        pytest.param(RESP, _resp({"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}),
                     "input[0].content[0].file_id is not allowed", id="responses-file-id-image"),
        pytest.param(RESP, _resp({"role": "user", "content": [{"type": "input_file", "file_url": "https://evil.example/a.pdf"}]}),
                     "content part type 'input_file'", id="responses-file"),
        pytest.param(RESP, _resp({"type": "item_reference", "id": "msg_1"}), "input item type 'item_reference'", id="item-reference"),
        pytest.param(RESP, _resp({"type": "mcp_approval_response", "approve": True}), "'mcp_approval_response'", id="mcp-item"),
        pytest.param(RESP, _resp({"type": "function_call_output", "call_id": "c",
                                  "output": [{"type": "input_image", "image_url": "gopher://evil.example/"}]}),
                     "input[0].output[0].image_url: a 'gopher' URL", id="tool-output-image"),
        pytest.param(RESP, _resp(instructions=["not", "text"]), "instructions must be a string", id="instructions-not-text"),
        pytest.param(CHAT, _chat(service_tier=2), "service_tier must be a string", id="tier-not-text"),
        pytest.param("/images/edits", {"model": "i", "prompt": "x", "images": [{"file_id": "file-1"}]}, "images[0].file_id", id="edit-file-id"),
        pytest.param("/images/edits", {"model": "i", "prompt": "x", "images": [{"image_url": PNG}], "mask": {"image_url": "https://a.example/m.png"}},
                     None, id="edit-mask-url-is-a-host-for-the-rule"),
    ],
)  # fmt: skip
def test_the_body_allow_list_refuses_what_the_provider_would_do_beyond_the_prompt(
    path: str, body: dict, problem: str | None
) -> None:
    found = inspect_body(path, body)
    if problem is None:
        assert found.problem is None, found
    else:
        assert found.problem is not None and problem in found.problem, found


@pytest.mark.parametrize(
    ("path", "body", "facts"),
    [
        pytest.param(CHAT, _chat(), BodyFacts(), id="plain-text"),
        pytest.param(CHAT, _parts({"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}),
                     BodyFacts(input_images=1, inline_image_bytes=len(PNG)), id="inline-image-counted"),
        pytest.param(CHAT, _parts({"type": "image_url", "image_url": {"url": "https://CDN.Example.org/x.png"}}),
                     BodyFacts(image_hosts=("cdn.example.org",), input_images=1), id="https-image-host-for-the-rule"),
        pytest.param(RESP, _resp(previous_response_id="resp_1"), BodyFacts(stored_context=("previous_response_id",)), id="previous-response"),
        pytest.param(RESP, _resp(conversation="conv_1"), BodyFacts(stored_context=("conversation",)), id="conversation"),
        pytest.param(CHAT, {"model": "m", "messages": [SAY], "previous_response_id": "r"}, BodyFacts(problem="body key 'previous_response_id' is not allowed on /chat/completions"),
                     id="stored-context-is-a-responses-thing"),
        pytest.param("/images/edits", {"model": "i", "prompt": "x", "images": [{"image_url": PNG}, {"image_url": PNG}], "mask": {"image_url": PNG}},
                     BodyFacts(input_images=3, inline_image_bytes=3 * len(PNG)), id="edit-images-and-mask"),
        pytest.param("/embeddings", {"model": "e", "input": [[1, 2, 3]], "dimensions": 8}, BodyFacts(), id="embeddings-token-arrays"),
    ],
)  # fmt: skip
def test_body_facts_count_images_and_note_hosts_and_stored_context(
    path: str, body: dict, facts: BodyFacts
) -> None:
    assert inspect_body(path, body) == facts


def _tool() -> Tool:
    return Tool(
        "search",
        "Search memory.",
        {"type": "object", "properties": {"query": {"type": "string"}}},
        lambda _: "",
    )


@pytest.mark.parametrize("temperature", [None, 0.3])
def test_every_body_the_box_builds_passes_the_allow_list(temperature: float | None) -> None:
    """The responder's own requests (box/common/request_bodies.py, box/images.py) are never refused."""
    settings = ResponderSettings(temperature=temperature, reasoning_effort="low")
    call = ToolCall("call_1", "search", '{"query": "owls"}')
    vision = [{"type": "text", "text": "ann: look"}, {"type": "image_url", "image_url": {"url": PNG}}]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are Pip."},
        {"role": "assistant", "content": "earlier"},
        {"role": "user", "content": vision},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        chat_api.tool_result_message(call, "nothing found"),
    ]  # fmt: skip
    items = responses_api.input_items(messages[1:3]) + [
        responses_api.reduce_item({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E", "status": "completed"}),
        responses_api.reduce_item({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "search", "arguments": "{}", "status": "completed"}),
        responses_api.function_call_output(call, "nothing found"),
    ]  # fmt: skip
    envelope = Envelope.model_validate(full_envelope(picture="an owl", picture_count=2, picture_edit=True))
    bodies = [
        (CHAT, chat_body(settings, "gpt-4.1", messages, [_tool()])),
        (CHAT, chat_body(settings, "gpt-4.1", messages, [])),
        (RESP, responses_body(settings, "gpt-4.1", "You are Pip.", items, [_tool()])),
        (RESP, responses_body(settings, "gpt-4.1", "You are Pip.", items, [])),
        (lambda r: (r.path, r.body))(image_request(settings, envelope, [PNG], "draw")),
        (lambda r: (r.path, r.body))(image_request(settings, envelope, [], "draw")),
        # issue 16: what the profiles send instead: effort, include, max_tokens, a schema without strict
        (CHAT, chat_body(settings, "gpt-5.1", messages, [_tool()])),
        (RESP, responses_body(settings, "gpt-5.1", "You are Pip.", items, [_tool()])),
        (CHAT, chat_body(ResponderSettings(server="ollama"), "llama3.2", messages, [_tool()])),
    ]
    for path, body in bodies:
        found = inspect_body(path, body)
        assert found.problem is None and found.image_hosts == () and found.stored_context == (), (path, found)
    assert (
        inspect_body(CHAT, bodies[0][1]).input_images == 1
        and inspect_body("/images/edits", bodies[4][1]).input_images == 1
    )


def test_send_facts_measure_decoded_files_and_refuse_bad_base64() -> None:
    good = SendFile(filename="a.txt", data_b64=base64.b64encode(b"x" * 30).decode())
    facts = discord_send_facts("pip", "c1", DiscordSendParams(channel_id="c9", content="héllo", files=[good]))
    assert (facts.target_channel, facts.content_chars, facts.files, facts.largest_file_bytes) == (
        "c9",
        5,
        1,
        30,
    )
    bad = SendFile(filename="b.txt", data_b64="not base64!!")
    facts = discord_send_facts("pip", "c1", DiscordSendParams(channel_id="c1", content="x", files=[bad]))
    assert facts.malformed and "b.txt" in facts.malformed


@pytest.mark.parametrize(
    ("url", "host", "malformed"),
    [
        ("https://En.Wikipedia.org/wiki/X", "en.wikipedia.org", None),
        ("http://en.wikipedia.org.:8080/", "en.wikipedia.org", None),
        ("ftp://en.wikipedia.org/", "en.wikipedia.org", "only absolute http"),
        ("file:///etc/passwd", None, "only absolute http"),
        ("/relative", None, "only absolute http"),
        ("https://user:pw@en.wikipedia.org/", "en.wikipedia.org", "credentials"),
        ("http://en.wikipedia.org:99999/", "en.wikipedia.org", "only absolute http"),
    ],
)
def test_fetch_facts(url: str, host: str | None, malformed: str | None) -> None:
    facts = http_fetch_facts("pip", "c1", HttpFetchParams(url=url))
    assert facts.host == host
    assert (malformed is None and facts.malformed is None) or (
        malformed and facts.malformed and malformed in facts.malformed
    )


# --- the trust ladder --------------------------------------------------------------------------

LADDER = TrustSettings(own_channel="auto", untrusted="gate", other_channel="gate", earned_after=3)
EARNING = TrustSettings(own_channel="earned", untrusted="earned", other_channel="earned", earned_after=3)


@pytest.mark.parametrize(
    ("target_is_own", "own_trusted", "rule_trust", "settings", "clean", "mode", "ladder"),
    [
        pytest.param(True, True, None, LADDER, 0, "auto", "auto", id="own-trusted-auto"),
        pytest.param(True, False, None, LADDER, 0, "gate", "gate", id="own-untrusted-gate"),
        pytest.param(False, True, None, LADDER, 0, "gate", "gate", id="other-from-trusted-session-gate"),
        pytest.param(False, False, None, LADDER, 99, "gate", "gate", id="other-gate-however-many-approvals"),
        pytest.param(False, False, "auto", LADDER, 0, "auto", "auto", id="rule-says-auto"),
        pytest.param(True, True, "gate", LADDER, 0, "gate", "gate", id="rule-says-gate"),
        pytest.param(True, False, None, EARNING, 2, "gate", "earned", id="earned-not-yet"),
        pytest.param(True, False, None, EARNING, 3, "auto", "earned", id="earned-after-n"),
        pytest.param(False, False, None, EARNING, 3, "auto", "earned", id="earned-for-that-target"),
        pytest.param(False, False, "earned", LADDER, 2, "gate", "earned", id="rule-earned-not-yet"),
    ],
)
def test_trust_ladder(target_is_own, own_trusted, rule_trust, settings, clean, mode, ladder) -> None:  # type: ignore[no-untyped-def]
    decision = decide_trust(
        target_is_own=target_is_own,
        own_trusted=own_trusted,
        rule_trust=rule_trust,
        settings=settings,
        clean_approvals=clean,
    )
    assert (decision.mode, decision.ladder) == (mode, ladder), decision.why


@pytest.mark.parametrize(
    ("info", "trusted"),
    [
        (None, False),
        (ChannelInfo("c", kind="guild"), False),
        (ChannelInfo("c", kind="guild", trusted=True), True),
        (ChannelInfo("c", kind="dm"), True),
        (ChannelInfo("c", kind="terminal"), True),
    ],
)
def test_channel_trust(info: ChannelInfo | None, trusted: bool) -> None:
    assert channel_is_trusted(info) is trusted


# --- the approver policy -----------------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def gate(origin_guild: str | None) -> Gate:
    return Gate(
        id="g-1", imp="pip", run_id="r", session_channel="c1", origin_guild=origin_guild, act="discord.send",
        target="c1", payload={}, payload_sha256="", reason="", state="pending", created_at=NOW, deadline=NOW,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("approver", "origin_guild", "allowed"),
    [
        pytest.param(Approver("operator", "root"), None, True, id="operator-always"),
        pytest.param(Approver("user", "owner-1"), None, True, id="owner-in-dm"),
        pytest.param(Approver("user", "owner-1"), "guild-1", True, id="owner-in-guild"),
        pytest.param(Approver("user", "stranger"), None, False, id="anyone-in-a-dm-is-not-enough"),
        pytest.param(Approver("user", "stranger"), "guild-1", False, id="member-not-admin"),
        pytest.param(Approver("user", "admin", True, "guild-1"), "guild-1", True, id="admin-of-origin-guild"),
        pytest.param(
            Approver("user", "admin", True, "guild-2"), "guild-1", False, id="admin-of-another-guild"
        ),
        pytest.param(Approver("user", "admin", True, "guild-1"), None, False, id="guild-admin-on-a-dm-gate"),
    ],
)
def test_approver_policy(approver: Approver, origin_guild: str | None, allowed: bool) -> None:
    ok, why = may_decide(approver, gate(origin_guild), owners={"owner-1"})
    assert ok is allowed, why


# --- egress ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "allow_loopback", "refused"),
    [
        ("93.184.216.34", False, None),
        ("2606:2800:220:1:248:1893:25c8:1946", False, None),
        ("127.0.0.1", False, "loopback"),
        ("127.0.0.1", True, None),
        ("::1", False, "loopback"),
        ("::ffff:127.0.0.1", False, "loopback"),
        ("10.1.2.3", False, "private"),
        ("192.168.0.1", True, "private"),
        ("172.16.0.1", False, "private"),
        ("169.254.169.254", False, "link-local"),  # the cloud metadata address
        ("fe80::1", False, "link-local"),
        ("fc00::1", False, "private"),
        ("100.64.0.1", False, "not a public"),
        ("0.0.0.0", False, "private"),
        ("224.0.0.1", False, "not a public"),
        ("::ffff:10.0.0.1", False, "private"),
    ],
)
def test_egress_addresses(address: str, allow_loopback: bool, refused: str | None) -> None:
    reason = address_refusal(ipaddress.ip_address(address), allow_loopback=allow_loopback)
    assert (reason is None) if refused is None else (reason is not None and refused in reason), reason


@pytest.mark.parametrize(
    ("content_type", "raw", "text"),
    [
        (
            "text/html; charset=utf-8",
            b"<html><head><title>T</title><script>evil()</script></head><body><p>Hi &amp; bye</p><style>p{}</style><div>two</div></body></html>",
            "Hi & bye\ntwo",
        ),
        ("text/plain; charset=latin-1", "café".encode("latin-1"), "café"),
        ("application/json", b'{"a": 1}', '{"a": 1}'),
        ("image/png", b"\x89PNG\r\n", ""),
        ("text/html", b"<p>unclosed <b>tags <i>everywhere", "unclosed tags everywhere"),
        ("text/plain; charset=bogus", b"ok", "ok"),
    ],
)
def test_text_extraction(content_type: str, raw: bytes, text: str) -> None:
    assert extract_text(content_type, raw) == text


def test_html_extraction_drops_markup_that_could_smuggle_instructions() -> None:
    html = "<body><p>visible</p><!-- hidden comment --><template>t</template><svg><text>s</text></svg><noscript>n</noscript></body>"
    assert html_to_text(html) == "visible"
