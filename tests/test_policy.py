"""Loading the governance policy: the shipped default, the operator overlay, and legible errors."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from impyard.cli import cli
from impyard.gateway.policy import PolicyError, default_policy_path, load_policy, policy_from_text
from impyard.gateway.policy_models import PolicyFile

ALLOW_REPLY = """
[[rules]]
name = "reply"
method = "model.request"
action = "allow"
purposes = { reply = ["gpt-4.1-mini"] }
"""


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


# --- the shipped default --------------------------------------------------------------------


def test_the_shipped_default_loads_prices_every_model_it_allows_and_denies_fetches() -> None:
    policy = load_policy()
    assert default_policy_path().name == "default.toml"
    assert [rule.name for rule in policy.rules][:4] == [
        "model-text", "model-embeddings", "embeddings-local", "model-images"
    ]  # fmt: skip
    assert policy.warnings == []  # every allowed model has a price
    assert all(rule.method != "http.fetch" for rule in policy.rules)  # no host is allowed by default
    assert policy.budgets.all.daily_usd and policy.budgets.per_imp.daily_usd
    assert policy.trust_for("discord.send").other_channel == "gate"
    assert policy.gates.deadline_hours == 24


def test_the_default_policy_can_be_pointed_elsewhere_and_its_absence_stops_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = write(tmp_path, "mine.toml", ALLOW_REPLY)
    monkeypatch.setenv("IMPYARD_DEFAULT_POLICY", str(own))
    assert [rule.name for rule in load_policy().rules] == ["reply"]
    monkeypatch.setenv("IMPYARD_DEFAULT_POLICY", str(tmp_path / "gone.toml"))
    with pytest.raises(PolicyError) as caught:
        load_policy()
    assert "gone.toml" in str(caught.value) and "IMPYARD_DEFAULT_POLICY" in str(caught.value)


# --- the operator overlay -------------------------------------------------------------------


def test_operator_rules_come_first_and_a_same_named_rule_replaces_the_default(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    write(
        ops,
        "10-fetch.toml",
        'rules = [{ name = "fetch-wiki", method = "http.fetch", action = "allow", hosts = ["en.wikipedia.org"] }]\n',
    )
    write(
        ops,
        "20-send.toml",
        '[[rules]]\nname = "send-own-channel"\nmethod = "discord.send"\naction = "allow"\nchannels = ["own"]\nmax_content_chars = 100\n',
    )
    policy = load_policy(ops)
    names = [rule.name for rule in policy.rules]
    assert names[:2] == ["fetch-wiki", "send-own-channel"]
    assert names.count("send-own-channel") == 1  # replaced, not duplicated
    assert policy.rules[1].max_content_chars == 100
    assert policy.rule_sources["fetch-wiki"].endswith("10-fetch.toml")
    assert policy.rule_sources["model-text"].endswith("default.toml")


def test_operator_tables_override_the_default_key_by_key(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    write(
        ops,
        "budget.toml",
        '[budgets.per_imp]\ndaily_usd = 0.5\n[prices."gpt-4.1-mini"]\noutput = 9.0\n'
        '[prices."local-llm"]\ninput = 0.0\noutput = 0.0\n[channels]\nstaff = ["42"]\n',
    )
    default = load_policy(tmp_path / "none")
    policy = load_policy(ops)
    assert policy.budgets.per_imp.daily_usd == 0.5
    assert policy.budgets.per_imp.monthly_usd == default.budgets.per_imp.monthly_usd  # untouched key kept
    assert policy.price("gpt-4.1-mini").output == 9.0  # type: ignore[union-attr]
    assert policy.price("gpt-4.1-mini").input == default.price("gpt-4.1-mini").input  # type: ignore[union-attr]
    assert policy.price("local-llm") is not None and policy.channels.staff == ["42"]


def test_the_same_rule_name_in_two_operator_files_is_an_error(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    write(ops, "a.toml", ALLOW_REPLY)
    write(ops, "b.toml", ALLOW_REPLY)
    with pytest.raises(PolicyError) as caught:
        load_policy(ops)
    assert "b.toml" in str(caught.value) and "a.toml" in str(caught.value) and "reply" in str(caught.value)


def test_a_broken_operator_file_refuses_the_whole_policy(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    write(ops, "good.toml", ALLOW_REPLY)
    write(
        ops,
        "bad.toml",
        '[[rules]]\nname = "x"\nmethod = "model.request"\naction = "allow"\npurposes = {reply=["m"]}\nmax_tokns = 5\n',
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(ops)
    assert caught.value.file.endswith("bad.toml") and caught.value.line == 6


def test_a_missing_operator_directory_is_fine_unless_it_was_asked_for(tmp_path: Path) -> None:
    assert load_policy(tmp_path / "absent").rules
    with pytest.raises(PolicyError, match="not a directory"):
        load_policy(tmp_path / "absent", require_dir=True)


# --- legible errors -------------------------------------------------------------------------

TYPO = """\
[[rules]]
name = "ok"
method = "model.request"
action = "allow"
purposes = { reply = ["m"] }

