"""``impyard policy``: validate the governance policy and explain what it decides."""

from __future__ import annotations

import json
import tempfile
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import click
from pydantic import BaseModel, ValidationError
from rich.console import Console
from sqlalchemy.engine import Connection

from box.protocol.models import DiscordSendParams, HttpFetchParams, ModelPath, ModelRequestParams
from impyard.backends.base import BoxSpec
from impyard.cli.errors import CliError
from impyard.cli.output import Output, output_options, table_of
from impyard.clock import SystemClock
from impyard.gateway.broker import encode_body
from impyard.gateway.core import Decision
from impyard.gateway.policy import Policy, PolicyError, load_policy, operator_policy_dir
from impyard.gateway.prices import SENT_CAP_KEY
from impyard.gateway.surfaces import NoSurface
from impyard.gateway.trust import ChannelInfo, DbChannelTrust
from impyard.host import build_gateway
from impyard.imps.config import ImpError
from impyard.imps.store import ImpStore
from impyard.storage.db import Database, default_path, open_database
from impyard.storage.urls import DB_FILENAME

METHODS = ("model.request", "discord.send", "http.fetch")
MODEL_PATHS: tuple[str, ...] = typing.get_args(ModelPath)
SAMPLE_STATE_DIR = Path("/state")  # a dry run starts no box; the spec only names the imp and its session


def load_policy_or_fail(directory: Path | None = None) -> Policy:
    """The effective policy, or a one-line CLI error naming the file, line, key and reason."""
    try:
        return load_policy(directory, require_dir=directory is not None)
    except PolicyError as exc:
        more = (
            f" (and {len(exc.problems) - 1} more problems; run `impyard policy check`)"
            if len(exc.problems) > 1
            else ""
        )
        raise CliError(f"the policy is broken: {exc.problems[0]}{more}") from exc


@click.group("policy")
def policy_group() -> None:
    """The governance policy: which box requests are allowed, budgets, prices, trust.

    \b
    Example:
      impyard policy check
      impyard policy check --imp pip --method model.request --model gpt-4.1-mini
    """


@policy_group.command("check")
@click.argument("directory", required=False, type=click.Path(path_type=Path, file_okay=False))
@click.option("--imp", default="imp", show_default=True, help="The imp making the sample request.")
@click.option(
    "--method", type=click.Choice(METHODS), help="Explain the verdict for a sample request of this method."
)
@click.option("--path", "path_", type=click.Choice(MODEL_PATHS), default="/chat/completions", show_default=True,
              help="model.request: the API path.")  # fmt: skip
@click.option("--purpose", default="reply", show_default=True, help="model.request: the purpose.")
@click.option("--model", help="model.request: the model named in the body.")
@click.option("--max-tokens", type=int, help="model.request: the body's output cap.")
@click.option(
    "--body-bytes", type=int, default=0, help="model.request: pad the sample body's text to this size."
)
@click.option("--body", "body_json", metavar="JSON|@FILE",
              help="model.request: the whole JSON body (--model and --max-tokens set their keys in it).")  # fmt: skip
