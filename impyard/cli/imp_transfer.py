"""``impyard imp export`` / ``impyard imp import``: one imp, moved between homes or databases as one file
(issue 36; impyard.memory.transfer says what moves)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from impyard.cli.database import open_or_fail
from impyard.cli.errors import CliError
from impyard.cli.shared_imps import bring_up_to_date
from impyard.clock import SystemClock
from impyard.imps.config import CONFIG_FILE, ImpConfigError, ImpError, validate_name
from impyard.imps.shared import SharedImps
from impyard.imps.store import ImpStore
from impyard.imps.validate import parse_config
from impyard.memory.transfer import (
    TransferError,
    imp_files,
    import_rows,
    open_for,
    read_export,
    renamed_config,
    write_export,
)


def _summary(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counts.items() if n) or "nothing remembered yet"


@click.command("export")
@click.argument("name")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
def export_command(name: str, file: Path) -> None:
    """Write imp NAME — its settings, persona, memory in every scope, what it holds in mind, its learned rules,
    its day, the lines it said and its schedules — to FILE (JSON lines; gzip when FILE ends in .gz).

    \b
    The rows are read in one snapshot, so hosts may run meanwhile. FILE must
    not exist. Move it with `impyard imp import` into another home or database.
    Example:
      impyard imp export pip pip.impyard.gz
    """
    store = ImpStore()
    try:
        validate_name(name)
        if not store.config_path(name).is_file():
            store.get(name)  # raises ImpNotFound, listing the imps there are
        files = imp_files(store.path(name))
    except (ImpError, TransferError) as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    if file.exists():
        raise CliError(f"{file} already exists: name a new file (an export never overwrites one)")
    partial = file.with_name(file.name + ".partial")
    db = open_or_fail()
    try:
        with open_for(partial, "w", gz=file.suffix == ".gz") as out:
            counts = write_export(db, name, files, out, SystemClock().now())
        os.replace(partial, file)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise CliError(f"cannot write {file}: {exc.strerror or exc}") from exc
    finally:
        db.close()
    click.echo(f"exported {name} to {file}: {_summary(counts)}; files {', '.join(files)}")


@click.command("import")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option(
    "--as", "as_name", default=None, help="Import under this name (default: the name it was exported as)."
)
def import_command(file: Path, as_name: str | None) -> None:
    """Bring an imp exported with `impyard imp export` into this home and its database: its files, then
    everything it remembered, in one transaction (all of it or nothing).

    \b
    The name must be free here: no imp.toml, no memories, no schedules.
    Example:
      impyard imp import pip.impyard.gz
      impyard imp import pip.impyard.gz --as pip2
    """
    store = ImpStore()
    try:
        with open_for(file, "r") as lines:
            export = read_export(lines)
        name = validate_name(as_name or export.imp)
        files = dict(export.files)
        if CONFIG_FILE not in files:
            raise TransferError("the export holds no imp.toml: it cannot make an imp")
        if name != export.imp:
            files[CONFIG_FILE] = renamed_config(files[CONFIG_FILE], name)
        parse_config(files[CONFIG_FILE], f"{file}:{CONFIG_FILE}", expected_name=name)
    except (TransferError, ImpError, ImpConfigError) as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}") from exc
    target = store.path(name)
    if (target / CONFIG_FILE).exists():
        raise CliError(f"an imp named '{name}' already exists here ({target / CONFIG_FILE}): use --as NAME")
    db = open_or_fail()
    try:
        if (there := SharedImps(db).get(name)) is not None:  # issue 36: another home of this database has it
            raise CliError(
                f"an imp named '{name}' already exists in this database (revision {there.revision}, by "
                f"{there.updated_by}): use --as NAME"
            )
        counts = import_rows(db, export, name)
    except TransferError as exc:
        raise CliError(str(exc)) from exc
    finally:
        db.close()
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    for filename, text in sorted(files.items(), key=lambda item: item[0] == CONFIG_FILE):  # imp.toml last
        if filename.startswith("."):
            continue  # a home's own marks (which revision its copy came from) never move with an imp
        partial = target / f".{filename}.importing"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target / filename)
    bring_up_to_date(store)  # its settings go to the database: every host of it runs the imported imp
    click.echo(
        f"imported {name} from {file} (exported {export.exported_at} by impyard {export.impyard}): {_summary(counts)}"
    )
    if name != export.imp:
        click.echo(
            f"  renamed from {export.imp}; its Discord token setting is unchanged: check `impyard imp show {name}`"
        )


__all__ = ["export_command", "import_command"]
