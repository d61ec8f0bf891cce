"""``impyard doctor``: what stops a chat from working, each with its fix; exit 1 when anything does.

This module observes (the disk, the policy, each imp's config, the gateway's dry run, one metered model
call, Docker) and prints; what each observation means is ``impyard.cli.doctor_rules``'s rules.
"""

from __future__ import annotations

import shutil
import time
import uuid

import anyio
import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from box.common.embedding import HASHING_DIMS
from box.common.structured import refuses_json_schema
from box.protocol import RpcError
from box.protocol.models import ModelRequestParams, ModelRequestResult
from impyard import paths
from impyard.backends import BoxStartError
from impyard.backends.base import BoxSpec
from impyard.backends.docker import DockerBackend
from impyard.backends.runtimes import RuntimeChoice, runtime_choice
from impyard.backends.stateroot import STATE_ROOT_ENV, state_root
from impyard.cli.doctor_rules import (
    DockerFacts,
    Finding,
    ModelUse,
    Refusal,
    broken_imp_finding,
    broken_policy_finding,
    docker_findings,
    embedding_length_finding,
    endpoint_finding,
    endpoint_timing,
    envelope_probe_body,
    error_words,
    exit_code,
    http_fix,
    imp_finding,
    model_uses,
    no_key_finding,
    other_lengths_finding,
    policy_finding,
    runtime_finding,
    slow_finding,
    state_finding,
)
from impyard.cli.errors import CliError
from impyard.cli.output import Col, Output, output_options, stdout_is_terminal
from impyard.cli.policy import home_database
from impyard.clock import SystemClock
from impyard.gateway.broker import UpstreamConfig, UpstreamResponse
from impyard.gateway.core import Gateway
from impyard.gateway.local_embedder import INSTALL_HINT, LOCAL_EMBEDDER, LOCAL_MODEL, LocalModelMissing
from impyard.gateway.model_act import answered_length
from impyard.gateway.policy import Policy, PolicyError, load_policy, operator_policy_dir
from impyard.gateway.surfaces import NoSurface
from impyard.host import build_gateway
from impyard.imps.store import EMBEDDING_LENGTH_BOUNDS, ImpConfig, ImpError, ImpStore
from impyard.memory.vector_lengths import vector_lengths
from impyard.storage import urls as dburl
from impyard.storage.db import STORAGE_ERRORS, Database, DatabaseError, open_database
from impyard.storage.urls import DatabaseUrlError

OPERATOR_CHANNEL = "operator:cli"  # the session channel the operator's own calls are audited on
MODEL_CALL_TIMEOUT_S = 60.0  # an imp whose attempts have no limit of their own
MODEL_CALL_GRACE_S = 5.0  # past the call's own limit, for the gateway to settle and audit it
DRY_RUN_KEY = "doctor-dry-run"  # lets the dry run go past the key check: the endpoint row checks the key
STATUS_MARK = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}


@click.command("doctor")
@click.option(
    "--no-model-call",
    is_flag=True,
    help="Skip the one metered model call (the endpoint is then not checked).",
)
@output_options
def doctor_command(no_model_call: bool, out: Output) -> None:
    """Find what stops a chat from working, each with its fix; exit 1 if anything does.

    \b
    Checks the state dir (writable, free space), the policy (it loads, as the
    gateway loads it), each imp (imp.toml loads; every model it uses — reply,
    and with [memory] enabled the memory calls and the embedding model — is
    allowed by the policy for that purpose, priced, and within its budget: the
    gateway's own dry run), the model endpoint (one tiny structured-output
    call through the gateway, as the first imp: judged, metered against its
    budget and audited on channel operator:cli), each imp's embedder (the local
    model loads; a gateway embedding model answers vectors of the length asked:
    one tiny metered call per imp; memories another embedder made), the Docker
    engine, the runtime
    each imp's boxes run under (gVisor's runsc, or runc), whether the box image
    is built from this code, and each imp's Discord token.
    Warnings (no lockdown, no Discord token) do not fail the check.
    Examples:
      impyard doctor
      impyard doctor --no-model-call --json
    """
    findings = [_state_finding(), _database_finding(), _state_root_finding()]
    policy, policy_row = _policy()
    findings.append(policy_row)
    imps, imp_rows = _imps(policy)
    findings.append(_endpoint(policy, imps, skip=no_model_call))
    facts = docker_facts()
    findings += docker_findings(facts, {config.box.backend for config in imps})
    findings.append(_runtime_finding(facts, imps))
    findings += imp_rows
    findings += _embedder_findings(policy, imps, skip=no_model_call)
    findings += _discord_findings()
    if out.as_json or not stdout_is_terminal():
        out.listing(
            [finding.to_json() for finding in findings],
            columns=(Col("status", no_wrap=True), Col("item", no_wrap=True), "detail", "fix"),
            rows=(_finding_row(finding) for finding in findings),
        )
    else:
        _print_for_people(findings)
    if exit_code(findings):
        failed = [finding.item for finding in findings if finding.status == "fail"]
        if out.as_json:
            raise SystemExit(1)
        raise CliError(
            f"{len(failed)} problem(s) stop a chat from working: {', '.join(failed)}; see the fixes above"
        )


