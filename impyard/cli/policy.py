"""``impyard policy``: validate the governance policy and explain what it decides."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from impyard.cli.errors import CliError
from impyard.judge import RequestFacts, judge
from impyard.policy import Policy, PolicyError, load_policy, operator_policy_dir
from impyard.trust import decide_trust

METHODS = ("model.request", "discord.send", "http.fetch")


def load_policy_or_fail(directory: Path | None = None) -> Policy:
    """The effective policy, or a one-line CLI error naming the file, line, key and reason."""
    try:
        return load_policy(directory, require_dir=directory is not None)
    except PolicyError as exc:
        more = f" (and {len(exc.problems) - 1} more problems; run `impyard policy check`)" if len(exc.problems) > 1 else ""
        raise CliError(f"the policy is broken: {exc.problems[0]}{more}") from exc


@click.group("policy")
def policy_group() -> None:
    """The governance policy: which box requests are allowed, budgets, prices, trust."""


@policy_group.command("check")
@click.argument("directory", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option("--imp", default="imp", show_default=True, help="The imp making the sample request.")
@click.option("--method", type=click.Choice(METHODS), help="Explain the verdict for a sample request of this method.")
@click.option("--path", "path_", help="model.request: the API path, e.g. /chat/completions.")
@click.option("--purpose", help="model.request: the purpose, e.g. reply.")
@click.option("--model", help="model.request: the model named in the body.")
@click.option("--max-tokens", type=int, help="model.request: the body's output cap.")
@click.option("--body-bytes", type=int, default=0, help="model.request: the body's size.")
@click.option("--session-channel", default="session", show_default=True, help="The channel of the box's session.")
@click.option("--session-trusted", is_flag=True, help="discord.send: treat the session's channel as trusted.")
@click.option("--channel", help="discord.send: the target channel (default: the session's channel).")
@click.option("--content-chars", type=int, default=1, help="discord.send: the content length.")
@click.option("--host", help="http.fetch: the host of the URL.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check_command(
    directory: Path | None,
    imp: str,
    method: str | None,
    path_: str | None,
    purpose: str | None,
    model: str | None,
    max_tokens: int | None,
    body_bytes: int,
    session_channel: str,
    session_trusted: bool,
    channel: str | None,
    content_chars: int,
    host: str | None,
    as_json: bool,
) -> None:
    """Validate the policy (the shipped default overlaid by DIRECTORY, default the operator's
    policy directory) and, given --method, explain which rule decides a sample request.

    \b
    Examples:
      impyard policy check
      impyard policy check ./my-policies --imp pip --method model.request \\
          --path /chat/completions --purpose reply --model gpt-4.1-mini
      impyard policy check --method discord.send --channel 1234 --session-channel 999
    """
    if directory is not None and not directory.is_dir():
        raise CliError(f"{directory} is not a directory; give a directory of *.toml policy files")
    try:
        policy = load_policy(directory, require_dir=directory is not None)
    except PolicyError as exc:
        if as_json:
            problems = [{"file": p.file, "line": p.line, "key": p.key, "reason": p.reason} for p in exc.problems]
            click.echo(json.dumps({"ok": False, "problems": problems}, indent=2))
            raise SystemExit(1) from exc
        raise CliError("the policy is broken:\n" + "\n".join(f"  {problem}" for problem in exc.problems)) from exc

    report: dict[str, object] = {
        "ok": True,
        "sources": [str(source) for source in policy.sources],
        "rules": [
            {"name": r.name, "action": r.action, "method": r.method, "scope": r.scope, "file": policy.rule_sources[r.name]}
            for r in policy.rules
        ],
        "warnings": policy.warnings,
    }
    if method is not None:
        facts = RequestFacts(
            imp=imp,
            method=method,
            session_channel=session_channel,
            path=path_,
            purpose=purpose,
            model=model,
            body_bytes=body_bytes,
            output_tokens=max_tokens,
            target_channel=channel or session_channel,
            content_chars=content_chars,
            host=host.lower().rstrip(".") if host else None,
        )
        verdict = judge(facts, policy)
        sample: dict[str, object] = {
            "allowed": verdict.allowed,
            "rule": verdict.rule,
            "reason": verdict.reason,
        }
        if method == "model.request" and verdict.allowed and model and policy.price(model) is None:
            sample.update(allowed=False, rule="prices", reason=f"model {model!r} has no price in the price table")
        if method == "discord.send" and verdict.allowed and verdict.matched is not None:
            decision = decide_trust(
                target_is_own=facts.target_channel == session_channel,
                own_trusted=session_trusted,
                rule_trust=verdict.matched.trust,
                settings=policy.trust_for("discord.send"),
                clean_approvals=0,
            )
            sample["trust"] = {"mode": decision.mode, "ladder": decision.ladder, "why": decision.why}
        report["sample"] = sample

    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    console = Console()
    operator = [s for s in policy.sources[:-1]]
    console.print(
        f"[green]policy ok[/green]: {len(policy.rules)} rules from {len(policy.sources)} file(s) "
        f"(operator directory: {directory or operator_policy_dir()}"
        + ("" if operator else ", no files there")
        + ")",
        highlight=False,
    )
    table = Table("#", "rule", "action", "method", "scope", "file")
    for index, rule in enumerate(policy.rules, start=1):
        table.add_row(str(index), rule.name, rule.action, rule.method, rule.scope, Path(policy.rule_sources[rule.name]).name)
    console.print(table)
    for warning in policy.warnings:
        console.print(f"[yellow]warning[/yellow]: {warning}", highlight=False)
    if "sample" in report:
        sample = report["sample"]  # type: ignore[assignment]
        assert isinstance(sample, dict)
        word = "[green]allowed[/green]" if sample["allowed"] else "[red]denied[/red]"
        console.print(f"sample {method} by {imp}: {word} by rule {sample['rule']}: {sample['reason']}", highlight=False)
        if "trust" in sample:
            trust = sample["trust"]
            console.print(f"  then: {trust['mode']} ({trust['why']})", highlight=False)
