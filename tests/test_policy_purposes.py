"""A rule's ``purposes`` select by purpose *and* model (issue 16).

Before, a rule listing ``purposes = { reply = ["llama3.2"] }`` matched every reply and then denied every other
model ("allowed: llama3.2"), so an operator who added one model broke the imps that use another. Now a
purpose -> models list is a selector: the rule matches only the models it lists for the request's purpose
(``"*"``: any), and any other request is tried against the next rule. The operator's overlay adds a model
next to the shipped ones; a price of zero is taken only when it is written out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from impyard.cli import cli
from impyard.gateway.judge import DEFAULT_DENY, RequestFacts, judge
from impyard.gateway.policy import default_policy_path, load_policy, policy_from_text
from impyard.gateway.prices import estimate_micros

POLICY = policy_from_text(
    """
[[rules]]
name = "no-4o-replies"
method = "model.request"
action = "deny"
reason = "gpt-4o is not for replies here"
purposes = { reply = ["gpt-4o"] }

[[rules]]
name = "ops-llama"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
max_tokens = 100
purposes = { reply = ["llama3.2"] }

[[rules]]
name = "split"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
purposes = { reply = ["model-a"], "*" = ["model-b"] }

[[rules]]
name = "shipped"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
purposes = { reply = ["gpt-5.1", "gpt-4o"], summary = ["gpt-5.1"] }

[[rules]]
name = "any-embedding"
method = "model.request"
action = "allow"
paths = ["/embeddings"]
purposes = { embedding = ["*"] }
""",
    "purposes-test.toml",
)


def request(
    model: str | None, purpose: str = "reply", path: str = "/chat/completions", tokens: int = 50
) -> RequestFacts:
    return RequestFacts(
        imp="pip", method="model.request", session_channel="c1", path=path, purpose=purpose, model=model,
        body_bytes=100, output_tokens=tokens,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("facts", "allowed", "rule", "reason"),
    [
        pytest.param(request("llama3.2"), True, "ops-llama", "allowed", id="the-operators-model"),
        pytest.param(request("gpt-5.1"), True, "shipped", "allowed", id="another-model-falls-through"),
        pytest.param(request("gpt-5.1", "summary"), True, "shipped", "allowed", id="another-purpose"),
        pytest.param(request("llama3.2", "summary"), False, DEFAULT_DENY,
                     "no rule allows model 'llama3.2' for purpose 'summary' on /chat/completions "
                     "(the rules list: model-b, gpt-5.1)", id="listed-for-another-purpose-only"),
        pytest.param(request("gpt-4.1"), False, DEFAULT_DENY,
                     "no rule allows model 'gpt-4.1' for purpose 'reply' on /chat/completions "
                     "(the rules list: llama3.2, model-a, gpt-5.1, gpt-4o)", id="no-rule-lists-it"),
        pytest.param(request("llama3.2", tokens=200), False, "ops-llama",
                     "the output cap 200 tokens is over the limit of 100 tokens", id="the-selecting-rules-limits"),
        pytest.param(request("gpt-4o"), False, "no-4o-replies", "gpt-4o is not for replies here",
                     id="a-deny-rule-selects-its-models"),
        pytest.param(request("gpt-4o", "summary"), False, DEFAULT_DENY, "no rule allows model 'gpt-4o' for purpose "
                     "'summary' on /chat/completions (the rules list: model-b, gpt-5.1)", id="deny-not-for-others"),
        pytest.param(request("model-b"), False, DEFAULT_DENY, "no rule allows model 'model-b' for purpose 'reply'",
                     id="a-purpose-list-wins-over-star"),
        pytest.param(request("model-b", "summary"), True, "split", "allowed", id="the-star-purpose"),
        pytest.param(request("text-embedding-3-small", "embedding", "/embeddings"), True, "any-embedding",
                     "allowed", id="the-star-model"),
        pytest.param(request(None, "embedding", "/embeddings"), False, "any-embedding",
                     "the request body names no model", id="star-model-and-no-model-named"),
        pytest.param(request(None), False, DEFAULT_DENY, "(the request body names no model)", id="no-model-named"),
    ],
)  # fmt: skip
def test_a_purposes_list_is_a_selector(facts: RequestFacts, allowed: bool, rule: str, reason: str) -> None:
    verdict = judge(facts, POLICY)
    assert (verdict.allowed, verdict.rule) == (allowed, rule), verdict
    assert reason in verdict.reason


# ------------------------------------------------------------------ the operator's overlay, on the shipped policy

MEMORY_PURPOSES = (
    "arrival", "appraisal", "filter", "summary", "introspection", "selection", "learning", "classification", "sleep"
)  # fmt: skip
OVERLAY_RULE = f"""
[[rules]]
name = "local-llama"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
max_tokens = 4096