def _print_for_people(findings: list[Finding]) -> None:
    """One finding per row and its fix under its detail, in full: a fix shortened to fit a table column
    would be no fix. Long text wraps between words within its column."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column(
        overflow="fold"
    )  # words wrap whole; only a token longer than the line folds, nothing is cut
    for finding in findings:
        text = escape(finding.detail) + (f"\n[dim]fix:[/] {escape(finding.fix)}" if finding.fix else "")
        grid.add_row(STATUS_MARK[finding.status], escape(finding.item), text)
    Console().print(grid, highlight=False)


def _finding_row(finding: Finding) -> tuple[str, ...]:
    # details are text, not markup: "[redacted]" must print as itself
    return (STATUS_MARK[finding.status], escape(finding.item), escape(finding.detail), escape(finding.fix))


# ------------------------------------------------------------------ the state dir


def _state_finding() -> Finding:
    home = paths.home()
    try:
        home.mkdir(parents=True, exist_ok=True)
        probe = home / ".doctor-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return state_finding(str(home), exc.strerror or str(exc), None)
    try:
        free: int | None = shutil.disk_usage(home).free
    except OSError:
        free = None
    return state_finding(str(home), None, free)


def _database_finding() -> Finding:
    """The host database (``IMPYARD_DATABASE_URL``, issue 21): where it is (never the password) and whether it
    opens and migrates; a bad URL, a wrong password or an unreachable server is the row's one line."""
    try:
        where = dburl.from_env().redacted()
    except DatabaseUrlError as exc:
        return Finding("Database", "fail", str(exc), f"fix {dburl.ENV}, or unset it")
    try:
        db = open_database()
    except DatabaseError as exc:
        return Finding("Database", "fail", exc.user_message(), f"fix {dburl.ENV}, or unset it")
    try:
        return Finding("Database", "ok", f"{where} (schema version {db.version})")
    finally:
        db.close()


def _state_root_finding() -> Finding:
    """Where boxes' /state lies (``IMPYARD_STATE_ROOT``, issue 21); a bad value stops every box."""
    try:
        root = state_root()
    except BoxStartError as exc:
        return Finding(
            "Box state root", "fail", str(exc), f"set {STATE_ROOT_ENV} to an absolute path, or unset it"
        )
    return Finding("Box state root", "ok", root.describe())


# ------------------------------------------------------------------ the policy and the imps


def _policy() -> tuple[Policy | None, Finding]:
    """The policy as the gateway loads it (``impyard.host``: ``load_policy()``), or the first problem."""
    try:
        policy = load_policy()
    except PolicyError as exc:
        return None, broken_policy_finding(str(exc.problems[0]), len(exc.problems) - 1)
    return policy, policy_finding(
        len(policy.rules), len(policy.sources), str(operator_policy_dir()), list(policy.warnings)
    )


def _imps(policy: Policy | None) -> tuple[list[ImpConfig], list[Finding]]:
    """Each imp that loads, and a finding per imp: its config, and its model calls as the gateway judges them."""
    store = ImpStore()
    try:
        scanned = store.scan()
    except ImpError as exc:
        return [], [Finding("Imps", "fail", str(exc).splitlines()[0], "fix the imp directory named")]
    if not scanned:
        return [], [Finding("Imps", "warn", "no imps yet", "impyard imp add NAME (impyard chat creates one)")]
    configs = [item for _name, item in scanned if isinstance(item, ImpConfig)]
    refusals: dict[str, list[Refusal]] = {}
    if policy is not None and configs:
        refusals = anyio.run(_dry_runs, policy, configs)
    rows = []
    for name, item in scanned:
        if isinstance(item, ImpError):
            rows.append(broken_imp_finding(name, str(item).splitlines()[0]))
        elif policy is None:
            rows.append(
                Finding(f"Imp {name}", "warn", "its model calls are not checked: the policy does not load")
            )
        else:
            rows.append(
                imp_finding(
                    name, model_uses(item), refusals[name], item.box.backend, str(operator_policy_dir())
                )
            )
    return configs, rows


