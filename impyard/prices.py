"""What a model call costs: the reservation estimate before it, the measured cost after it (design.md §5).

Money is counted in integer micro-USD. Prices are USD per million tokens, so a
token count times a price is already micro-USD. A model without a price is
refused by the gateway, never assumed free (``PriceMissing``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from impyard.policy_models import Price

MICROS_PER_USD = 1_000_000
BYTES_PER_TOKEN_ESTIMATE = 3  # JSON bytes per input token, on the generous side (English runs ~4 chars/token)
IMAGE_PATHS = frozenset({"/images/generations", "/images/edits"})
TEXT_PATHS = frozenset({"/chat/completions", "/responses"})
OUTPUT_CAP_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


class PriceMissing(Exception):
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
        (usage.input_tokens - cached) * input_price + cached * cached_price + usage.output_tokens * (price.output or 0.0)
    )


def output_cap(body: dict[str, Any]) -> int | None:
    """The largest output-token cap the body sets (already validated as positive ints by the judge)."""
    caps = [value for key in OUTPUT_CAP_KEYS if isinstance(value := body.get(key), int) and not isinstance(value, bool)]
    return max(caps) if caps else None


def image_count(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def estimate_micros(path: str, body: dict[str, Any], body_bytes: int, price: Price, *, default_output_tokens: int) -> int:
    """An upper-side estimate of the call's cost, reserved before the call (the hard stop uses it)."""
    model = body.get("model")
    input_tokens = math.ceil(body_bytes / BYTES_PER_TOKEN_ESTIMATE)
    if path in IMAGE_PATHS:
        if price.image is None:
            raise PriceMissing(f'model {model!r} has no per-image price: add image = USD to [prices."{model}"]')
        return _ceil(image_count(body) * price.image * MICROS_PER_USD) + token_cost_micros(
            price, Usage(input_tokens=input_tokens)
        )
    if price.input is None:
        raise PriceMissing(f'model {model!r} has no input price: add input = USD per 1M tokens to [prices."{model}"]')
    if path == "/embeddings":
        return token_cost_micros(price, Usage(input_tokens=input_tokens))
    if price.output is None:
        raise PriceMissing(f'model {model!r} has no output price: add output = USD per 1M tokens to [prices."{model}"]')
    choices = body.get("n", 1) if path == "/chat/completions" else 1
    choices = choices if isinstance(choices, int) and not isinstance(choices, bool) and choices > 0 else 1
    output_tokens = (output_cap(body) or default_output_tokens) * choices
    return token_cost_micros(price, Usage(input_tokens=input_tokens, output_tokens=output_tokens))


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


def measured_micros(path: str, response: Any, price: Price) -> int | None:
    """The cost from the upstream's own usage report; None when it reported none (charge the estimate)."""
    usage = usage_from_response(path, response)
    if usage is None:
        return None
    has_tokens = usage.input_tokens or usage.output_tokens
    if path in IMAGE_PATHS and not has_tokens:
        if price.image is None:
            return None
        return _ceil(usage.images * price.image * MICROS_PER_USD)
    return token_cost_micros(price, usage)
