"""Issue 36: ``impyard backup`` copies a home while it is written to — the database as of one instant, each imp's
settings, the policies — and the copy is a home an imp runs from, remembering what it remembered."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from impyard.cli import cli
from impyard.clock import SystemClock
from impyard.gateway.audit import AuditLog, AuditRecord
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI
from tests.test_chat_terminal import chat_once as chat

FACT = "My sister Maja sailed with me to Oslo last summer."


def test_a_backup_taken_while_writers_commit_holds_whole_transactions(
    impyard_home: Path, tmp_path: Path
) -> None:
    db = open_database()
    log = AuditLog(db, SystemClock(), secrets=())
    stop = threading.Event()
    written = [0]

    def writer() -> None:  # each transaction writes two rows with one tag: a copy has both or neither
        while not stop.is_set():
            tag = f"pair-{written[0]}"
            db.write(
                lambda conn, tag=tag: [
                    log.write(AuditRecord(imp="pip", method="m", detail=tag), conn) for _ in range(2)
                ]
            )
            written[0] += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while written[0] < 50:
            threading.Event().wait(0.01)
        result = CliRunner().invoke(cli, ["backup", str(tmp_path / "copy")])
        at_copy = written[0]
    finally:
        stop.set()
        thread.join()
        db.close()
    assert result.exit_code == 0, result.output
    assert "integrity checked" in result.output
    copy = sqlite3.connect(tmp_path / "copy" / "impyard.db")
    counts = copy.execute("SELECT detail, count(*) FROM audit GROUP BY detail").fetchall()
    copy.close()
    assert counts and all(n == 2 for _tag, n in counts)  # no transaction half in the copy
    assert 50 <= len(counts) <= at_copy + 1
    assert not (tmp_path / "copy" / "impyard.db-wal").exists()  # one self-contained file


def test_a_backup_never_overwrites_and_says_so(impyard_home: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    result = CliRunner().invoke(cli, ["backup", str(tmp_path / "taken")])
    assert result.exit_code != 0 and "already exists" in result.output
    assert list((tmp_path / "taken").iterdir()) == []


def test_a_postgresql_database_is_pointed_at_pg_dump(
    impyard_home: Path, tmp_path: Path, migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMPYARD_DATABASE_URL", migrated_postgres_url)
    result = CliRunner().invoke(cli, ["backup", str(tmp_path / "copy")])
    assert result.exit_code != 0 and "pg_dump" in result.output
    assert not (tmp_path / "copy").exists() and not (tmp_path / "copy.partial").exists()


@pytest.mark.slow
@pytest.mark.fake_model(answer="Hello!")
def test_a_restored_home_runs_an_imp_that_remembers(
    fake: FakeOpenAI, impyard_home: Path, tmp_path: Path
) -> None:
    chat(fake, impyard_home, "hello pip")  # a fresh home: the chat makes pip
    remembered = CliRunner().invoke(
        cli, ["memory", "remember", "pip", FACT, "--valence", "0.6", "--intensity", "0.8"]
    )
    assert remembered.exit_code == 0, remembered.output
    (impyard_home / "policies").mkdir(exist_ok=True)
    (impyard_home / "policies" / "local.toml").write_text("# the operator's own rules\n")
    restored = tmp_path / "restored"
    result = CliRunner().invoke(cli, ["backup", str(restored)])
    assert result.exit_code == 0, result.output
    assert (restored / "imps" / "pip" / "imp.toml").read_bytes() == (
        impyard_home / "imps" / "pip" / "imp.toml"
    ).read_bytes()
    assert (restored / "imps" / "pip" / "persona.md").read_bytes() == (
        impyard_home / "imps" / "pip" / "persona.md"
    ).read_bytes()
    assert not (restored / "imps" / "pip" / "state").exists()
    assert (restored / "policies" / "local.toml").exists()
    shown = CliRunner().invoke(cli, ["memory", "show", "pip"], env={"IMPYARD_HOME": str(restored)})
    assert "Maja" in shown.output
    fake.requests.clear()
    chat(fake, restored, "Do you remember who sailed to Oslo with me?")
    replies = [r for r in fake.requests_for("/chat/completions") if r.purpose == "reply"]
    assert replies and "Maja" in str(replies[-1].body["messages"])  # recalled from the restored database
