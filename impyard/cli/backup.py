"""``impyard backup``: a consistent copy of this home while it serves (issue 36; docs/storage.md "Backing up")."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from impyard.cli.database import open_or_fail
from impyard.cli.errors import CliError
from impyard.gateway.policy import operator_policy_dir, policy_files
from impyard.imps.config import CONFIG_FILE
from impyard.paths import home
from impyard.storage.backup import BackupError, copy_sqlite
from impyard.storage.db import DB_FILENAME


def _copy_imps(source: Path, target: Path) -> list[str]:
    """Each imp's own files — imp.toml, its persona, its news file, what the gateway learned of its embedder: every
    file at the top of its directory — and not its boxes' state (the host keeps everything an imp remembers in the
    database, and a box's /state is rebuilt by the next box)."""
    copied: list[str] = []
    if not source.is_dir():
        return copied
    for imp_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        if not (imp_dir / CONFIG_FILE).is_file():
            continue
        files = sorted(p for p in imp_dir.iterdir() if p.is_file() and not p.is_symlink())
        (target / imp_dir.name).mkdir(parents=True)
        for file in files:
            shutil.copy2(file, target / imp_dir.name / file.name)
        copied.append(imp_dir.name)
    return copied


@click.command("backup")
@click.argument("dest", type=click.Path(path_type=Path, file_okay=False))
def backup_command(dest: Path) -> None:
    """Copy this home into DEST, a new directory that is itself a home: the database (a consistent copy, taken
    while hosts run), each imp's settings and the operator's policies.

    \b
    Each imp's files are the ones at the top of its directory (imp.toml, the
    persona, the news file); a persona_file or news_file kept outside it is
    not copied.
    The copy is the database as it was at one instant: every turn, memory and
    ledger entry committed before it, nothing half-written. To run from it:
    IMPYARD_HOME=DEST impyard chat. A PostgreSQL database is backed up with
    pg_dump instead (docs/storage.md). DEST must not exist yet.
    Example:
      impyard backup ~/impyard-backups/$(date +%F)
    """
    if dest.exists():
        raise CliError(f"{dest} already exists: name a new directory (a backup never writes into an old one)")
    partial = dest.with_name(dest.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    db = open_or_fail()
    try:
        partial.mkdir(parents=True)
        copy = copy_sqlite(db, partial / DB_FILENAME)
        imps = _copy_imps(home() / "imps", partial / "imps")
        policy_dir = operator_policy_dir()
        policies = policy_files(policy_dir) if policy_dir.is_dir() else []
        if policies:
            (partial / "policies").mkdir()
            for file in policies:
                shutil.copy2(file, partial / "policies" / file.name)
        partial.rename(dest)
    except BackupError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise CliError(str(exc)) from exc
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise CliError(
            f"the backup into {dest} failed: {exc.strerror or exc} ({exc.filename or dest})"
        ) from exc
    finally:
        db.close()
    click.echo(f"backed up {home()} to {dest}")
    click.echo(f"  database  {DB_FILENAME}, {copy.bytes / 1_048_576:.1f} MiB, integrity checked")
    click.echo(f"  imps      {', '.join(imps) or 'none'}")
    where = "" if policy_dir.parent == home() else f" (from {policy_dir})"
    click.echo(f"  policies  {', '.join(p.name for p in policies) or 'none'}{where}")
    click.echo(f"run from it: IMPYARD_HOME={dest} impyard chat")