[rules.purposes]
reply = ["llama3.2"]
{chr(10).join(f'{purpose} = ["llama3.2"]' for purpose in MEMORY_PURPOSES)}
"""
ZERO_PRICE = """
[prices."llama3.2"]   # your own server: written out, never assumed
input = 0
output = 0
"""


def write_overlay(home: Path, text: str) -> Path:
    directory = home / "policies"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "local.toml").write_text(text, encoding="utf-8")
    return directory


@pytest.mark.parametrize("purpose", ["reply", *MEMORY_PURPOSES])
def test_an_overlay_adds_a_model_next_to_the_shipped_ones(impyard_home: Path, purpose: str) -> None:
    policy = load_policy(
        write_overlay(impyard_home, OVERLAY_RULE + ZERO_PRICE), default_path=default_policy_path()
    )
    assert [rule.name for rule in policy.rules][:2] == [
        "local-llama",
        "model-text",
    ]  # the overlay is tried first
    local = judge(request("llama3.2", purpose, tokens=1024), policy)
    shipped = judge(request("gpt-5.1", purpose, tokens=1024), policy)
    assert (local.allowed, local.rule) == (True, "local-llama")
    assert (shipped.allowed, shipped.rule) == (True, "model-text")  # not "denied by local-llama"
    price = policy.price("llama3.2")
    assert price is not None
    body = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1024}
    assert estimate_micros("/chat/completions", body, 1000, price, default_output_tokens=4096) == 0


def run(*args: str) -> Result:
    return CliRunner(env={"COLUMNS": "200", "OPENAI_API_KEY": "sk-impyard-purposes-test"}).invoke(
        cli, list(args)
    )


def sample(model: str, purpose: str = "reply") -> dict[str, object]:
    result = run("policy", "check", "--imp", "pip", "--method", "model.request", "--purpose", purpose,
                 "--model", model, "--max-tokens", "500", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    report: dict[str, object] = json.loads(result.stdout)["sample"]
    return report


def test_the_gateway_allows_both_and_prices_the_local_model_at_the_zero_written_out(
    impyard_home: Path,
) -> None:
    write_overlay(impyard_home, OVERLAY_RULE + ZERO_PRICE)
    local, shipped = sample("llama3.2"), sample("gpt-5.1")
    assert (local["allowed"], local["rule"], local["estimate_micros"]) == (True, "local-llama", 0)
    assert (shipped["allowed"], shipped["rule"]) == (True, "model-text")
    assert isinstance(shipped["estimate_micros"], int) and shipped["estimate_micros"] > 0


def test_a_model_without_a_price_is_refused_never_free(impyard_home: Path) -> None:
    write_overlay(impyard_home, OVERLAY_RULE)
    refused = sample("llama3.2")
    assert (refused["allowed"], refused["rule"]) == (False, "prices")
    assert 'add [prices."llama3.2"]' in str(refused["reason"])
    warnings = json.loads(run("policy", "check", "--json").stdout)["warnings"]
    assert any("allows model 'llama3.2' for 'reply' but [prices] has no entry" in w for w in warnings)


# ------------------------------------------------------------------ `impyard imp add --model` and `imp set` warn


def warnings_of(result: Result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [line for line in result.stderr.splitlines() if line.startswith("warning: ")]


def test_imp_add_warns_when_the_policy_would_deny_the_model(impyard_home: Path) -> None:
    [denied, note] = warnings_of(run("imp", "add", "pip", "--model", "llama3.2"))
    assert denied.startswith(
        # on OpenAI the per-turn judgements go to gpt-4.1-mini (issue 33); every other memory call is llama3.2's
        "warning: the policy would deny model 'llama3.2' for reply, arrival, introspection, learning, sleep: no rule "
        "allows "
        "model 'llama3.2' for purpose 'reply' on /chat/completions (the rules list: gpt-5.1,"
    )
    assert denied.endswith(f"allow it in a policy file in {impyard_home / 'policies'} (README: Use another model "
                           "or a local server)")  # fmt: skip
    assert note.startswith("warning: impyard has no profile for model 'llama3.2'")
    assert (impyard_home / "imps" / "pip" / "imp.toml").is_file()  # added all the same


def test_imp_add_warns_about_every_memory_call_the_readme_rule_lists(impyard_home: Path) -> None:
    """Issue 38: the warning named 4 uses (reply, appraisal, filter, summary) while the memory makes 10 kinds of
    call; a rule written from the warning alone left arrival, introspection, … denied at the first turn."""
    four = OVERLAY_RULE.split("[rules.purposes]")[0] + (
        '[rules.purposes]\nreply = ["llama3.2"]\nappraisal = ["llama3.2"]\nfilter = ["llama3.2"]\n'
        'summary = ["llama3.2"]\n'
    )
    write_overlay(impyard_home, four + ZERO_PRICE)
    warnings_of(run("imp", "add", "pip", "--model", "llama3.2"))
    [denied] = warnings_of(run("imp", "set", "pip", "model.server=ollama"))  # a local server: all on llama3.2
    assert denied.startswith(
        "warning: the policy would deny model 'llama3.2' for arrival, introspection, selection, learning, "
        "classification, sleep: "
    )
    write_overlay(impyard_home, OVERLAY_RULE + ZERO_PRICE)  # the README's rule: all of them
    assert warnings_of(run("imp", "set", "pip", "model.server=ollama")) == []


def test_imp_add_warns_when_the_policy_cannot_price_the_model(impyard_home: Path) -> None:
    write_overlay(impyard_home, OVERLAY_RULE)
    [unpriced, _note] = warnings_of(run("imp", "add", "pip", "--model", "llama3.2"))
    assert unpriced.startswith(
        "warning: the policy cannot price model 'llama3.2', so its calls would be refused: "
    )


def test_imp_set_is_quiet_once_the_policy_allows_and_prices_it(impyard_home: Path) -> None:
    write_overlay(impyard_home, OVERLAY_RULE + ZERO_PRICE)
    warnings_of(run("imp", "add", "pip"))
    assert warnings_of(run("imp", "set", "pip", "model.model=llama3.2", "model.server=ollama")) == []
    [denied] = warnings_of(run("imp", "set", "pip", "model.model=gpt-5-mini", "model.server=openai"))
    assert denied.startswith(
        "warning: the policy would deny model 'gpt-5-mini' for reply, arrival, appraisal"
    )


def test_a_fresh_imp_on_the_shipped_policy_gets_no_warning() -> None:
    assert warnings_of(run("imp", "add", "pip")) == []
