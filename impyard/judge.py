"""The policy judge (design.md §5): a pure function of (request facts, policy) to a verdict.

Facts are read from the box's (already schema-validated) params by the
``*_facts`` builders, also pure. The first rule whose selectors match decides:
a deny rule denies; an allow rule allows unless one of its limits is exceeded,
in which case it denies with its own name, so the box learns which rule and why.
No match is a denial by ``default-deny``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from box.protocol.models import DiscordSendParams, HttpFetchParams, ModelRequestParams
from impyard.policy import Policy
from impyard.policy_models import Rule
from impyard.prices import IMAGE_PATHS, OUTPUT_CAP_KEYS

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
    # discord.send
    target_channel: str | None = None
    imp_staff_channels: tuple[str, ...] = ()  # the imp's own staff channel(s) from its config, besides [channels].staff
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
    return Verdict(False, DEFAULT_DENY, _unmatched_reason(facts))


# ------------------------------------------------------------------ selectors


def channel_selected(entry: str, facts: RequestFacts, policy: Policy) -> bool:
    if entry == OWN_CHANNEL:
        return facts.target_channel == facts.session_channel
    if entry == STAFF_CHANNELS:
        return facts.target_channel in policy.channels.staff or facts.target_channel in facts.imp_staff_channels
    return facts.target_channel == entry


def host_selected(pattern: str, host: str | None) -> bool:
    if not host:
        return False
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])  # subdomains only, not the bare domain
    return host == pattern


def _selects(rule: Rule, facts: RequestFacts, policy: Policy) -> bool:
    if rule.scope not in ("*", facts.imp) or rule.method not in ("*", facts.method):
        return False
    if rule.paths is not None and facts.path not in rule.paths:
        return False
    if rule.purposes is not None and facts.purpose not in rule.purposes and "*" not in rule.purposes:
        return False
    if rule.channels is not None and not any(channel_selected(entry, facts, policy) for entry in rule.channels):
        return False
    if rule.hosts is not None and not any(host_selected(pattern, facts.host) for pattern in rule.hosts):
        return False
    return True


# ------------------------------------------------------------------ limits


def _limit_problem(rule: Rule, facts: RequestFacts) -> str | None:
    if facts.method == "model.request":
        purposes = rule.purposes or {}
        allowed = purposes.get(facts.purpose or "") or purposes.get("*") or []
        if facts.model is None:
            return "the request body names no model"
        if "*" not in allowed and facts.model not in allowed:
            return f"model {facts.model!r} is not allowed for purpose {facts.purpose!r} (allowed: {', '.join(allowed)})"
        if rule.max_body_bytes is not None and facts.body_bytes > rule.max_body_bytes:
            return f"the body is {facts.body_bytes} bytes, over the limit of {rule.max_body_bytes} bytes"
        if rule.max_tokens is not None and facts.output_tokens is not None and facts.output_tokens > rule.max_tokens:
            return f"the output cap {facts.output_tokens} tokens is over the limit of {rule.max_tokens} tokens"
        if rule.max_images is not None and facts.images is not None and facts.images > rule.max_images:
            return f"{facts.images} images asked for, over the limit of {rule.max_images}"
    if facts.method == "discord.send":
        if rule.max_content_chars is not None and facts.content_chars > rule.max_content_chars:
            return f"the content is {facts.content_chars} characters, over the limit of {rule.max_content_chars}"
        if rule.max_files is not None and facts.files > rule.max_files:
            return f"{facts.files} files attached, over the limit of {rule.max_files}"
        if rule.max_file_bytes is not None and facts.largest_file_bytes > rule.max_file_bytes:
            return f"a file of {facts.largest_file_bytes} bytes is over the limit of {rule.max_file_bytes} bytes"
    return None


def _unmatched_reason(facts: RequestFacts) -> str:
    if facts.method == "model.request":
        return f"no rule allows model.request to {facts.path} for purpose {facts.purpose!r}"
    if facts.method == "discord.send":
        return (
            f"no rule allows discord.send to channel {facts.target_channel} "
            "(it is neither this session's channel nor a staff channel)"
        )
    if facts.method == "http.fetch":
        return f"no rule allows http.fetch to host {facts.host!r} (it is not on the allow-list)"
    return f"no rule allows {facts.method}"


# ------------------------------------------------------------------ facts from params


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def model_request_facts(imp: str, session_channel: str, params: ModelRequestParams, body_bytes: int) -> RequestFacts:
    body = params.body
    malformed = None
    model = body.get("model")
    caps = [body[key] for key in OUTPUT_CAP_KEYS if key in body]
    images = None
    if model is not None and not isinstance(model, str):
        malformed = "model must be a string"
    elif any(not _positive_int(cap) for cap in caps):
        malformed = f"{'/'.join(key for key in OUTPUT_CAP_KEYS if key in body)} must be a positive integer"
    elif body.get("stream") not in (None, False):
        malformed = "streaming is not supported through the gateway; leave stream unset"
    elif "n" in body and not _positive_int(body["n"]):
        malformed = "n must be a positive integer"
    if params.path in IMAGE_PATHS:
        images = body.get("n", 1) if _positive_int(body.get("n", 1)) else None
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
        malformed=malformed,
    )


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