@click.option(
    "--session-channel", default="session", show_default=True, help="The channel of the box's session."
)
@click.option("--session-trusted", is_flag=True, help="discord.send: treat the session's channel as trusted.")
@click.option("--channel", help="discord.send: the target channel (default: the session's channel).")
@click.option("--content-chars", type=int, default=1, help="discord.send: the content length.")
@click.option("--host", help="http.fetch: the host of the URL (fetches https://HOST/).")
@click.option("--url", help="http.fetch: the whole URL.")
@output_options
def check_command(
    directory: Path | None,
    imp: str,
    method: str | None,
    path_: str,
    purpose: str,
    model: str | None,
    max_tokens: int | None,
    body_bytes: int,
    body_json: str | None,
    session_channel: str,
    session_trusted: bool,
    channel: str | None,
    content_chars: int,
    host: str | None,
    url: str | None,
    out: Output,
) -> None:
    """Validate the policy (the shipped default overlaid by DIRECTORY, default the operator's
    policy directory) and, given --method, explain what the gateway would answer a sample request.

    The sample is a dry run of the gateway's own decision: the judge (with the body allow-list and
    the rule's limits), the price table, the request size, the model key, trust for sends, the rate
    limit (as a host just started sees it: a running host counts in its own memory) and the budget
    left in the home's ledger, in the gateway's order. Nothing is sent, reserved, gated or audited.

    \b
    Examples:
      impyard policy check
      impyard policy check ./my-policies --imp pip --method model.request \\
          --path /chat/completions --purpose reply --model gpt-4.1-mini
      impyard policy check --method model.request --model gpt-4.1-mini \\
          --body '{"tools": [{"type": "web_search"}]}'
      impyard policy check --method discord.send --channel 1234 --session-channel 999
    """
    if directory is not None and not directory.is_dir():
        raise CliError(f"{directory} is not a directory; give a directory of *.toml policy files")
    try:
        policy = load_policy(directory, require_dir=directory is not None)
    except PolicyError as exc:
        if out.as_json:
            problems = [
                {"file": p.file, "line": p.line, "key": p.key, "reason": p.reason} for p in exc.problems
            ]
            out.json({"ok": False, "problems": problems})
            raise SystemExit(1) from exc
        raise CliError(
            "the policy is broken:\n" + "\n".join(f"  {problem}" for problem in exc.problems)
        ) from exc

    report: dict[str, object] = {
        "ok": True,
        "sources": [str(source) for source in policy.sources],
        "rules": [
            {
                "name": r.name,
                "action": r.action,
                "method": r.method,
                "scope": r.scope,
                "file": policy.rule_sources[r.name],
            }
            for r in policy.rules
        ],
        "warnings": policy.warnings,
    }
    decision: Decision | None = None
    if method is not None:
        params = sample_params(
            method, path=path_, purpose=purpose, model=model, max_tokens=max_tokens, body_bytes=body_bytes,
            body_json=body_json, channel=channel or session_channel, content_chars=content_chars, host=host, url=url,
        )  # fmt: skip
        spec = BoxSpec(imp, session_channel, SAMPLE_STATE_DIR, run_id="policy-check")
        decision = anyio.run(dry_run, policy, spec, method, params, session_trusted)
        report["sample"] = sample_report(decision)

    if out.as_json:
        out.json(report)
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
    rows = (
        (
            str(index),
            rule.name,
            rule.action,
            rule.method,
            rule.scope,
            Path(policy.rule_sources[rule.name]).name,
        )
        for index, rule in enumerate(policy.rules, start=1)
    )
    console.print(table_of(("#", "rule", "action", "method", "scope", "file"), rows))
    for warning in policy.warnings:
        console.print(f"[yellow]warning[/yellow]: {warning}", highlight=False)
    if decision is not None:
        # A gated send passed every check: the rule allowed it, and the trust line says it waits for approval.
        word = (
            "[green]allowed[/green]"
            if decision.allowed
            else f"[red]{decision.verdict.replace('_', ' ')}[/red]"
        )
        reason = "allowed" if decision.allowed else decision.reason
        console.print(f"sample {method} by {imp}: {word} by rule {decision.rule}: {reason}", highlight=False)
        if decision.trust is not None and decision.allowed:
            console.print(f"  then: {decision.trust.mode} ({decision.trust.why})", highlight=False)
        if decision.estimate_micros is not None and decision.allowed:
            console.print(
                f"  reserves up to ${decision.estimate_micros / 1_000_000:.6f} of the budget", highlight=False
            )
        if method == "http.fetch" and decision.allowed:
            console.print(
                "  then: the host's addresses are checked when it is fetched (rule egress)", highlight=False
            )


# ------------------------------------------------------------------ the sample request


def sample_params(
    method: str,
    *,
    path: str,
    purpose: str,
    model: str | None,
    max_tokens: int | None,
    body_bytes: int,
    body_json: str | None,
    channel: str,
    content_chars: int,
    host: str | None,
    url: str | None,
) -> BaseModel:
    """The sample as the box would send it: the method's protocol params, validated as the protocol does."""
    try:
        if method == "model.request":
            body = sample_body(
                path, model=model, max_tokens=max_tokens, body_bytes=body_bytes, body_json=body_json
            )
            return ModelRequestParams.model_validate({"path": path, "body": body, "purpose": purpose})
        if method == "discord.send":
            return DiscordSendParams(channel_id=channel, content="x" * content_chars)
        if url is None and host is None:
            raise CliError("http.fetch needs --host or --url")
        return HttpFetchParams(url=url if url is not None else f"https://{host}/")
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise CliError(f"the sample request is not one a box can send ({where}: {problem['msg']})") from None


