"""The policy judge (docs/security.md): a pure function of (request facts, policy) to a verdict.

Facts are read from the box's (already schema-validated) params by the
``*_facts`` builders, also pure. The first rule whose selectors match decides:
a deny rule denies; an allow rule allows unless one of its limits is exceeded,
in which case it denies with its own name, so the box learns which rule and why.
No match is a denial by ``default-deny``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from box.protocol.models import DiscordSendParams, HttpFetchParams, ModelRequestParams
from impyard.gateway.policy import Policy
from impyard.gateway.policy_models import Rule
from impyard.gateway.prices import IMAGE_PATHS, OUTPUT_CAP_KEYS_BY_PATH

DEFAULT_DENY = "default-deny"
MALFORMED = "malformed-request"
OWN_CHANNEL = "own"
STAFF_CHANNELS = "staff"


@dataclass(frozen=True)
class RequestFacts:
    """What the judge needs to know about one request; plain values only."""

    imp: str
    method: str
    session_channel: str = ""
    # model.request
    path: str | None = None
    purpose: str | None = None
    model: str | None = None
    body_bytes: int = 0
    output_tokens: int | None = None  # the largest output cap the body sets
    images: int | None = None  # images asked for (image paths)
    body_problem: str | None = (
        None  # a key, tool, item, part or URL outside the body allow-list (issue 11 #4)
    )
    image_hosts: tuple[str, ...] = ()  # hosts of https image URLs the provider would fetch
    input_images: int = 0  # images the model reads (each reserved at the model's worst case)
    inline_image_bytes: int = 0  # bytes of data:image/ URLs (priced per image, not per byte)
    stored_context: tuple[str, ...] = ()  # keys that pull server-side context of unknown size into the call
    # discord.send
    target_channel: str | None = None
    imp_staff_channels: tuple[
        str, ...
    ] = ()  # the imp's own staff channel(s) from its config, besides [channels].staff
    content_chars: int = 0
    files: int = 0
    largest_file_bytes: int = 0
    # http.fetch
    host: str | None = None
    # something in the request that cannot be judged (a cap that is not a number, bad base64, ...)
    malformed: str | None = None


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    rule: str
    reason: str
    matched: Rule | None = None


def judge(facts: RequestFacts, policy: Policy) -> Verdict:
    if facts.malformed:
        return Verdict(False, MALFORMED, facts.malformed)
    for rule in policy.rules:
        if not _selects(rule, facts, policy):
            continue
        if rule.action == "deny":
            return Verdict(False, rule.name, rule.reason or f"denied by rule {rule.name}", rule)
        problem = _limit_problem(rule, facts)
        if problem:
            return Verdict(False, rule.name, problem, rule)
        return Verdict(True, rule.name, "allowed", rule)
    return Verdict(False, DEFAULT_DENY, _unmatched_reason(facts, policy))


# ------------------------------------------------------------------ selectors


def channel_selected(entry: str, facts: RequestFacts, policy: Policy) -> bool:
    if entry == OWN_CHANNEL:
        return facts.target_channel == facts.session_channel
    if entry == STAFF_CHANNELS:
        return (
            facts.target_channel in policy.channels.staff or facts.target_channel in facts.imp_staff_channels
        )
    return facts.target_channel == entry


def host_selected(pattern: str, host: str | None) -> bool:
    if not host:
        return False
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])  # subdomains only, not the bare domain
    return host == pattern


def purpose_models(purposes: Mapping[str, list[str]], purpose: str | None) -> list[str] | None:
    """The models a rule lists for ``purpose`` (its own list, else the ``"*"`` purpose's); None: none."""
    listed = purposes.get(purpose or "")
    return listed if listed is not None else purposes.get("*")


def models_selected(purposes: Mapping[str, list[str]], purpose: str | None, model: str | None) -> bool:
    """Issue 16: a purpose -> models list is a selector. The rule matches a request only when it lists the
    request's purpose and its model (or ``"*"``, any model, even none named); otherwise the next rule is
    tried, so an operator's rule for one model never denies the models of the rules after it."""
    models = purpose_models(purposes, purpose)
    if models is None:
        return False
    return "*" in models or (model is not None and model in models)


def _selects(rule: Rule, facts: RequestFacts, policy: Policy) -> bool:
    if rule.scope not in ("*", facts.imp) or rule.method not in ("*", facts.method):
        return False
    if rule.paths is not None and facts.path not in rule.paths:
        return False
    if rule.purposes is not None and not models_selected(rule.purposes, facts.purpose, facts.model):
        return False
    if rule.channels is not None and not any(
        channel_selected(entry, facts, policy) for entry in rule.channels
    ):
        return False
    if rule.hosts is not None and not any(host_selected(pattern, facts.host) for pattern in rule.hosts):
        return False
    return True


# ------------------------------------------------------------------ limits


def _limit_problem(rule: Rule, facts: RequestFacts) -> str | None:
    if facts.method == "model.request":
        if facts.model is None:  # only a rule that allows any model ("*") selects a body naming none
            return "the request body names no model"
        if rule.max_body_bytes is not None and facts.body_bytes > rule.max_body_bytes:
            return f"the body is {facts.body_bytes} bytes, over the limit of {rule.max_body_bytes} bytes"
        if (
            rule.max_tokens is not None
            and facts.output_tokens is not None
            and facts.output_tokens > rule.max_tokens
        ):
            return (
                f"the output cap {facts.output_tokens} tokens is over the limit of {rule.max_tokens} tokens"
            )
        if rule.max_images is not None and facts.images is not None and facts.images > rule.max_images:
            return f"{facts.images} images asked for, over the limit of {rule.max_images}"
        if facts.body_problem:  # issue 11 #4: what the provider would do beyond the prompt
            return facts.body_problem
        for host in facts.image_hosts:
            if not any(host_selected(pattern, host) for pattern in rule.image_hosts or ()):
                return (
                    f"an image URL on {host!r} would be fetched by the provider; only inline data:image/ URLs "
                    "are allowed (a rule's image_hosts can name hosts)"
                )
        if facts.stored_context and rule.stored_context_tokens is None:
            return (
                f"{facts.stored_context[0]} pulls stored context of unknown size (and cost) into the call; send "
                "the context in the body (a rule's stored_context_tokens can allow it)"
            )
    if facts.method == "discord.send":
        if rule.max_content_chars is not None and facts.content_chars > rule.max_content_chars:
            return (
                f"the content is {facts.content_chars} characters, over the limit of {rule.max_content_chars}"
            )
        if rule.max_files is not None and facts.files > rule.max_files:
            return f"{facts.files} files attached, over the limit of {rule.max_files}"
        if rule.max_file_bytes is not None and facts.largest_file_bytes > rule.max_file_bytes:
            return (
                f"a file of {facts.largest_file_bytes} bytes is over the limit of {rule.max_file_bytes} bytes"
            )
    return None


def _unmatched_reason(facts: RequestFacts, policy: Policy) -> str:
    if facts.method == "model.request":
        listed = _listed_models(facts, policy)
        if facts.model is not None and listed:
            return (
                f"no rule allows model {facts.model!r} for purpose {facts.purpose!r} on {facts.path} "
                f"(the rules list: {', '.join(listed)})"
            )
        unnamed = " (the request body names no model)" if facts.model is None else ""
        return f"no rule allows model.request to {facts.path} for purpose {facts.purpose!r}{unnamed}"
    if facts.method == "discord.send":
        return (
            f"no rule allows discord.send to channel {facts.target_channel} "
            "(it is neither this session's channel nor a staff channel)"
        )
    if facts.method == "http.fetch":
        return f"no rule allows http.fetch to host {facts.host!r} (it is not on the allow-list)"
    return f"no rule allows {facts.method}"


def _listed_models(facts: RequestFacts, policy: Policy) -> list[str]:
    """The models the allow rules that would select this request but for its model list for its purpose."""
    listed: dict[str, None] = {}
    for rule in policy.rules:
        if rule.action != "allow" or rule.purposes is None:
            continue
        if not _selects(rule.model_copy(update={"purposes": None}), facts, policy):
            continue
        listed.update(dict.fromkeys(purpose_models(rule.purposes, facts.purpose) or []))
    return list(listed)


# ------------------------------------------------------------------ facts from params


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def model_request_facts(
    imp: str, session_channel: str, params: ModelRequestParams, body_bytes: int
) -> RequestFacts:
    body = params.body
    malformed = None
    model = body.get("model")
    cap_keys = [key for key in OUTPUT_CAP_KEYS_BY_PATH.get(params.path, ()) if key in body]
    caps = [body[key] for key in cap_keys]
    images = None
    if model is not None and not isinstance(model, str):
        malformed = "model must be a string"
    elif any(not _positive_int(cap) for cap in caps):
        malformed = f"{'/'.join(cap_keys)} must be a positive integer"
    elif body.get("stream") not in (None, False):
        malformed = "streaming is not supported through the gateway; leave stream unset"
    elif "n" in body and not _positive_int(body["n"]):
        malformed = "n must be a positive integer"
    if params.path in IMAGE_PATHS:
        images = body.get("n", 1) if _positive_int(body.get("n", 1)) else None
    shape = inspect_body(params.path, body)
    return RequestFacts(
        imp=imp,
        method="model.request",
        session_channel=session_channel,
        path=params.path,
        purpose=params.purpose,
        model=model if isinstance(model, str) else None,
        body_bytes=body_bytes,
        output_tokens=max(caps) if caps and not malformed else None,
        images=images,
        body_problem=shape.problem,
        image_hosts=shape.image_hosts,
        input_images=shape.input_images,
        inline_image_bytes=shape.inline_image_bytes,
        stored_context=shape.stored_context,
        malformed=malformed,
    )


# ------------------------------------------------------------------ the body allow-list (issue 11 #4)
#
# The provider does more than complete a prompt: hosted tools (mcp with a server_url and headers,
# web_search, code_interpreter, image_generation, file_search) and image URLs make it fetch attacker URLs
# carrying the imp's context; file ids and stored responses pull in data of unknown size and owner; and
# all of it costs outside the price table. So each path admits only the keys, tool types, input items,
# content parts and image URLs below -- which cover every body the box's responder builds
# (box/common/request_bodies.py, box/images.py) -- and the matched rule refuses the rest, by name.

_TEXT_KEYS = frozenset({
    "model", "stream", "temperature", "top_p", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "service_tier", "store", "metadata", "user", "safety_identifier", "prompt_cache_key",
})  # fmt: skip
_IMAGE_KEYS = frozenset(
    {"model", "prompt", "n", "size", "quality", "output_format", "output_compression", "background", "user"}
)
BODY_KEYS: dict[str, frozenset[str]] = {
    "/chat/completions": _TEXT_KEYS | {
        "messages", "max_tokens", "max_completion_tokens", "n", "stop", "seed", "presence_penalty",
        "frequency_penalty", "logit_bias", "logprobs", "response_format", "reasoning_effort", "verbosity",
    },
    "/responses": _TEXT_KEYS | {"input", "instructions", "max_output_tokens", "text", "reasoning", "include", "truncation"},
    "/embeddings": frozenset({"model", "input", "dimensions", "encoding_format", "user"}),
    "/images/generations": _IMAGE_KEYS | {"moderation", "style", "response_format"},
    "/images/edits": _IMAGE_KEYS | {"images", "mask", "input_fidelity"},
}  # fmt: skip
STORED_CONTEXT_KEYS = (
    "previous_response_id",
    "conversation",
)  # /responses, only where a rule's stored_context_tokens allows
TOOL_TYPES = frozenset({"function"})
TOOL_CHOICES = frozenset({"auto", "none", "required"})
CHAT_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "refusal"})
CHAT_TOOL_CALL_KEYS = frozenset({"id", "type", "function"})
CHAT_PART_KEYS = {"text": frozenset({"type", "text"}), "image_url": frozenset({"type", "image_url"})}
CHAT_IMAGE_KEYS = frozenset({"url", "detail"})
RESPONSES_ITEM_KEYS = {
    "message": frozenset({"type", "id", "role", "content", "status"}),
    "reasoning": frozenset({"type", "id", "summary", "encrypted_content", "status"}),
    "function_call": frozenset({"type", "id", "call_id", "name", "arguments", "status"}),
    "function_call_output": frozenset({"type", "id", "call_id", "output", "status"}),
}
RESPONSES_PART_KEYS = {
    "input_text": frozenset({"type", "text"}),
    "input_image": frozenset({"type", "image_url", "detail"}),  # no file_id: only bytes the gateway has seen
    "output_text": frozenset({"type", "text", "annotations", "logprobs"}),
    "refusal": frozenset({"type", "refusal"}),
}
EDIT_IMAGE_KEYS = frozenset({"image_url"})
INLINE_IMAGE_PREFIX = "data:image/"


