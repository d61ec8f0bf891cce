"""``impyard imp``: add, list, show and remove imps (``IMPYARD_HOME/imps/<name>/imp.toml``)."""

from __future__ import annotations

import json
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from box.common.model_profiles import model_notes
from box.protocol.models import ModelRequestParams
from impyard.cli.database import open_or_fail
from impyard.cli.doctor_rules import model_uses
from impyard.cli.errors import CliError
from impyard.cli.output import Output, output_options, table_of
from impyard.cli.shared_imps import bring_up_to_date, published_revision, remove_shared, saved_line
from impyard.clock import SystemClock
from impyard.conversation.responder_history import ResponderHistory
from impyard.gateway.judge import judge, model_request_facts
from impyard.gateway.policy import PolicyError, load_policy, operator_policy_dir
from impyard.gateway.prices import PriceMissing, estimate_micros
from impyard.imps.config import (
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    MAX_PERSONA_CHARS,
    ImpConfig,
    ImpConfigError,
    ImpError,
    new_imp_settings,
    validate_name,
)
from impyard.imps.edit import UNSET, apply_settings, parse_assignment
from impyard.imps.render import toml_value
from impyard.imps.shared import SharedImps, materialize, settings_files
from impyard.imps.store import ImpStore, PersonaStatus, TokenStatus
from impyard.imps.validate import parse_config, validate_config
from impyard.memory.store import MemoryStore
from impyard.storage.db import open_database

PERSONA_PREVIEW_LINES = 5
SECTIONS = ("model", "memory", "discord", "box", "sessions")


@click.group("imp")
def imp_group() -> None:
    """Imps: the chat agents impyard runs, one directory each under IMPYARD_HOME/imps.

    \b
    Example:
      impyard imp add pip --persona "You are Pip, a cheerful helper." --owner discord:123456789012345678
      impyard imp set pip model.model=gpt-4.1
      impyard imp show pip
    """


@imp_group.command("add")
@click.argument("name")
@click.option("--persona", "persona_text", metavar="TEXT", help="The persona text (written to persona.md).")
@click.option(
    "--persona-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Copy the persona from this file into persona.md.",
)
@click.option(
    "--model", help="The reply model (default: gpt-5.1); warns when the policy would deny or cannot price it."
)
@click.option("--owner", "owners", multiple=True, metavar="discord:ID", help="An owner (repeatable).")
@click.option(
    "--backend", type=click.Choice(["auto", "docker", "process"]), help="Where its boxes run (default: auto)."
)
def add_command(
    name: str,
    persona_text: str | None,
    persona_file: Path | None,
    model: str | None,
    owners: tuple[str, ...],
    backend: str | None,
) -> None:
    """Create an imp: its directory, a documented imp.toml and persona.md.

    \b
    Every other setting is in imp.toml, each with its default written in as a
    comment; edit it, then check it with `impyard imp show NAME`. A new imp
    remembers ([memory] enabled = true; write false to turn it off). The Discord
    token is never stored: it is read from IMPYARD_DISCORD_TOKEN_<NAME>. A model
    the policy would deny or cannot price is added all the same, with a warning.
    Example:
      impyard imp add pip --persona "You are Pip, a cheerful helper." --model gpt-4.1
    """
    if persona_text is not None and persona_file is not None:
        raise CliError("give --persona or --persona-file, not both")
    if persona_file is not None:
        persona_text = _read_persona_file(persona_file)
    settings: dict[str, Any] = {}
    if owners:
        settings["owners"] = list(owners)
    if model is not None:
        settings["model"] = {"model": model}
    if backend is not None:
        settings["box"] = {"backend": backend}
    store = ImpStore()
    bring_up_to_date(store)  # an imp of that name added on another home is known here first
    try:
        config = store.add(name, persona_text, **new_imp_settings(settings))  # memory on (issue 23)
    except ImpError as exc:
        raise CliError(str(exc)) from exc
    revision = published_revision(store, config.name)
    directory = store.path(config.name)
    token = store.token_status(config)
    click.echo(f"Added imp '{config.name}' in {directory}")
    click.echo(f"  config:  {directory / 'imp.toml'} (every setting documented inside)")
    click.echo(f"  persona: {directory / config.persona_file}")
    click.echo(
        f"  Discord: token from {token.source} ({'set' if token.is_set else 'not set; only needed for Discord'})"
    )
    click.echo(
        f"  shared:  revision {revision} in the database: every host serving from it runs these settings"
    )
    click.echo(f"Check it with: impyard imp show {config.name}")
    _warn(policy_warnings(config))


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def policy_warnings(config: ImpConfig) -> list[str]:
    """Issue 16: the models ``config`` calls that the policy would deny or cannot price, and the models
    impyard has no profile for: one warning per model (the setting is saved; the policy may change next)."""
    try:
        policy = load_policy()
    except PolicyError as exc:
        return [f"the models were not checked: the policy is broken ({exc.problems[0]})"]
    denied: dict[str, list[str]] = {}
    why: dict[str, str] = {}
    unpriced: dict[str, str] = {}
    for use in model_uses(config):
        raw = len(json.dumps(use.body).encode())
        params = ModelRequestParams(path=use.path, body=use.body, purpose=use.purpose)  # type: ignore[arg-type]
        verdict = judge(model_request_facts(config.name, "", params, raw), policy)
        if not verdict.allowed:
            denied.setdefault(use.model, []).append(use.purpose)
            why.setdefault(
                use.model,
                verdict.reason if verdict.matched is None else f"rule {verdict.rule}: {verdict.reason}",
            )
            continue
        price = policy.price(use.model)
        try:
            if price is None:
                raise PriceMissing(f'[prices] has no entry for it: add [prices."{use.model}"]')
            estimate_micros(
                use.path, use.body, raw, price, default_output_tokens=policy.upstream.default_output_tokens
            )
        except PriceMissing as exc:
            unpriced.setdefault(use.model, str(exc))
    where = f"a policy file in {operator_policy_dir()}"
    warnings = [
        f"the policy would deny model {model!r} for {', '.join(purposes)}: {why[model]}; allow it in {where} "
        "(README: Use another model or a local server)"
        for model, purposes in denied.items()
    ]
    warnings += [
        f"the policy cannot price model {model!r}, so its calls would be refused: {reason} in {where} "
        "(USD per million tokens; 0 for your own server, written out)"
        for model, reason in unpriced.items()
    ]
    reply_models = dict.fromkeys(use.model for use in model_uses(config) if use.path != "/embeddings")
    warnings += [note for model in reply_models for note in model_notes(model, config.model.server)]
    return warnings


