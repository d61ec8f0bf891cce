"""The gateway's CLI: policy check, approvals, audit tail, budget show/set (through CliRunner)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from impyard.cli import cli
from impyard.clock import FixedClock, SystemClock
from impyard.gateway.audit import AuditLog, AuditRecord
from impyard.gateway.gates import GateStore
from impyard.gateway.ledger import Ledger
from impyard.gateway.policy import load_policy
from impyard.imps.store import ImpStore
from impyard.storage.db import open_database


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env={"COLUMNS": "200", **(env or {})}).invoke(cli, list(args), catch_exceptions=False)


def open_gate(content: str = "hello there", clock: SystemClock | FixedClock | None = None) -> str:
    db = open_database()
    clock = clock or SystemClock()
    gate = GateStore(db, clock, AuditLog(db, clock, [])).open(
        imp="pip", run_id="r1", session_channel="c1", origin_guild="g1", act="discord.send", target="c2",
        payload={"channel_id": "c2", "content": content, "reply_to": None, "files": [], "kind": "other"},
        reason="the target is not the session's own channel: gate", deadline=timedelta(hours=24),
    )  # fmt: skip
    db.close()
    return gate.id


# --- policy check -----------------------------------------------------------------------------------


def test_policy_check_validates_and_lists_the_rules() -> None:
    result = run("policy", "check")
    assert result.exit_code == 0, result.output
    assert (
        "policy ok" in result.output and "model-text" in result.output and "send-own-channel" in result.output
    )


def test_policy_check_explains_the_verdict_for_a_sample_request(tmp_path: Path) -> None:
    args = ("policy", "check", "--imp", "pip", "--method", "model.request", "--path", "/chat/completions",
            "--purpose", "reply", "--model", "gpt-4.1-mini", "--json")  # fmt: skip
    result = run(*args, env={"OPENAI_API_KEY": "sk-impyard-cli-test"})
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert report["sample"] == {"allowed": True, "rule": "model-text", "reason": "allowed", "verdict": "allowed",
                                "estimate_micros": report["sample"]["estimate_micros"]}  # fmt: skip
    assert report["sample"]["estimate_micros"] > 0
    no_key = json.loads(run(*args).output)[
        "sample"
    ]  # what the live gateway answers a host without a model key
    assert (no_key["allowed"], no_key["verdict"], no_key["code"]) == (False, "unreachable", -32013)
    assert "OPENAI_API_KEY" in no_key["reason"]
    denied = json.loads(run("policy", "check", "--method", "model.request", "--path", "/chat/completions",
                            "--purpose", "reply", "--model", "gpt-5", "--json").output)  # fmt: skip
    assert (
        denied["sample"]["allowed"] is False
        and "no rule allows model 'gpt-5' for purpose 'reply'" in denied["sample"]["reason"]
    )
    fetch = run("policy", "check", "--method", "http.fetch", "--host", "example.com")
    assert "denied by rule default-deny" in fetch.output
    send = json.loads(
        run("policy", "check", "--method", "discord.send", "--channel", "other", "--json").output
    )
    assert send["sample"]["rule"] == "default-deny"
    own = json.loads(run("policy", "check", "--method", "discord.send", "--session-trusted", "--json").output)
    assert own["sample"]["trust"]["mode"] == "auto"


def test_policy_check_of_a_directory_with_a_typo_names_file_line_and_key(tmp_path: Path) -> None:
    (tmp_path / "ops.toml").write_text(
        '[[rules]]\nname = "x"\nmethod = "http.fetch"\naction = "allow"\nhost = ["a.com"]\n'
    )
    result = run("policy", "check", str(tmp_path))
    assert result.exit_code == 1
    assert (
        "ops.toml:5" in result.output
        and "rules['x'].host" in result.output
        and "did you mean 'hosts'" in result.output
    )
    assert "Traceback" not in result.output
    as_json = json.loads(run("policy", "check", str(tmp_path), "--json").output)
    assert as_json["ok"] is False and as_json["problems"][0]["line"] == 5


def test_policy_check_of_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    result = run("policy", "check", str(tmp_path / "nope"))
    assert result.exit_code == 1 and "is not a directory" in result.output


def test_the_operator_directory_comes_from_impyard_home(impyard_home: Path) -> None:
    (impyard_home / "policies").mkdir(parents=True)
    (impyard_home / "policies" / "fetch.toml").write_text(
        'rules = [{ name = "fetch-docs", method = "http.fetch", action = "allow", hosts = ["docs.python.org"] }]\n'
    )
    result = run("policy", "check", "--method", "http.fetch", "--host", "docs.python.org", "--json")
    assert json.loads(result.output)["sample"]["rule"] == "fetch-docs"


# --- approvals -------------------------------------------------------------------------------------


def test_approvals_ls_show_approve(impyard_home: Path) -> None:
    assert run("approvals", "ls").output.strip() == "no pending gates"
    gate_id = open_gate("please post this")
    listing = run("approvals", "ls")
    assert gate_id in listing.output and "please post this" in listing.output
    shown = run("approvals", "show", gate_id)
    assert "please post this" in shown.output and "pending" in shown.output and "c2" in shown.output
    assert json.loads(run("approvals", "ls", "--json").output)[0]["id"] == gate_id
    approved = run("approvals", "approve", gate_id, "--note", "fine")
    assert approved.exit_code == 0 and "approved" in approved.output
    gate = json.loads(run("approvals", "show", gate_id, "--json").output)
    assert (
        gate["state"] == "approved"
        and gate["decided_by"].startswith("operator:")
        and gate["decision_note"] == "fine"
    )
    again = run("approvals", "approve", gate_id)
    assert again.exit_code == 1 and "already approved" in again.output
    assert run("approvals", "ls").output.strip() == "no pending gates"
    assert gate_id in run("approvals", "ls", "--all").output


def test_approvals_deny(impyard_home: Path) -> None:
    gate_id = open_gate()
    result = run("approvals", "deny", gate_id, "--note", "no thanks", "--json")
    assert result.exit_code == 0 and json.loads(result.output)["state"] == "denied"


def test_approving_an_expired_gate_fails_and_ls_expires_it(impyard_home: Path) -> None:
    gate_id = open_gate(clock=FixedClock(datetime.now(UTC) - timedelta(days=2)))
    result = run("approvals", "approve", gate_id)
    assert result.exit_code == 1 and "expired" in result.output
    assert json.loads(run("approvals", "show", gate_id, "--json").output)["state"] == "expired"


def test_an_unknown_gate_is_a_one_line_error() -> None:
    result = run("approvals", "approve", "g-nope")
    assert result.exit_code == 1 and "no gate 'g-nope'" in result.output


# --- audit -----------------------------------------------------------------------------------------


def test_audit_tail_shows_the_latest_rows(impyard_home: Path) -> None:
    assert "no audit rows" in run("audit", "tail").output
    db = open_database()
    audit = AuditLog(db, SystemClock(), [])
    for index in range(5):
        imp = "pip" if index % 2 == 0 else "bob"
        audit.write(
            AuditRecord(
                imp=imp,
                method="model.request",
                verdict="allowed",
                rule="model-text",
                cost_micros=1500,
                detail=f"n{index}",
            )
        )
    db.close()
    rows = [json.loads(line) for line in run("audit", "tail", "-n", "2", "--json").output.splitlines()]
    assert [row["detail"] for row in rows] == ["n3", "n4"]
    pip = [json.loads(line) for line in run("audit", "tail", "--imp", "pip", "--json").output.splitlines()]
    assert [row["detail"] for row in pip] == ["n0", "n2", "n4"] and pip[0]["cost_usd"] == 0.0015
    table = run("audit", "tail")
    assert "model-text" in table.output and "allowed" in table.output


# --- budget ----------------------------------------------------------------------------------------


def test_budget_set_overrides_the_policy_and_show_reports_it(impyard_home: Path) -> None:
    shown = json.loads(run("budget", "show", "--json").output)
    assert shown[0]["scope"] == "all" and shown[0]["daily_limit_usd"] == load_policy().budgets.all.daily_usd
    ImpStore().add("pip")  # budget set refuses an imp that does not exist (issue 17)
    result = run("budget", "set", "pip", "--daily", "1.5", "--monthly", "20")
    assert result.exit_code == 0 and "daily 1.5000" in result.output
    db = open_database()
    ledger = Ledger(db, load_policy(), SystemClock())
    ledger.settle(ledger.reserve("pip", 250_000), 250_000)
    assert ledger.limits("pip").daily == 1_500_000
    db.close()
    rows = {row["scope"]: row for row in json.loads(run("budget", "show", "--json").output)}
    assert rows["pip"]["daily_spent_usd"] == 0.25 and rows["pip"]["source"] == "override"
    assert rows["all"]["daily_spent_usd"] == 0.25
    assert "pip" in run("budget", "show").output
    run("budget", "set", "all", "--monthly", "7")
    assert {r["scope"]: r for r in json.loads(run("budget", "show", "--json").output)}["all"][
        "monthly_limit_usd"
    ] == 7
    cleared = run("budget", "set", "pip", "--clear")
    assert "(policy)" in cleared.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["budget", "set", "pip"], "nothing to set"),
        (["budget", "set", "bad name!", "--daily", "1"], "is not an imp name"),
        (["budget", "set", "pip", "--daily", "-1"], "-1"),
    ],
)
def test_budget_set_refuses_bad_input(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and message in result.output


def test_a_broken_policy_stops_budget_commands_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[budgets.all]\ndaily_usd = 'lots'\n")
    result = run("budget", "show", "--policies", str(tmp_path))
    assert result.exit_code == 1 and "bad.toml:2" in result.output and "Traceback" not in result.output
