"""Which model each memory call goes to (mechanism 55; issue 33): the routing both the box and the host read.

``[memory] models`` in imp.toml names a model per purpose; a purpose it does not name goes, on OpenAI, to the
purpose's shipped default (``ECONOMY_MODELS``), else to the imp's ``[model] model``. The arrival is a reply
call with its own schema (101): unrouted, it goes where the reply goes.

The shipped defaults (issue 33): the judgements every turn makes beside the reply — which recalled memories fit
(filter), how the moment landed (appraisal), the conversation's summary, the learned rules that fit now
(selection) and whether a new rule is one already held (classification) — read a short, structured context and
answer a few fields; ``gpt-4.1-mini`` does them at a third of gpt-5.1's input price and a sixth of its output
price, and takes a temperature and no reasoning. The reply, the arrival (the imp's own voice), introspection (its
thinking), learning a rule (what it becomes) and the night's plan (what it keeps) stay on the imp's model. The
defaults apply only on OpenAI (``[model] server = "openai"``): another server serves the models it has, so every
purpose there stays on the imp's model; and only when the imp's model is not already a small one (a ``-mini`` or
``-nano``), which is as cheap or cheaper. Pure: plain values in and out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from box.common.model_profiles import OPENAI, base_model
from box.protocol.models import MemoryPurpose

ECONOMY_MODEL: Final = "gpt-4.1-mini"
ECONOMY_MODELS: Final[Mapping[MemoryPurpose, str]] = {
    "filter": ECONOMY_MODEL,
    "appraisal": ECONOMY_MODEL,
    "summary": ECONOMY_MODEL,
    "selection": ECONOMY_MODEL,
    "classification": ECONOMY_MODEL,
}
SMALL_TIERS: Final = ("-mini", "-nano")  # an imp model already this small keeps every purpose on itself


def small(model: str) -> bool:
    """Whether ``model`` is a small tier (gpt-4.1-mini, gpt-5-nano-2025-08-07, o4-mini, …)."""
    name = base_model(model)
    return any(tier in name for tier in SMALL_TIERS)


def memory_model(
    purpose: MemoryPurpose, routed: Mapping[MemoryPurpose, str], default_model: str, server: str = OPENAI
) -> str:
    """The model of a ``purpose`` call: ``routed`` (``[memory] models``) first, the arrival where the reply goes,
    then the shipped default on OpenAI for a model that is not small, else ``default_model``."""
    chosen = routed.get(purpose)
    if chosen is None and purpose == "arrival":
        chosen = routed.get("reply")
    if chosen is not None:
        return chosen
    if server == OPENAI and purpose in ECONOMY_MODELS and not small(default_model):
        return ECONOMY_MODELS[purpose]
    return default_model