async def _dry_runs(policy: Policy, configs: list[ImpConfig]) -> dict[str, list[Refusal]]:
    """The gateway's own decision on each imp's model calls (``Gateway.dry_run``: judge, prices, request size,
    budget left), on the home's database; nothing is sent, reserved or audited. The model key is the endpoint
    row's business, so the dry run is given a stand-in."""
    configured = UpstreamConfig.from_env()
    refusals: dict[str, list[Refusal]] = {}
    with home_database() as db:
        gateway = build_gateway(
            policy=policy, db=db, surface=NoSurface("impyard doctor posts nothing"), clock=SystemClock(), surfaces=(),
            upstream=UpstreamConfig(base_url=configured.base_url, api_key=DRY_RUN_KEY), settle_abandoned=False,
        )  # fmt: skip
        try:
            for config in configs:
                spec = BoxSpec(
                    config.name, OPERATOR_CHANNEL, ImpStore().state_dir(config.name), run_id="doctor"
                )
                refusals[config.name] = []
                for use in model_uses(config):
                    decision = await gateway.dry_run(spec, "model.request", _params(use))
                    if not decision.allowed:
                        refusals[config.name].append(
                            Refusal(use, decision.verdict, decision.rule, decision.reason)
                        )
        finally:
            await gateway.aclose()
    return refusals


def _params(use: ModelUse) -> ModelRequestParams:
    return ModelRequestParams.model_validate({"path": use.path, "body": use.body, "purpose": use.purpose})


# ------------------------------------------------------------------ the model endpoint: one metered call


def _endpoint(policy: Policy | None, imps: list[ImpConfig], *, skip: bool) -> Finding:
    upstream = UpstreamConfig.from_env()
    base = upstream.display_url  # never the URL's credentials (issue 11 #9)
    if not upstream.api_key:
        return no_key_finding(base)
    if skip:
        return Finding("Model endpoint", "warn", f"not called (--no-model-call); base {base}")
    if policy is None:
        return Finding("Model endpoint", "fail", f"not called: the policy does not load; base {base}",
                       "fix the policy first (see the Policy row)")  # fmt: skip
    if not imps:
        return Finding(
            "Model endpoint", "warn", f"not called: no imp to make the call as (it is metered); base {base}",
            "impyard imp add NAME (impyard chat creates one), then impyard doctor",
        )  # fmt: skip
    config = imps[0]
    try:
        db = open_database()
    except DatabaseError as exc:
        return Finding("Model endpoint", "fail", f"not called: {exc}", "see the State dir row")
    try:
        return anyio.run(_call, policy, db, config, upstream)
    finally:
        db.close()


async def _call(policy: Policy, db: Database, config: ImpConfig, upstream: UpstreamConfig) -> Finding:
    """Issue 38: one reply call through the gateway as ``config``'s imp asks it — its server profile, the box's
    own request builder, a real envelope — judged for use (valid JSON within the cap, a resolvable channel),
    with the time it took and the timing in force. A server that refuses ``json_schema`` is asked again with
    ``json_object``, as the box would."""
    base, imp = upstream.display_url, config.name
    timing = endpoint_timing(config)
    gateway = build_gateway(
        policy=policy, db=db, surface=NoSurface("impyard doctor posts nothing"), clock=SystemClock(), upstream=upstream, surfaces=(),
        owners={imp: config.owners}, settle_abandoned=False,  # a running host's calls are not ours to settle
    )  # fmt: skip
    spec = BoxSpec(imp, OPERATOR_CHANNEL, ImpStore().state_dir(imp), run_id=f"doctor-{uuid.uuid4().hex}")
    limit_s = timing.attempt_timeout_s or MODEL_CALL_TIMEOUT_S  # as long as the imp waits for one attempt
    fell_back = False
    try:
        body = envelope_probe_body(config)
        started = time.monotonic()
        result = await _ask(gateway, spec, body, limit_s)
        if refuses_json_schema(result.status, result.body, body):
            fell_back = True
            body = envelope_probe_body(config, json_object=True)
            started = time.monotonic()
            result = await _ask(gateway, spec, body, limit_s)
    except TimeoutError:
        return slow_finding(config, base, timing, limit_s)
    except RpcError as exc:
        data = exc.data if isinstance(exc.data, dict) else {}
        if data.get("kind") == "timeout":  # the server took the call and was slow (issue 38)
            return slow_finding(config, base, timing, limit_s)
        return Finding(
            "Model endpoint", "fail", f"{config.model.model} at {base}: {exc.message}", _refused_fix(exc, imp)
        )
    finally:
        await gateway.aclose()
    elapsed = time.monotonic() - started
    return endpoint_finding(
        config, base, timing, status=result.status, body=result.body, elapsed_s=elapsed, fell_back=fell_back
    )


