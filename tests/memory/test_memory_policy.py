"""The default policy and the memory engine's calls (issue 23, "Cost and speed").

Every memory purpose is allowed with the models an imp may be configured with, ``/embeddings`` included,
so a fresh imp with memory on works out of the box; ``impyard policy check`` names the rule that decides
each purpose; and the calls stay metered: a spent budget stops them like any other call.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from click.testing import CliRunner, Result

from box.protocol.models import MemoryPurpose, MemorySettings, ResponderSettings
from impyard.cli import cli
from impyard.imps.store import ImpStore

KEY = {"OPENAI_API_KEY": "sk-impyard-memory-policy-test"}  # the dry run checks a key is configured

# Which rule decides each memory purpose, and on which path: written out, so a change to policies/default.toml
# that moves or drops a purpose fails here.
DECIDING_RULE: dict[str, tuple[str, str]] = {
    "reply": ("/chat/completions", "model-text"),
    "arrival": ("/chat/completions", "model-text"),
    "appraisal": ("/chat/completions", "model-text"),
    "filter": ("/chat/completions", "model-text"),
    "summary": ("/chat/completions", "model-text"),
    "introspection": ("/chat/completions", "model-text"),
    "selection": ("/chat/completions", "model-text"),
    "learning": ("/chat/completions", "model-text"),
    "classification": ("/chat/completions", "model-text"),
    "sleep": ("/chat/completions", "model-text"),
    "embedding": ("/embeddings", "model-embeddings"),
}
# The chat models an imp may be configured with ([model] model, or [memory] models): the ones the default
# policy prices and lets reply.
CHAT_MODELS = ("gpt-5.1", "gpt-4.1-mini", "gpt-4.1", "gpt-4.1-nano", "gpt-4o-mini", "gpt-4o")
EMBEDDING_MODELS = ("text-embedding-3-small", "text-embedding-3-large")


def check(
    purpose: str, model: str, *, path: str | None = None, imp: str = "pip", extra: tuple[str, ...] = ()
) -> Any:
    args = ["policy", "check", *extra, "--imp", imp, "--method", "model.request", "--path",
            path or DECIDING_RULE[purpose][0], "--purpose", purpose, "--model", model, "--json"]  # fmt: skip
    result: Result = CliRunner().invoke(cli, args, env=KEY)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["sample"]


def test_the_table_covers_every_memory_purpose() -> None:
    assert set(DECIDING_RULE) == set(typing.get_args(MemoryPurpose))


@pytest.mark.parametrize("purpose", list(DECIDING_RULE))
def test_policy_check_names_the_rule_that_allows_each_memory_purpose(purpose: str) -> None:
    model = MemorySettings().embedding_model if purpose == "embedding" else ResponderSettings().model
    sample = check(purpose, model)  # a fresh imp's own models
    assert (sample["allowed"], sample["verdict"], sample["rule"]) == (
        True,
        "allowed",
        DECIDING_RULE[purpose][1],
    )
    assert sample["estimate_micros"] > 0  # metered: the call reserves its worst case from the budget


@pytest.mark.parametrize("purpose", [p for p in DECIDING_RULE if p != "embedding"])
def test_every_memory_purpose_may_use_any_model_an_imp_may_reply_with(purpose: str) -> None:
    for model in CHAT_MODELS:
        assert check("reply", model)["allowed"], model  # the models an imp may be configured with...
        sample = check(purpose, model)
        assert (sample["allowed"], sample["rule"]) == (True, "model-text"), (model, sample)


def test_both_embedding_models_are_allowed_on_embeddings_only() -> None:
    for model in EMBEDDING_MODELS:
        assert check("embedding", model)["allowed"], model
    wrong_path = check("embedding", "text-embedding-3-small", path="/chat/completions")
    assert not wrong_path["allowed"] and wrong_path["rule"] == "default-deny"


def test_an_imp_s_configured_models_are_allowed_for_each_purpose() -> None:
    config = ImpStore().add(
        "pip",
        model={"model": "gpt-4.1"},
        memory={"enabled": True, "models": {"appraisal": "gpt-4.1-nano", "filter": "gpt-4o-mini"},
                "embedding_model": "text-embedding-3-large", "dimensions": 64},
    )  # fmt: skip
    routed = config.imp_spec().memory
    routes: dict[str, str] = {str(purpose): model for purpose, model in routed.models.items()}
    for purpose in DECIDING_RULE:
        model = (
            routed.embedding_model if purpose == "embedding" else routes.get(purpose) or config.model.model
        )
        sample = check(purpose, model)
        assert sample["allowed"] and sample["rule"] == DECIDING_RULE[purpose][1], (purpose, model, sample)


def test_memory_is_no_blanket_allow() -> None:
    unknown_purpose = check("gossip", "gpt-4.1-mini", path="/chat/completions")
    assert not unknown_purpose["allowed"] and unknown_purpose["rule"] == "default-deny"
    for purpose in (p for p in DECIDING_RULE if p != "embedding"):  # listed models, never "*"
        unlisted = check(purpose, "gpt-5")  # issue 16: model-text does not select it, no rule after does
        assert (unlisted["allowed"], unlisted["rule"]) == (False, "default-deny"), (purpose, unlisted)
        assert f"no rule allows model 'gpt-5' for purpose '{purpose}'" in unlisted["reason"]
    unlisted = check("embedding", "text-embedding-ada-002")
    assert (unlisted["allowed"], unlisted["rule"]) == (False, "default-deny")


@pytest.mark.parametrize("purpose", list(DECIDING_RULE))
def test_a_spent_budget_stops_memory_calls_too(purpose: str) -> None:
    ImpStore().add("pip", "You are Pip.")  # budget set refuses an imp that does not exist
    spent = CliRunner().invoke(cli, ["budget", "set", "pip", "--daily", "0"])
    assert spent.exit_code == 0, spent.output
    model = MemorySettings().embedding_model if purpose == "embedding" else ResponderSettings().model
    sample = check(purpose, model)
    assert (sample["allowed"], sample["verdict"], sample["rule"]) == (False, "budget_exhausted", "budget")
    other = check(purpose, model, imp="zed")  # another imp's budget is untouched
    assert other["allowed"]