[[rules]]
name = "send"
method = "discord.send"
acton = "allow"
channels = ["own"]
"""

SUBTABLE = """\
[[rules]]
name = "text"
method = "model.request"
action = "allow"

[rules.purposes]
reply = "gpt-4.1"
"""


@pytest.mark.parametrize(
    ("text", "line", "key", "reason"),
    [
        pytest.param(TYPO, 10, "rules['send'].acton", "did you mean 'action'", id="typo-in-rule-key"),
        pytest.param(SUBTABLE, 7, "rules['text'].purposes.reply", "valid list", id="wrong-type-in-subtable"),
        pytest.param(
            '[budgets.all]\ndaily_usd = "ten"\n', 2, "budgets.all.daily_usd", "valid number", id="wrong-type"
        ),
        pytest.param(
            "[budgets.all]\ndaily_usd = -1\n",
            2,
            "budgets.all.daily_usd",
            "greater than or equal to 0",
            id="negative",
        ),
        pytest.param(
            '[prices."gpt-4.1"]\ninptu = 2.0\n',
            2,
            'prices."gpt-4.1".inptu',
            "did you mean 'input'",
            id="price-typo",
        ),
        pytest.param(
            '[prices."gpt-x"]\n', 1, "prices.gpt-x", "at least one of input, output, image", id="empty-price"
        ),
        pytest.param(
            '[trust."discord.send"]\nother_channel = "auto"\n',
            2,
            'trust."discord.send".other_channel',
            "'gate' or 'earned'",
            id="other-channel-auto",
        ),
        pytest.param(
            '[[rules]]\nname = "r"\nmethod = "model.request"\naction = "alow"\npurposes = {a=["m"]}\n',
            4,
            "rules['r'].action",
            "'allow' or 'deny'",
            id="bad-action",
        ),
        pytest.param(
            '[[rules]]\nname = "r"\nmethod = "model.request"\naction = "allow"\n',
            1,
            "rules['r']",
            "must list purposes",
            id="allow-without-purposes",
        ),
        pytest.param(
            '[[rules]]\nname = "r"\nmethod = "discord.send"\naction = "allow"\nchannels = ["own"]\nhosts = ["a.com"]\n',
            1,
            "rules['r']",
            "hosts only apply to http.fetch",
            id="key-of-another-method",
        ),
        pytest.param(
            '[[rules]]\nname = "r"\nmethod = "*"\naction = "allow"\n',
            1,
            "rules['r']",
            "deny rules only",
            id="allow-everything",
        ),
        pytest.param(
            '[[rules]]\nname = "r"\nmethod = "http.fetch"\naction = "allow"\nhosts = ["Bad Host"]\n',
            5,
            "rules['r'].hosts[#1]",
            "'Bad Host' is not a host name",
            id="bad-host",
        ),
        pytest.param(ALLOW_REPLY + ALLOW_REPLY, None, "", "two rules are named 'reply'", id="duplicate-name"),
        pytest.param("[[rules]\nname = 1\n", 1, "", "not valid TOML", id="toml-syntax"),
        pytest.param(
            "[budgets.all]\ndaily_usd = ",
            None,
            "",
            "not valid TOML: Invalid value (at end of document)",
            id="toml-syntax-at-the-end",
        ),
        pytest.param(
            "gates = { deadline_hours = 0 }\n",
            1,
            "gates.deadline_hours",
            "greater than 0",
            id="zero-deadline",
        ),
        pytest.param("[unknown]\nx = 1\n", 1, "unknown", "unknown key 'unknown'", id="unknown-table"),
    ],
)
def test_a_broken_policy_names_file_line_key_and_reason(
    text: str, line: int | None, key: str, reason: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        policy_from_text(text, "ops/local.toml")
    error = caught.value
    assert error.file == "ops/local.toml"
    if line is not None:
        assert error.line == line, str(error)
    assert error.key == key, str(error)
    assert reason in error.reason, str(error)
    assert str(error).startswith("ops/local.toml")


def test_every_problem_is_reported_not_only_the_first() -> None:
    with pytest.raises(PolicyError) as caught:
        policy_from_text('[budgets.all]\ndaily_usd = -1\nmonthly_usd = "x"\n', "p.toml")
    assert [problem.line for problem in caught.value.problems] == [2, 3]
    assert str(caught.value).count("p.toml:") == 2


def test_a_non_utf8_policy_file_is_refused(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "latin.toml").write_bytes(b'[channels]\nstaff = ["caf\xe9"]\n')
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(ops)


def test_a_model_allowed_but_not_priced_is_a_warning_not_a_silent_free_pass() -> None:
    policy = policy_from_text(ALLOW_REPLY)
    assert policy.price("gpt-4.1-mini") is None
    assert "no entry" in policy.warnings[0] and "refused" in policy.warnings[0]


def test_a_rule_that_allows_loopback_fetches_is_flagged() -> None:
    policy = policy_from_text(
        '[[rules]]\nname = "fetch-local"\nmethod = "http.fetch"\naction = "allow"\nhosts = ["localhost"]\nallow_loopback = true\n'
    )
    assert any("allow_loopback" in warning and "tests only" in warning for warning in policy.warnings)


# --- every number finite and in range (issue 11 #10) -------------------------------------------------

RULE = '[[rules]]\nname = "r"\nmethod = "model.request"\naction = "allow"\npurposes = {{ reply = ["m"] }}\nmax_tokens = {v}\n'
NUMBERS = [
    pytest.param("[budgets.all]\ndaily_usd = {v}\n", 2, "budgets.all.daily_usd", "float", id="budget"),
    pytest.param(
        "[budgets.imps.pip]\nmonthly_usd = {v}\n", 2, "budgets.imps.pip.monthly_usd", "float", id="imp-budget"
    ),
    pytest.param('[prices."gpt-x"]\ninput = {v}\n', 2, "prices.gpt-x.input", "float", id="price"),
    pytest.param("[gates]\ndeadline_hours = {v}\n", 2, "gates.deadline_hours", "float", id="deadline"),
    pytest.param(RULE, 6, "rules['r'].max_tokens", "int", id="rule-limit"),
    pytest.param(
        "[upstream]\ndefault_output_tokens = {v}\n", 2, "upstream.default_output_tokens", "int", id="upstream"
    ),
    pytest.param(
        '[trust."discord.send"]\nearned_after = {v}\n',
        2,
        'trust."discord.send".earned_after',
        "int",
        id="trust",
    ),
]
BAD = {  # TOML literal -> what the error says, for a float key and for an int key
    "inf": ("finite number", "finite number"),
    "nan": ("finite number", "finite number"),
    "-1": ("greater than", "greater than"),
    "1e300": ("less than or equal to", "far too large"),
    "100000000000000000000": ("less than or equal to", "less than or equal to"),
}


@pytest.mark.parametrize("value", list(BAD))
@pytest.mark.parametrize(("template", "line", "key", "kind"), NUMBERS)
def test_every_number_in_a_policy_is_finite_and_in_range(
    template: str, line: int, key: str, kind: str, value: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        policy_from_text(template.format(v=value), "ops/limits.toml")
    problem = caught.value.problems[0]
    assert (problem.file, problem.line, problem.key) == ("ops/limits.toml", line, key), str(problem)
    assert BAD[value][kind == "int"] in problem.reason, str(problem)
    assert "\n" not in str(problem)


def _numbers(annotation: Any, constraints: list[Any]) -> Iterator[tuple[Any, list[Any]]]:
    """Each int/float inside an annotation (through Optional, list, dict, Annotated) with its constraints,
    and each nested policy model (with no constraints)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        found = [item for e in extra for item in (e.metadata if isinstance(e, FieldInfo) else [e])]
        yield from _numbers(base, [*constraints, *found])
    elif origin is not None:
        for arg in typing.get_args(annotation):
            yield from _numbers(arg, constraints)
    elif annotation in (int, float) or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        yield annotation, constraints


