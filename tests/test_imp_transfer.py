"""Issue 36: ``impyard imp export`` / ``impyard imp import`` move one imp — settings, persona, memory in every scope,
slot, learned rules, day, lines said, schedules — as one file between homes and databases (SQLite to PostgreSQL
too), all or nothing, and refuse what would mix two imps."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from impyard.cli import cli
from testing.fake_openai import FakeOpenAI
from tests.test_backup import chat

FACT = "Ana's cat Miso once climbed the lighthouse in Bergen."
CHANNEL = "123456789012345678"


def remembered(home: Path, **env: str) -> list[dict[str, object]]:
    """``memory show --json`` without the felt strength, which fades by the second between two reads."""
    views = json.loads(run(home, "memory", "show", "pip", "--json", **env).output)
    return [{key: value for key, value in view.items() if key != "felt"} for view in views]


def run(home: Path, *args: str, **env: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"IMPYARD_HOME": str(home), **env})


def make_pip(fake: FakeOpenAI, home: Path) -> None:
    chat(fake, home, "hello pip")
    assert (
        run(home, "memory", "remember", "pip", FACT, "--valence", "0.5", "--intensity", "0.9").exit_code == 0
    )
    scheduled = run(home, "schedule", "add", "pip", "--every", "1d", "--channel", CHANNEL, "Say good morning")
    assert scheduled.exit_code == 0, scheduled.output


@pytest.mark.slow
@pytest.mark.fake_model(answer="Hello!")
def test_an_imp_moves_to_a_fresh_home_and_remembers(
    fake: FakeOpenAI, impyard_home: Path, tmp_path: Path
) -> None:
    make_pip(fake, impyard_home)
    file = tmp_path / "pip.impyard.gz"
    exported = run(impyard_home, "imp", "export", "pip", str(file))
    assert exported.exit_code == 0, exported.output
    assert "1 schedules" in exported.output and "memories" in exported.output
    header = json.loads(gzip.open(file, "rt").readline())
    assert header["imp"] == "pip" and {"imp.toml", "persona.md"} <= set(header["files"])
    assert not [
        name for name in header["files"] if name.startswith(".")
    ]  # the home's revision mark stays home

    other = tmp_path / "other-home"
    imported = run(other, "imp", "import", str(file))
    assert imported.exit_code == 0, imported.output
    assert (other / "imps" / "pip" / "persona.md").read_text() == (
        impyard_home / "imps" / "pip" / "persona.md"
    ).read_text()
    assert remembered(other) == remembered(impyard_home)
    assert FACT[:30] in run(other, "memory", "show", "pip").output
    assert (
        "pip" in run(other, "imp", "ls").output and (other / "imps/pip/imp.toml").is_file()
    )  # kept by the sync
    assert ".revision" in {p.name for p in (other / "imps/pip").iterdir()}  # published to the new database
    assert "Say good morning" in run(other, "schedule", "ls").output
    fake.requests.clear()
    chat(fake, other, "Do you remember the lighthouse in Bergen?")
    replies = [r for r in fake.requests_for("/chat/completions") if r.purpose == "reply"]
    assert replies and "Miso" in str(replies[-1].body["messages"])  # recalled in the new home
    again = run(other, "imp", "import", str(file))
    assert again.exit_code != 0 and "already exists here" in again.output


@pytest.mark.slow
@pytest.mark.fake_model(answer="Hello!")
def test_an_imp_moves_from_sqlite_to_postgresql(
    fake: FakeOpenAI, impyard_home: Path, tmp_path: Path, migrated_postgres_url: str
) -> None:
    make_pip(fake, impyard_home)
    file = tmp_path / "pip.jsonl"
    assert run(impyard_home, "imp", "export", "pip", str(file)).exit_code == 0
    pg_home = tmp_path / "pg-home"
    imported = run(pg_home, "imp", "import", str(file), IMPYARD_DATABASE_URL=migrated_postgres_url)
    assert imported.exit_code == 0, imported.output
    there = remembered(pg_home, IMPYARD_DATABASE_URL=migrated_postgres_url)
    assert there == remembered(impyard_home) and FACT[:30] in str(there)


@pytest.mark.slow
@pytest.mark.fake_model(answer="Hello!")
def test_an_import_that_would_mix_imps_is_refused_whole(
    fake: FakeOpenAI, impyard_home: Path, tmp_path: Path
) -> None:
    make_pip(fake, impyard_home)
    file = tmp_path / "pip.jsonl"
    assert run(impyard_home, "imp", "export", "pip", str(file)).exit_code == 0
    same_db = run(impyard_home, "imp", "import", str(file), "--as", "pip2")  # the ids are already here
    assert same_db.exit_code != 0 and "impyard memory copy" in same_db.output
    assert not (impyard_home / "imps" / "pip2").exists()
    assert (
        "no memories" in run(impyard_home, "memory", "show", "pip2").output
        or run(impyard_home, "memory", "show", "pip2").exit_code != 0
    )
    lines = file.read_text().splitlines()
    row = json.loads(lines[1])
    row["row"]["imp"] = "someone-else"
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    refused = run(tmp_path / "h2", "imp", "import", str(damaged))
    assert refused.exit_code != 0 and "line 2: a row of another imp" in refused.output
    assert not (tmp_path / "h2" / "imps" / "pip").exists()
    (tmp_path / "cut.jsonl").write_text(file.read_text()[:-40])
    cut = run(tmp_path / "h3", "imp", "import", str(tmp_path / "cut.jsonl"))
    assert cut.exit_code != 0 and "is not JSON" in cut.output
    header = json.loads(lines[0])
    (tmp_path / "future.jsonl").write_text(json.dumps({**header, "version": 99}) + "\n")
    future = run(tmp_path / "h4", "imp", "import", str(tmp_path / "future.jsonl"))
    assert future.exit_code != 0 and "version 99" in future.output


def test_export_of_an_unknown_imp_is_one_line(impyard_home: Path, tmp_path: Path) -> None:
    result = run(impyard_home, "imp", "export", "nobody", str(tmp_path / "x.jsonl"))
    assert result.exit_code != 0 and "nobody" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x.jsonl").exists()