async def _ask(
    gateway: Gateway, spec: BoxSpec, body: dict[str, object], limit_s: float
) -> ModelRequestResult:
    """One reply call through the gateway, ended (its connection closed) after ``limit_s``."""
    params = ModelRequestParams.model_validate(
        {"path": "/chat/completions", "body": body, "purpose": "reply", "timeout_s": limit_s}
    )
    with anyio.fail_after(limit_s + MODEL_CALL_GRACE_S):
        result = await gateway.serve(spec, "model.request", params)
    assert isinstance(result, ModelRequestResult)
    return result


# ------------------------------------------------------------------ each imp's embedder (issue 33)


def _embedder_findings(policy: Policy | None, imps: list[ImpConfig], *, skip: bool) -> list[Finding]:
    """Per imp with memory on: the local embedder loads and embeds; a gateway embedding model answers vectors
    of the length its boxes ask for (one tiny metered call per imp, unless ``skip`` or there is no key)."""
    rows: list[Finding] = []
    callable_ = policy is not None and not skip and bool(UpstreamConfig.from_env().api_key)
    for config in imps:
        if not config.memory.enabled:
            continue
        stale = _other_lengths(config)
        if stale is not None:
            rows.append(stale)
        if config.memory.embedder == "hashing":
            continue
        if config.memory.embedder == "local":
            rows.append(_local_embedder_finding(config.name))
            continue
        settings = ImpStore().box_memory(config)
        model, asked = settings.embedding_model, settings.dimensions
        learned = asked != config.memory.dimensions
        if not callable_:
            rows.append(embedding_length_finding(config.name, model, asked, None, EMBEDDING_LENGTH_BOUNDS,
                                                 learned=learned))  # fmt: skip
            continue
        assert policy is not None
        try:
            db = open_database()
        except DatabaseError as exc:
            rows.append(
                Finding(f"Embedder {config.name}", "fail", f"not called: {exc}", "see the State dir row")
            )
            continue
        try:
            rows.append(anyio.run(_embedding_call, policy, db, config, model, asked))
        finally:
            db.close()
    return rows


def _other_lengths(config: ImpConfig) -> Finding | None:
    """Memories the imp's embedder cannot search by meaning (another vector length), if any."""
    settings = ImpStore().box_memory(config)
    try:
        with home_database() as db:
            lengths = vector_lengths(db, config.name)
    except STORAGE_ERRORS:
        return None  # the State dir row says what is wrong with the database
    dims = HASHING_DIMS if settings.embedder == "hashing" else settings.dimensions
    return other_lengths_finding(config.name, settings.embedder, dims, lengths)


def _local_embedder_finding(imp: str) -> Finding:
    started = time.monotonic()
    try:
        vector = LOCAL_EMBEDDER.embed_sync([SAMPLE_EMBED_TEXT])[0]
    except LocalModelMissing as exc:
        return Finding(f"Embedder {imp}", "fail", str(exc), INSTALL_HINT)
    return Finding(
        f"Embedder {imp}", "ok", f"{LOCAL_MODEL} on this host: {vector.size} dimensions, ready in "
        f"{time.monotonic() - started:.1f} s, no network, no cost",
    )  # fmt: skip


SAMPLE_EMBED_TEXT = "doctor"