def _read_persona_file(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read the persona file {path}: {exc.strerror}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"the persona file {path} is not UTF-8 text; save it as UTF-8") from exc
    if len(text) > MAX_PERSONA_CHARS:
        raise CliError(
            f"the persona file {path} has {len(text)} characters; the limit is {MAX_PERSONA_CHARS}"
        )
    return text


@imp_group.command("ls")
@output_options
def ls_command(out: Output) -> None:
    """List the imps, with their model, backend, owners and whether their Discord token is set.

    \b
    An imp whose imp.toml is broken is listed with its error, and the exit
    status is 1. Example:
      impyard imp ls
    """
    store = ImpStore()
    bring_up_to_date(store)
    entries = store.scan()
    rows: list[dict[str, Any]] = []
    for name, item in entries:
        if isinstance(item, ImpError):
            rows.append({"name": name, "path": str(store.root / name), "error": str(item)})
            continue
        token = store.token_status(item)
        rows.append(
            {
                "name": item.name,
                "path": str(store.path(item.name)),
                "model": item.model.model,
                "backend": item.box.backend,
                "sessions": item.sessions.mode,
                "owners": item.owners,
                "discord_token": {"source": token.source, "set": token.is_set},
            }
        )
    out.listing(
        rows,
        columns=("name", "model", "backend", "sessions", "owners", "Discord token"),
        rows=(_imp_row(row) for row in rows),
        empty="No imps yet. Create one with: impyard imp add NAME",
        title=f"Imps in {escape(str(store.root))}",
    )
    broken = [row for row in rows if "error" in row]
    if broken:
        first = broken[0]
        more = f" (and {len(broken) - 1} more broken)" if len(broken) > 1 else ""
        raise CliError(f"imp '{first['name']}' cannot be loaded{more}: {first['error']}")


def _imp_row(row: dict[str, Any]) -> tuple[str, ...]:
    if "error" in row:
        return escape(row["name"]), "[red]broken imp.toml[/]", "", "", "", ""
    token = row["discord_token"]
    return (
        escape(row["name"]),
        escape(row["model"]),
        row["backend"],
        row["sessions"],
        str(len(row["owners"])),
        f"{escape(token['source'])} ({'[green]set[/]' if token['set'] else '[yellow]not set[/]'})",
    )