@dataclass(frozen=True)
class BodyFacts:
    """What a model.request body asks of the provider beyond generating text; plain values only."""

    problem: str | None = None  # the first thing outside the allow-list, and where it is
    image_hosts: tuple[str, ...] = ()
    input_images: int = 0
    inline_image_bytes: int = 0
    stored_context: tuple[str, ...] = ()


class _Outside(Exception):
    """Something in the body outside the allow-list; the message says where and what."""


def _kind(value: Any, allowed: Collection[str]) -> str | None:
    """``value`` when it is one of the allowed names (a hostile body's dict or list here is simply not)."""
    return value if isinstance(value, str) and value in allowed else None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _object(value: Any, allowed: Collection[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Outside(f"{where} must be an object")
    extra = sorted(key for key in value if key not in allowed)
    if extra:
        raise _Outside(f"{where}.{extra[0]} is not allowed")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Outside(f"{where} must be a list")
    return value


@dataclass
class _Images:
    """The image URLs met on the walk: inline data is counted, any other URL's host is noted for the rule."""

    hosts: list[str] = field(default_factory=list)
    count: int = 0
    inline_bytes: int = 0

    def url(self, url: Any, where: str) -> None:
        if not isinstance(url, str):
            raise _Outside(f"{where} must be an image URL string")
        self.count += 1
        if url[: len(INLINE_IMAGE_PREFIX)].lower() == INLINE_IMAGE_PREFIX:
            self.inline_bytes += len(url)
            return
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").rstrip(".")
            has_credentials = parts.username is not None or parts.password is not None
        except ValueError:
            raise _Outside(f"{where} is not a valid URL") from None
        if parts.scheme.lower() != "https" or not host:
            raise _Outside(
                f"{where}: a {_shown(parts.scheme or 'relative')} URL is not allowed; send the image inline as a "
                "data:image/ URL (or https on a host a rule's image_hosts names)"
            )
        if has_credentials:
            raise _Outside(f"{where}: image URLs with credentials in them are refused")
        self.hosts.append(host)


def _tools(tools: Any) -> None:
    for index, tool in enumerate(_list(tools, "tools")):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if _kind(kind, TOOL_TYPES) is None:
            raise _Outside(f"tools[{index}]: tool type {_shown(kind)} is not allowed (function tools only)")


def _tool_choice(choice: Any) -> None:
    if _kind(choice, TOOL_CHOICES) or (isinstance(choice, dict) and _kind(choice.get("type"), TOOL_TYPES)):
        return
    raise _Outside(f"tool_choice {_shown(choice)} is not allowed (auto, none, required or a function)")


def _chat_messages(messages: Any, images: _Images) -> None:
    for index, message in enumerate(_list(messages, "messages")):
        where = f"messages[{index}]"
        _object(message, CHAT_MESSAGE_KEYS, where)
        for number, call in enumerate(_list(message.get("tool_calls") or [], f"{where}.tool_calls")):
            call = _object(call, CHAT_TOOL_CALL_KEYS, f"{where}.tool_calls[{number}]")
            if _kind(call.get("type", "function"), TOOL_TYPES) is None:
                raise _Outside(
                    f"{where}.tool_calls[{number}]: tool call type {_shown(call.get('type'))} is not allowed"
                )
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        for number, part in enumerate(_list(content, f"{where}.content")):
            spot = f"{where}.content[{number}]"
            kind = _part(part, CHAT_PART_KEYS, spot, "text and image_url only")
            if kind == "image_url":
                images.url(
                    _object(part.get("image_url"), CHAT_IMAGE_KEYS, f"{spot}.image_url").get("url"),
                    f"{spot}.image_url.url",
                )


def _part(part: Any, allowed: Mapping[str, frozenset[str]], spot: str, only: str) -> str:
    """The type of a content part whose type and keys are on the allow-list; else ``_Outside`` naming it."""
    kind = _kind(part.get("type"), allowed) if isinstance(part, dict) else None
    if kind is None:
        named = part.get("type") if isinstance(part, dict) else None
        raise _Outside(f"{spot}: content part type {_shown(named)} is not allowed ({only})")
    _object(part, allowed[kind], spot)
    return kind


def _responses_parts(content: Any, where: str, images: _Images) -> None:
    if content is None or isinstance(content, str):
        return
    for number, part in enumerate(_list(content, where)):
        spot = f"{where}[{number}]"
        kind = _part(part, RESPONSES_PART_KEYS, spot, "input_text and input_image only")
        if kind == "input_image":
            images.url(part.get("image_url"), f"{spot}.image_url")


def _responses_input(items: Any, images: _Images) -> None:
    if isinstance(items, str):
        return
    for index, item in enumerate(_list(items, "input")):
        where = f"input[{index}]"
        named = (
            (item.get("type") or ("message" if "role" in item else None)) if isinstance(item, dict) else None
        )
        kind = _kind(named, RESPONSES_ITEM_KEYS)
        if kind is None:
            raise _Outside(f"{where}: input item type {_shown(named)} is not allowed")
        _object(item, RESPONSES_ITEM_KEYS[kind], where)
        if kind == "message":
            _responses_parts(item.get("content"), f"{where}.content", images)
        elif kind == "function_call_output":
            _responses_parts(item.get("output"), f"{where}.output", images)


def _edit_images(body: dict[str, Any], images: _Images) -> None:
    for index, entry in enumerate(_list(body.get("images", []), "images")):
        images.url(
            _object(entry, EDIT_IMAGE_KEYS, f"images[{index}]").get("image_url"), f"images[{index}].image_url"
        )
    if "mask" in body:
        images.url(_object(body["mask"], EDIT_IMAGE_KEYS, "mask").get("image_url"), "mask.image_url")


def inspect_body(path: str, body: dict[str, Any]) -> BodyFacts:
    """Walk a model.request body against the allow-list of its path (issue 11 #4); pure."""
    stored = tuple(key for key in STORED_CONTEXT_KEYS if key in body) if path == "/responses" else ()
    images = _Images()
    try:
        extra = sorted(key for key in body if key not in BODY_KEYS.get(path, ()) and key not in stored)
        if extra:
            raise _Outside(f"body key {_shown(extra[0])} is not allowed on {path}")
        if "tools" in body:
            _tools(body["tools"])
        if "tool_choice" in body:
            _tool_choice(body["tool_choice"])
        if "service_tier" in body and not isinstance(body["service_tier"], str):
            raise _Outside("service_tier must be a string")
        if path == "/chat/completions" and "messages" in body:
            _chat_messages(body["messages"], images)
        elif path == "/responses":
            if "instructions" in body and not isinstance(body["instructions"], str | None):
                raise _Outside("instructions must be a string")
            if "input" in body:
                _responses_input(body["input"], images)
        elif path == "/images/edits":
            _edit_images(body, images)
    except _Outside as exc:
        return BodyFacts(problem=str(exc), stored_context=stored)
    return BodyFacts(None, tuple(images.hosts), images.count, images.inline_bytes, stored)


def decode_file(data_b64: str) -> bytes:
    """A file's bytes; raises ValueError on anything that is not strict base64."""
    try:
        return base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not valid base64") from exc


def discord_send_facts(
    imp: str, session_channel: str, params: DiscordSendParams, staff_channels: tuple[str, ...] = ()
) -> RequestFacts:
    malformed = None
    sizes: list[int] = []
    for item in params.files:
        try:
            sizes.append(len(decode_file(item.data_b64)))
        except ValueError:
            malformed = f"file {item.filename!r} is not valid base64"
            break
    return RequestFacts(
        imp=imp,
        method="discord.send",
        session_channel=session_channel,
        target_channel=params.channel_id,
        imp_staff_channels=staff_channels,
        content_chars=len(params.content),
        files=len(params.files),
        largest_file_bytes=max(sizes, default=0),
        malformed=malformed,
    )


def http_fetch_facts(imp: str, session_channel: str, params: HttpFetchParams) -> RequestFacts:
    malformed = None
    host = None
    try:
        parts = urlsplit(params.url)
        host = (parts.hostname or "").rstrip(".") or None
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        malformed = "only absolute http:// and https:// URLs can be fetched"
    elif parts.username is not None or parts.password is not None:
        malformed = "URLs with credentials in them are refused"
    return RequestFacts(
        imp=imp, method="http.fetch", session_channel=session_channel, host=host, malformed=malformed
    )
