"""What a model call costs: the reservation estimate before it, the measured cost after it (docs/security.md).

Money is counted in integer micro-USD. Prices are USD per million tokens, so a
token count times a price is already micro-USD. A model without a price is
refused by the gateway, never assumed free (``PriceMissing``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from impyard.errors import ImpyardError
from impyard.gateway.policy_models import Price

MICROS_PER_USD = 1_000_000
# The reservation is the call's worst case, so the hard stop holds against a hostile box (issue 11 #3):
# a byte-level BPE token is at least one byte, so the JSON body's bytes bound its text tokens (the JSON
# around each message outweighs the chat template's framing), plus the headers the provider adds.
BYTES_PER_TOKEN_WORST = 1
PROMPT_OVERHEAD_TOKENS = 64
IMAGE_PATHS = frozenset({"/images/generations", "/images/edits"})
TEXT_PATHS = frozenset({"/chat/completions", "/responses"})
# The output caps each path takes (a key of another path would be ignored upstream, not obeyed).
OUTPUT_CAP_KEYS_BY_PATH: dict[str, tuple[str, ...]] = {
    "/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/responses": ("max_output_tokens",),
}
OUTPUT_CAP_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
SENT_CAP_KEY = {
    "/chat/completions": "max_completion_tokens",
    "/responses": "max_output_tokens",
}  # what the box sends too
DEFAULT_TIERS = frozenset({"auto", "default"})  # service_tier values billed at the price table's own prices


class PriceMissing(ImpyardError):
    """The price table cannot price this request; the message says which entry to add."""


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    images: int = 0


def usd_to_micros(usd: float) -> int:
    return round(usd * MICROS_PER_USD)


def micros_to_usd(micros: int) -> float:
    return micros / MICROS_PER_USD


def _ceil(value: float) -> int:
    return max(0, math.ceil(value - 1e-9))


def token_cost_micros(price: Price, usage: Usage) -> int:
    input_price = price.input or 0.0
    cached_price = price.cached_input if price.cached_input is not None else input_price
    cached = min(usage.cached_tokens, usage.input_tokens)
    return _ceil(
        (usage.input_tokens - cached) * input_price
        + cached * cached_price
        + usage.output_tokens * (price.output or 0.0)
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def output_cap(path: str, body: dict[str, Any]) -> int | None:
    """The largest output-token cap the body sets among the keys this path takes."""
    caps = [
        cap for key in OUTPUT_CAP_KEYS_BY_PATH.get(path, ()) if (cap := _count(body.get(key))) is not None
    ]
    return max(caps) if caps else None


def bound_output(path: str, body: dict[str, Any], cap: int) -> dict[str, Any]:
    """The body as forwarded: a text call without an output cap gets ``cap`` (issue 11 #3).

    Without one the upstream may write up to the model's own maximum (32,768 tokens for gpt-4.1), far past
    what was reserved. The key is the one this path takes, as the box's responder sends it.
    """
    if path not in SENT_CAP_KEY or output_cap(path, body) is not None:
        return body
    return {**body, SENT_CAP_KEY[path]: cap}


def image_count(body: dict[str, Any]) -> int:
    return _count(body.get("n", 1)) or 1


def tier_multiplier(price: Price, service_tier: Any, model: Any) -> float:
    """What a service tier multiplies this model's prices by; an unpriced tier is refused, never assumed default."""
    if service_tier is None or (isinstance(service_tier, str) and service_tier in DEFAULT_TIERS):
        return 1.0
    multiplier = price.service_tiers.get(service_tier) if isinstance(service_tier, str) else None
    if multiplier is None:
        raise PriceMissing(
            f"service_tier {service_tier!r} is not priced for model {model!r}: leave service_tier unset, or add "
            f'service_tiers = {{ {service_tier} = MULTIPLIER }} to [prices."{model}"]'
        )
    return multiplier


def estimate_micros(
    path: str,
    body: dict[str, Any],
    body_bytes: int,
    price: Price,
    *,
    default_output_tokens: int,
    input_images: int = 0,
    inline_image_bytes: int = 0,
    stored_context_tokens: int = 0,
) -> int:
    """The most the call can cost, reserved before it: the hard stop holds only if this is a true worst case.

    Every input byte but inline image data is a token; each input image costs the model's worst case
    (``image_input_tokens``); stored context costs what the policy reserves for it; each of ``n`` choices
    writes its full output cap; each generated image costs its full price; a service tier multiplies it all.
    """
    model = body.get("model")
    multiplier = tier_multiplier(price, body.get("service_tier"), model)
    if input_images and price.image_input_tokens is None:
        raise PriceMissing(
            f"model {model!r} has no worst case for input images: add image_input_tokens = N (the most tokens "
            f'one input image can cost) to [prices."{model}"]'
        )
    text_bytes = max(0, body_bytes - inline_image_bytes)
    input_tokens = (
        math.ceil(text_bytes / BYTES_PER_TOKEN_WORST)
        + PROMPT_OVERHEAD_TOKENS
        + input_images * (price.image_input_tokens or 0)
        + stored_context_tokens
    )
    if path in IMAGE_PATHS:
        if price.image is None:
            raise PriceMissing(
                f'model {model!r} has no per-image price: add image = USD to [prices."{model}"]'
            )
        images = image_count(body) * price.image * MICROS_PER_USD
        return _ceil((images + token_cost_micros(price, Usage(input_tokens=input_tokens))) * multiplier)
    if price.input is None:
        raise PriceMissing(
            f'model {model!r} has no input price: add input = USD per 1M tokens to [prices."{model}"]'
        )
    if path == "/embeddings":
        return _ceil(token_cost_micros(price, Usage(input_tokens=input_tokens)) * multiplier)
    if price.output is None:
        raise PriceMissing(
            f'model {model!r} has no output price: add output = USD per 1M tokens to [prices."{model}"]'
        )
    choices = (_count(body.get("n", 1)) or 1) if path == "/chat/completions" else 1
    output_tokens = (output_cap(path, body) or default_output_tokens) * choices
    return _ceil(
        token_cost_micros(price, Usage(input_tokens=input_tokens, output_tokens=output_tokens)) * multiplier
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_from_response(path: str, response: Any) -> Usage | None:
    """Token and image counts from an upstream JSON body; None when it reports no usage."""
    if not isinstance(response, dict):
        return None
    usage = response.get("usage")
    images = len(response["data"]) if path in IMAGE_PATHS and isinstance(response.get("data"), list) else 0
    if not isinstance(usage, dict):
        return Usage(images=images) if images else None
    if path == "/chat/completions" or path == "/embeddings":
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        return Usage(_int(usage.get("prompt_tokens")), cached, _int(usage.get("completion_tokens")), images)
    details = usage.get("input_tokens_details")  # /responses and the image endpoints
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(_int(usage.get("input_tokens")), cached, _int(usage.get("output_tokens")), images)


def measured_micros(path: str, response: Any, price: Price, *, multiplier: float = 1.0) -> int | None:
    """The cost from the upstream's own usage report (times the asked-for tier's multiplier); None when it
    reported none (charge the estimate)."""
    usage = usage_from_response(path, response)
    if usage is None:
        return None
    has_tokens = usage.input_tokens or usage.output_tokens
    if path in IMAGE_PATHS and not has_tokens:
        if price.image is None:
            return None
        return _ceil(usage.images * price.image * MICROS_PER_USD * multiplier)
    return _ceil(token_cost_micros(price, usage) * multiplier)