@imp_group.command("show")
@click.argument("name")
@output_options
def show_command(name: str, out: Output) -> None:
    """Show an imp's settings (defaults included), its persona's first lines and its token source.

    \b
    The Discord token itself is never shown, only where it comes from and
    whether it is set. Exits 1 with the file, line and key when imp.toml is
    broken. Example:
      impyard imp show pip
    """
    store = ImpStore()
    bring_up_to_date(store)
    try:
        config = store.get(name)
        persona = store.persona_status(config)
    except ImpError as exc:
        raise CliError(str(exc)) from exc
    token = store.token_status(config)
    warnings = _warnings(config, persona, token)
    preview = persona.text.splitlines()[:PERSONA_PREVIEW_LINES]
    if out.as_json:
        payload = {
            "name": config.name,
            "path": str(store.path(config.name)),
            "config": config.model_dump(mode="json"),
            "persona": {
                "file": str(persona.path),
                "exists": persona.exists,
                "chars": len(persona.text),
                "preview": preview,
            },
            "discord_token": {"source": token.source, "set": token.is_set, "problem": token.problem},
            "warnings": warnings,
        }
        out.json(payload)
        return
    console = Console()
    console.print(f"[bold]{escape(config.name)}[/]  {escape(str(store.path(config.name)))}", highlight=False)
    console.print(_settings_table(config))
    console.print(
        f"[bold]persona[/] {escape(str(persona.path))} ({len(persona.text)} characters)", highlight=False
    )
    for line in preview:
        console.print(f"  [dim]{escape(line)}[/]", highlight=False)
    if len(persona.text.splitlines()) > PERSONA_PREVIEW_LINES:
        console.print("  [dim]…[/]")
    state = "[green]set[/]" if token.is_set else "[yellow]not set[/]"
    console.print(f"[bold]Discord token[/] from {escape(token.source)}: {state}", highlight=False)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)


def _settings_table(config: ImpConfig) -> Table:
    rows: list[tuple[str, Any, bool]] = [
        (key, getattr(config, key), key in config.model_fields_set)
        for key in ("name", "persona_file", "owners")
    ]
    for section_name in SECTIONS:
        section = getattr(config, section_name)
        for key in type(section).model_fields:
            value = getattr(section, key)
            if (section_name, key) == ("sessions", "turn_ceiling_s"):
                value = config.turn_ceiling_s  # issue 38: unset, the [model] server's own
            rows.append((f"{section_name}.{key}", value, key in section.model_fields_set))
    shown_rows = []
    for key, value, explicit in rows:
        if key == "discord.token_env" and value is None:
            value = config.token_env
        shown = "[dim]unset[/]" if value is None else escape(toml_value(value))
        shown_rows.append((key, shown if explicit else f"{shown} [dim](default)[/]"))
    return table_of(("setting", "value"), shown_rows)


def _warnings(config: ImpConfig, persona: PersonaStatus, token: TokenStatus) -> list[str]:
    warnings = []
    if persona.problem:
        warnings.append(persona.problem)
    elif not persona.text.strip():
        warnings.append(f"the persona file {persona.path} is empty")
    if token.problem and (config.discord.token_file or token.is_set):
        warnings.append(token.problem)  # an unset env token is only a note: terminal-only imps need none
    if config.box.backend == "process":
        warnings.append("box.backend is 'process': its boxes run without any lockdown (development only)")
    if not config.owners:
        warnings.append(
            'no owners: nobody can approve this imp\'s gated acts (add owners = ["discord:<id>"])'
        )
    return warnings