def sample_body(
    path: str, *, model: str | None, max_tokens: int | None, body_bytes: int, body_json: str | None
) -> dict[str, Any]:
    """The model.request body: ``--body`` as given, or a one-message prompt padded to ``--body-bytes``."""
    if body_json is not None:
        if body_bytes:
            raise CliError("--body-bytes pads the sample body; with --body, give the text in the body itself")
        body = _json_object(body_json)
    else:
        body = {}
    if model is not None:
        body["model"] = model
    if max_tokens is not None:
        if path not in SENT_CAP_KEY:
            raise CliError(f"--max-tokens applies to {' and '.join(SENT_CAP_KEY)}, not to {path}")
        body[SENT_CAP_KEY[path]] = max_tokens
    if body_json is not None:
        return body
    text = "hi"
    padding = body_bytes - len(encode_body(_with_text(path, body, text)))
    return _with_text(path, body, text + "x" * max(0, padding))


def _with_text(path: str, body: dict[str, Any], text: str) -> dict[str, Any]:
    if path == "/chat/completions":
        return {**body, "messages": [{"role": "user", "content": text}]}
    return {**body, ("input" if path in ("/responses", "/embeddings") else "prompt"): text}


def _json_object(text: str) -> dict[str, Any]:
    source = "--body"
    if text.startswith("@"):
        source = text[1:]
        try:
            text = Path(source).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read the body from {source}: {exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{source} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CliError(f"{source} must be a JSON object (a model.request body)")
    return value


def sample_report(decision: Decision) -> dict[str, object]:
    sample: dict[str, object] = {
        "allowed": decision.allowed,
        "rule": decision.rule,
        "reason": decision.reason,
        "verdict": decision.verdict,
    }
    if decision.error is not None:
        sample["code"] = decision.error.code
        if isinstance(decision.error.data, dict) and "retry_after" in decision.error.data:
            sample["retry_after"] = decision.error.data["retry_after"]
    if decision.estimate_micros is not None:
        sample["estimate_micros"] = decision.estimate_micros
    if decision.trust is not None:
        sample["trust"] = {
            "mode": decision.trust.mode,
            "ladder": decision.trust.ladder,
            "why": decision.trust.why,
        }
    return sample


# ------------------------------------------------------------------ the gateway's dry run


@dataclass(frozen=True)
class _SessionTrust:
    """Channel trust as the home's database has it; ``--session-trusted`` trusts the session's channel too."""

    stored: DbChannelTrust
    also_trusted: frozenset[str]

    def info(self, channel_id: str, *, conn: Connection | None = None) -> ChannelInfo | None:
        """The stored row; a channel ``--session-trusted`` names reads as trusted (the gateway may judge a send
        from this row alone)."""
        found = self.stored.info(channel_id, conn=conn)
        if channel_id not in self.also_trusted:
            return found
        return replace(found, trusted=True) if found is not None else ChannelInfo(channel_id, trusted=True)

    def is_trusted(self, channel_id: str, *, conn: Connection | None = None) -> bool:
        return channel_id in self.also_trusted or self.stored.is_trusted(channel_id, conn=conn)


@contextmanager
def home_database() -> Iterator[Database]:
    """The home's database, only read here (budgets spent, channel trust, earned trust); an empty scratch
    one when the home has none yet, so that a check creates nothing."""
    path = default_path()
    with tempfile.TemporaryDirectory(prefix="impyard-policy-check-") as scratch:
        db = open_database(path if path.exists() else Path(scratch) / DB_FILENAME)
        try:
            yield db
        finally:
            db.close()


def staff_channels(imp: str) -> list[str]:
    """The imp's own staff channel from its imp.toml, as the host knows it (none when it does not load)."""
    try:
        config = ImpStore().get(imp)
    except ImpError:
        return []
    return [config.discord.staff_channel] if config.discord.staff_channel else []


async def dry_run(
    policy: Policy, spec: BoxSpec, method: str, params: BaseModel, session_trusted: bool
) -> Decision:
    """Ask a gateway on this policy and the home's database what it would answer (``Gateway.dry_run``)."""
    clock = SystemClock()
    with home_database() as db:
        trusted = frozenset({spec.channel_id} if session_trusted else ())
        gateway = build_gateway(
            policy=policy, db=db, surface=NoSurface("policy check posts nothing"), clock=clock,
            channels=_SessionTrust(DbChannelTrust(db, clock), trusted),
            staff_channels={spec.imp: staff_channels(spec.imp)}, settle_abandoned=False,
        )  # fmt: skip
        try:
            return await gateway.dry_run(spec, method, params)
        finally:
            await gateway.aclose()