def _numeric_fields(
    model: type[BaseModel], seen: set[type] | None = None
) -> Iterator[tuple[str, type, set[str]]]:
    seen = seen if seen is not None else set()
    seen.add(model)
    for name, info in model.model_fields.items():
        for found, constraints in _numbers(info.annotation, list(info.metadata)):
            if found in (int, float):
                kinds = {
                    type(c).__name__ for c in constraints if getattr(c, "allow_inf_nan", None) is not True
                }
                yield f"{model.__name__}.{name}", found, kinds
            elif found not in seen:
                yield from _numeric_fields(found, seen)


def test_no_number_field_of_the_policy_is_left_unbounded() -> None:
    """A new int or float key without bounds (or a float that admits inf and nan) fails here, not at run time."""
    fields = list(_numeric_fields(PolicyFile))
    names = {name for name, _, _ in fields}
    assert {
        "Price.input",
        "Price.service_tiers",
        "BudgetLimit.daily_usd",
        "Rule.max_tokens",
        "UpstreamSettings.timeout_s",
    } <= names
    for name, kind, constraints in fields:
        assert constraints & {"Le", "Lt"}, f"{name} has no upper bound"
        assert constraints & {"Ge", "Gt"}, f"{name} has no lower bound"
        assert kind is int or "AllowInfNan" in constraints, f"{name} admits inf and nan"


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e300"])
def test_policy_check_and_budget_show_name_the_file_and_key_of_a_bad_number(
    tmp_path: Path, value: str
) -> None:
    ops = tmp_path / "ops"
    write(ops, "money.toml", f"[budgets.per_imp]\ndaily_usd = {value}\n")
    runner = CliRunner(env={"COLUMNS": "200"})
    check = runner.invoke(cli, ["policy", "check", str(ops)])
    assert check.exit_code == 1 and "Traceback" not in check.output, check.output
    assert "money.toml:2: budgets.per_imp.daily_usd: " in check.output
    show = runner.invoke(
        cli, ["budget", "show", "--policies", str(ops)]
    )  # it crashed with OverflowError on inf
    assert show.exit_code == 1 and isinstance(show.exception, SystemExit), (
        show.exception
    )  # a CliError, not a crash
    assert (
        "money.toml:2: budgets.per_imp.daily_usd: " in show.output
        and len(show.output.strip().splitlines()) == 1
    )


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e300"])
def test_budget_set_refuses_a_non_finite_amount_with_one_line(value: str) -> None:
    from impyard.imps.store import ImpStore

    ImpStore().add("pip")  # budget set refuses an imp that does not exist (issue 17)
    result = CliRunner().invoke(cli, ["budget", "set", "pip", "--daily", value])
    assert isinstance(result.exception, SystemExit), (
        result.exception
    )  # click's range check, or the ledger's for nan
    assert result.exit_code == (1 if value == "nan" else 2), result.output
    assert (
        "budget limit is a number of USD" in result.output if value == "nan" else "--daily" in result.output
    )