@imp_group.command("rm")
@click.argument("name")
@click.option(
    "--purge", is_flag=True, help="Also delete its state dir and everything it remembers. Cannot be undone."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def rm_command(name: str, purge: bool, yes: bool) -> None:
    """Remove an imp's config and persona; its state and memory are kept unless --purge.

    \b
    A kept state dir is given back when an imp of the same name is added
    again. Example:
      impyard imp rm pip            # asks first; keeps imps/pip/state
      impyard imp rm pip --purge -y # deletes the whole directory and its memory
    """
    store = ImpStore()
    bring_up_to_date(store)
    try:
        directory = store.path(name)
        if not store.config_path(name).is_file():
            store.get(name)  # raises ImpNotFound, listing the imps there are
    except ImpError as exc:
        raise CliError(str(exc)) from exc
    if purge:
        question = (
            f"Remove imp '{name}' and delete {directory} with its state (memory)? This cannot be undone."
        )
    else:
        question = f"Remove imp '{name}' (imp.toml and persona)? Its state in {directory / 'state'} is kept."
    if not yes:
        click.confirm(question, abort=True)
    remove_shared(store, name)  # from every host of the database first (issue 36)
    try:
        kept = store.remove(name, purge=purge)
    except (ImpError, OSError) as exc:
        raise CliError(f"could not remove imp '{name}': {exc}") from exc
    click.echo(f"Removed imp '{name}'.")
    if purge:  # what it remembers lives in the host's database (issue 23), not only in its state dir
        db = open_database()
        try:
            gone = MemoryStore(db, SystemClock().now).forget_imp(name)
            ResponderHistory(db, SystemClock()).forget_imp(name)  # its own history lines (issue 22)
        finally:
            db.close()
        if gone["records"] or gone["conversations"] or gone.get("rules"):
            click.echo(
                f"Forgot its memory: {gone['records']} memories, {gone['episodes']} moments, "
                f"{gone['conversations']} conversations, {gone.get('rules', 0)} learned rules."
            )
    if kept:
        names = ", ".join(path.name + ("/" if path.is_dir() else "") for path in kept)
        click.echo(f"Kept in {directory}: {names} (adding '{name}' again gives its state back)")


# ------------------------------------------------------------------ changing an imp's settings (issue 17)


def _problems_line(exc: ImpConfigError, *, with_file: bool) -> str:
    """A refused config as one line: each problem's key and reason (and file:line when it helps)."""
    shown = [
        str(problem)
        if with_file
        else (f"key '{problem.key}': {problem.reason}" if problem.key else problem.reason)
        for problem in exc.problems
    ]
    return "; ".join(shown)


SHARED_NOTE = "every host serving from this database picks it up for its imp's next boxes (within IMPYARD_IMP_SYNC_S, 10 s)"


@imp_group.command("set")
@click.argument("name")
@click.argument("settings", nargs=-1, required=True, metavar="KEY=VALUE...")
def set_command(name: str, settings: tuple[str, ...]) -> None:
    """Change settings in NAME's imp.toml by their dotted keys; nothing is written if one is wrong.

    \b
    KEY is a key of imp.toml: name, persona_file and owners at the top, the
    others as section.key (model.model, memory.enabled, box.backend …; see
    `impyard imp show NAME`). VALUE is written as TOML (true, 60, 0.7, "text",
    ["a", "b"]); a bare word is text, so a model name needs no quotes. KEY=
    puts a key back to its default. The new settings are validated as imp.toml
    is; the file's comments are kept, except where a key cannot be edited in
    place (then imp.toml is written afresh, every setting documented).
    Examples:
      impyard imp set pip model.model=gpt-4.1
      impyard imp set pip memory.enabled=false sessions.idle_s=120
      impyard imp set pip 'owners=["discord:123456789012345678"]'
      impyard imp set pip model.temperature=
    A model the policy would deny or cannot price is saved all the same, with a
    warning.
    """
    store = ImpStore()
    bring_up_to_date(store)  # the change is made from the database's newest revision
    try:
        assignments = [parse_assignment(argument) for argument in settings]
        text = store.config_text(name)
        file = store.config_path(name)
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise CliError(
                f"{file} is not valid TOML ({exc}); fix it first with: impyard imp edit {name}"
            ) from exc
        new_text, wanted = apply_settings(text, assignments, name)
        try:
            validate_config(wanted, str(file), expected_name=name)
        except ImpConfigError as exc:
            raise CliError(f"nothing was written: {_problems_line(exc, with_file=False)}") from exc
        config = store.replace_config(name, new_text, was=text)
    except ImpConfigError as exc:
        raise CliError(f"nothing was written: {_problems_line(exc, with_file=True)}") from exc
    except ImpError as exc:
        raise CliError(str(exc)) from exc
    for assignment in assignments:
        if assignment.value is UNSET:
            click.echo(f"{config.name}: {assignment.key} is back to its default")
        else:
            click.echo(f"{config.name}: {assignment.key} = {escape(toml_value(assignment.value))}")
    click.echo(saved_line(file, published_revision(store, config.name)))
    if any(assignment.key.startswith(("model.", "memory.")) for assignment in assignments):
        _warn(policy_warnings(config))


@imp_group.command("apply")
@click.option(
    "-f", "--file", "file", required=True, type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="An imp.toml (the imp is the one its `name` says).",
)  # fmt: skip
def apply_command(file: Path) -> None:
    """Make FILE the settings of the imp it names, on every host of this database: created or changed,
    checked first, published as the next revision.

    \b
    For settings kept in version control: `impyard imp apply -f imps/pip.toml`
    after each change. The imp's other files (its persona) are this home's.
    It also settles a conflict in favour of FILE (a home's copy and the
    database both changed; the message names the file to apply).
    Example:
      impyard imp apply -f ~/yard-config/pip.imp.toml
    """
    try:
        data = file.read_bytes()
        if len(data) > MAX_CONFIG_BYTES:
            raise CliError(f"{file} is {len(data)} bytes; an imp.toml may be at most {MAX_CONFIG_BYTES}")
        text = data.decode("utf-8")
        raw = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CliError(f"{file} is not a readable imp.toml: {exc}") from exc
    name = raw.get("name")
    if not isinstance(name, str):
        raise CliError(f'{file} has no `name = "..."`: it must say which imp it is')
    store = ImpStore()
    try:
        validate_name(name)
        parse_config(text, str(file), expected_name=name)
        db = open_or_fail()
        try:
            shared = SharedImps(db)
            row = shared.get(name)
            if store.config_path(name).is_file():
                files = settings_files(store.path(name))
            elif row is not None:
                files = dict(row.files)
            else:
                store.add(name)  # its directory and a starter persona, as `imp add` makes them
                files = settings_files(store.path(name))
            if row is not None and row.files.get(CONFIG_FILE) == text and files == row.files:
                click.echo(f"{name}: already revision {row.revision} in the database; nothing to change")
                materialize(store, row)
                return
            files[CONFIG_FILE] = text
            published = shared.publish(name, files, base=row.revision if row is not None else None)
        finally:
            db.close()
        materialize(store, published)
        config = store.get(name)
    except ImpConfigError as exc:
        raise CliError(f"nothing was written: {_problems_line(exc, with_file=True)}") from exc
    except ImpError as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    click.echo(f"{name}: {file} applied: " + saved_line(store.config_path(name), published.revision))
    _warn(policy_warnings(config))


@imp_group.command("edit")
@click.argument("name")
def edit_command(name: str) -> None:
    """Open NAME's imp.toml in your editor ($VISUAL, else $EDITOR) and check it when you save.

    \b
    The file is changed only when the edited text is a valid imp.toml. When it
    is not, the problems are shown (file, line, key, fix) and you can edit again
    or keep the old file (your edit is then saved to a temporary file).
    Example:
      EDITOR=nano impyard imp edit pip
    """
    store = ImpStore()
    bring_up_to_date(store)
    try:
        original = store.config_text(name)
    except ImpError as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    file = store.config_path(name)
    draft = original
    while True:
        edited = _run_editor(draft, name)
        if edited == original:
            click.echo(f"No changes; {file} is as it was.")
            return
        try:
            store.replace_config(name, edited, was=original)
        except ImpConfigError as exc:
            click.echo(f"{file} would not be valid:", err=True)
            for problem in exc.problems:
                click.echo(f"  {problem}", err=True)
            try:
                again = click.confirm("Edit again?", default=True, err=True)
            except click.Abort:
                again = False
            if again:
                draft = edited
                continue
            raise CliError(
                f"kept the old {file}; your edit is saved in {_save_rejected(edited, name)}"
            ) from exc
        except ImpError as exc:
            raise CliError(f"{exc} (your edit is saved in {_save_rejected(edited, name)})") from exc
        click.echo(saved_line(file, published_revision(store, name)))
        return


def _run_editor(text: str, name: str) -> str:
    """``text`` after the user's editor has had it, in a private temporary file (imp.toml is never
    opened in place: a half-saved file must never be read by a running host)."""
    with tempfile.TemporaryDirectory(prefix="impyard-edit-") as scratch:
        path = Path(scratch) / f"{name}.imp.toml"
        path.write_text(text, encoding="utf-8")
        try:
            click.edit(filename=str(path))
        except click.ClickException as exc:
            raise CliError(
                f"the editor did not finish ({exc.format_message()}); imp.toml is unchanged"
            ) from exc
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read the edited file back ({exc}); imp.toml is unchanged") from exc


def _save_rejected(text: str, name: str) -> Path:
    handle, saved = tempfile.mkstemp(prefix=f"impyard-{name}-", suffix=".imp.toml")
    with open(handle, "w", encoding="utf-8") as out:
        out.write(text)
    return Path(saved)