async def _embedding_call(policy: Policy, db: Database, config: ImpConfig, model: str, asked: int) -> Finding:
    """One embeddings call through the gateway as ``config``'s imp (metered, audited on operator:cli): the
    gateway learns a length the model gives instead of the one asked."""
    imp, item = config.name, f"Embedder {config.name}"
    gateway = build_gateway(
        policy=policy, db=db, surface=NoSurface("impyard doctor posts nothing"), clock=SystemClock(), surfaces=(),
        owners={imp: config.owners}, settle_abandoned=False,
    )  # fmt: skip
    spec = BoxSpec(imp, OPERATOR_CHANNEL, ImpStore().state_dir(imp), run_id=f"doctor-{uuid.uuid4().hex}")
    body = {"model": model, "input": [SAMPLE_EMBED_TEXT], "dimensions": asked}
    params = ModelRequestParams.model_validate({"path": "/embeddings", "body": body, "purpose": "embedding"})
    try:
        with anyio.fail_after(MODEL_CALL_TIMEOUT_S):
            result = await gateway.serve(spec, "model.request", params)
    except TimeoutError:
        return Finding(item, "fail", f"{model}: no answer within {MODEL_CALL_TIMEOUT_S:g} s",
                       "check OPENAI_BASE_URL and that the server is up")  # fmt: skip
    except RpcError as exc:
        return Finding(item, "fail", f"{model}: {exc.message}", _refused_fix(exc, imp))
    finally:
        await gateway.aclose()
    assert isinstance(result, ModelRequestResult)
    if not 200 <= result.status < 300:
        return Finding(item, "fail", f"{model}: HTTP {result.status}: {error_words(result.body)}",
                       http_fix(result.status, model, imp))  # fmt: skip
    got = answered_length(body, UpstreamResponse(result.status, result.body, {}))
    if got is None:
        return Finding(item, "fail", f"{model} answered without a vector (no data[0].embedding)",
                       "use an embedding model, or the host's own: impyard imp set "
                       f"{imp} memory.embedder=local")  # fmt: skip
    return embedding_length_finding(imp, model, asked, got, EMBEDDING_LENGTH_BOUNDS)


def _refused_fix(exc: RpcError, imp: str) -> str:
    data = exc.data if isinstance(exc.data, dict) else {}
    if "ledger" in data:
        return f"raise the limit (impyard budget set {imp} --daily USD) or wait"
    if "rule" in data:
        return f"see the Imp {imp} row (impyard policy check explains the rule)"
    return "check OPENAI_BASE_URL (with its /v1), OPENAI_API_KEY and that the server is up"


# ------------------------------------------------------------------ Docker


def docker_facts() -> DockerFacts:
    """What the Docker engine answers: reachable, able to confine a box, and the box images it holds."""
    from impyard.backends.image import IMAGE_REPO, expected_tag

    backend = DockerBackend(runtime=RuntimeChoice())  # the runtime row reads IMPYARD_BOX_RUNTIME itself
    try:
        client = backend.client()
        version = str(client.version().get("Version", "?"))
    except BoxStartError as exc:
        return DockerFacts(reachable=False, engine_problem=str(exc).rpartition(": ")[0] or str(exc))
    expected = expected_tag()
    problem = None
    try:
        backend.preflight()
    except BoxStartError as exc:
        problem = None if "not built" in str(exc) else str(exc)
    try:
        tags = sorted({tag for image in client.images.list(name=IMAGE_REPO) for tag in image.tags})
        runtimes = tuple(sorted(client.info().get("Runtimes") or {}))
    except Exception as exc:  # the engine answered the ping: a failed listing is its problem, not ours
        return DockerFacts(True, version, f"cannot list images ({type(exc).__name__})", expected)
    return DockerFacts(
        reachable=True, version=version, engine_problem=problem, expected_image=expected,
        image_present=expected in tags, other_images=tuple(tag for tag in tags if tag != expected),
        runtimes=runtimes,
    )  # fmt: skip


def _runtime_finding(facts: DockerFacts, imps: list[ImpConfig]) -> Finding:
    """Each Docker imp's runtime setting (IMPYARD_BOX_RUNTIME over its [box] runtime), as the engine resolves it."""
    try:
        if not imps:  # what a new imp gets
            choices = {"a new imp": runtime_choice()}
        else:
            choices = {c.name: runtime_choice(c.box.runtime) for c in imps if c.box.backend != "process"}
    except BoxStartError as exc:  # a bad IMPYARD_BOX_RUNTIME
        return Finding(
            "Box runtime", "fail", str(exc).split(": ")[0], "set IMPYARD_BOX_RUNTIME to auto, runsc or runc"
        )
    return runtime_finding(facts, choices)


# ------------------------------------------------------------------ Discord


def _discord_findings() -> list[Finding]:
    """Each imp's Discord token: where it is read from and whether it is there (never the token). Only
    Discord needs one: an unset variable is a warning, a configured token file that fails is a failure."""
    findings = []
    for name, config in ImpStore().scan():
        if isinstance(config, ImpError):
            continue  # its Imp row says why
        status = ImpStore().token_status(config)
        detail = f"{status.source}: " + ("set" if status.is_set else "not set")
        if status.is_set and not status.problem:
            findings.append(Finding(f"Discord token ({name})", "ok", detail))
        elif config.discord.token_file:
            findings.append(Finding(f"Discord token ({name})", "fail", detail, status.problem or ""))
        else:
            fix = f"only needed for Discord: export {config.token_env}=…"
            findings.append(Finding(f"Discord token ({name})", "warn", detail, fix))
    return findings
