"""``impyard imp set IMP key=value …`` and ``impyard imp edit IMP`` (issue 17): a change is validated by the
same loader as imp.toml and written whole or not at all; comments in imp.toml survive ``set``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from impyard.cli import cli
from impyard.imps.config import new_imp_settings
from impyard.imps.store import ImpStore

EDITOR_SCRIPT = """
import json, os, sys
from pathlib import Path
# One edit per run, in order: [old, new] replaces text in the file, "fail" exits 3; with TEST_RACE set the
# editor also changes the real imp.toml underneath impyard, as another editor would.
edits = json.loads(os.environ["TEST_EDITS"])
counter = Path(os.environ["TEST_EDIT_COUNTER"])
run = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(run + 1))
edit = edits[min(run, len(edits) - 1)]
path = Path(sys.argv[1])
if edit == "fail":
    sys.exit(3)
if os.environ.get("TEST_RACE"):
    real = Path(os.environ["TEST_RACE"])
    real.write_text(real.read_text() + "# someone else\\n")
text = path.read_text()
path.write_text(text.replace(edit[0], edit[1], 1))
"""


@pytest.fixture
def pip() -> Path:
    """An imp as `impyard imp add` writes it, with comments of the operator's own added."""
    store = ImpStore()
    store.add("pip", **new_imp_settings())
    file = store.config_path("pip")
    text = file.read_text()
    text = text.replace("[model]\n", "# my own note about the model\n[model]\n", 1)
    text = text.replace('name = "pip"', 'name = "pip"  # keep this name', 1)
    text = text.replace("enabled = true", "enabled = true  # it remembers", 1)
    file.write_text(text)
    return file


def run(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
    return CliRunner(env=env).invoke(cli, list(args), input=input)


def config(name: str = "pip") -> dict[str, object]:
    shown = run("imp", "show", name, "--json")
    assert shown.exit_code == 0, shown.output
    settings: dict[str, object] = json.loads(shown.output)["config"]
    return settings


# --- imp set ---------------------------------------------------------------------------------------------


def test_set_changes_dotted_keys_and_keeps_the_comments(pip: Path) -> None:
    before = pip.read_text()
    result = run(
        "imp", "set", "pip", "model.model=gpt-4.1", "memory.enabled=false", "sessions.idle_s=120",
        'owners=["discord:123456789012345678"]', "model.temperature=0.5", "memory.models.appraisal=gpt-4.1-nano",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert 'pip: model.model = "gpt-4.1"' in result.output
    settings = config()
    assert settings["model"]["model"] == "gpt-4.1" and settings["model"]["temperature"] == 0.5  # type: ignore[index]
    assert settings["memory"]["enabled"] is False  # type: ignore[index]
    assert settings["memory"]["models"] == {"appraisal": "gpt-4.1-nano"}  # type: ignore[index]
    assert settings["sessions"]["idle_s"] == 120 and settings["owners"] == ["discord:123456789012345678"]  # type: ignore[index]
    after = pip.read_text()
    assert "# my own note about the model\n[model]\n" in after and 'name = "pip"  # keep this name' in after
    assert "enabled = false  # it remembers" in after  # a changed key keeps its comment
    # every documentation line impyard wrote is still there; only the changed keys' lines differ
    assert [line for line in before.splitlines() if line.startswith("# ") and " = " not in line] == [
        line for line in after.splitlines() if line.startswith("# ") and " = " not in line
    ]
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert len(changed) == 6, changed


def test_a_key_set_back_to_its_default_is_commented_out(pip: Path) -> None:
    assert run("imp", "set", "pip", "model.temperature=0.5", "model.max_tokens=2000").exit_code == 0
    result = run("imp", "set", "pip", "model.temperature=", "model.max_tokens=")
    assert result.exit_code == 0 and "model.temperature is back to its default" in result.output
    settings = config()
    assert settings["model"]["temperature"] is None and settings["model"]["max_tokens"] == 1024  # type: ignore[index]
    assert "# temperature = 0.5" in pip.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["model.max_tokens=0"], "key 'model.max_tokens': must be a whole number from 1 to 128000 (got 0)"),
        (["model.modle=gpt-4.1"], "key 'model.modle': unknown key; did you mean 'model'?"),
        (["modle.model=gpt-4.1"], "key 'modle': unknown key"),
        (["memory.enabled=yes"], "key 'memory.enabled': must be true or false"),
        (["discord.token=abc.def"], "secrets never go in imp.toml"),
        (["name=bob"], 'must be "pip", the directory\'s name'),
        (
            ["sessions.turn_ceiling_s=600", "sessions.session_ceiling_s=300"],
            "must be at least turn_ceiling_s",
        ),
        (["model.model=gpt-4.1", "box.backend=podman"], "key 'box.backend'"),  # one bad key: nothing written
        (["model.model"], "is not KEY=VALUE"),
        (["=x"], "is not KEY=VALUE"),
        (["model..model=x"], "is not KEY=VALUE"),
        (["persona_file=../../etc/passwd"], "must stay inside the imp's directory"),
    ],
)
def test_an_invalid_setting_writes_nothing(pip: Path, args: list[str], message: str) -> None:
    before = pip.read_bytes()
    result = run("imp", "set", "pip", *args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], result.output
    assert str(pip) not in result.output  # the key is named, not a line of a file that was never written
    assert "abc.def" not in result.output  # a value under a secret key is never echoed
    assert pip.read_bytes() == before


def test_set_refuses_an_unknown_imp_and_a_file_that_is_not_toml(pip: Path) -> None:
    unknown = run("imp", "set", "pix", "model.model=x")
    assert unknown.exit_code == 1 and "no imp named 'pix' (imps here: pip)" in unknown.output
    pip.write_text(pip.read_text() + "\n[model\n")
    broken = pip.read_bytes()
    result = run("imp", "set", "pip", "model.model=gpt-4.1")
    assert result.exit_code == 1 and "impyard imp edit pip" in result.output and pip.read_bytes() == broken


def test_a_file_set_cannot_edit_in_place_is_written_afresh(impyard_home: Path) -> None:
    ImpStore().add("pip")
    file = ImpStore().config_path("pip")
    file.write_text('name = "pip"\nmodel = { model = "gpt-4o", max_tokens = 500 }\n')  # an inline table
    result = run("imp", "set", "pip", "model.model=gpt-4.1")
    assert result.exit_code == 0, result.output
    settings = config()
    assert settings["model"]["model"] == "gpt-4.1" and settings["model"]["max_tokens"] == 500  # type: ignore[index]
    assert "[model]" in file.read_text()


def test_a_value_is_toml_or_else_text(pip: Path) -> None:
    assert run("imp", "set", "pip", 'model.model="gpt-4o"', "sessions.queue_limit=7").exit_code == 0
    settings = config()
    assert settings["model"]["model"] == "gpt-4o" and settings["sessions"]["queue_limit"] == 7  # type: ignore[index]
    quoted = run("imp", "set", "pip", 'sessions.failure_notice="60"')
    assert quoted.exit_code == 0 and config()["sessions"]["failure_notice"] == "60"  # type: ignore[index]


# --- imp edit --------------------------------------------------------------------------------------------


def edit(tmp_path: Path, edits: list[object], input: str | None = None, race: Path | None = None) -> Result:
    script = tmp_path / "editor.py"
    script.write_text(EDITOR_SCRIPT)
    env = {
        "EDITOR": f'"{sys.executable}" "{script}"', "VISUAL": "", "TEST_EDITS": json.dumps(edits),
        "TEST_EDIT_COUNTER": str(tmp_path / "runs"), "TEST_RACE": str(race) if race else "",
    }  # fmt: skip
    return run("imp", "edit", "pip", env=env, input=input)


def editor_runs(tmp_path: Path) -> int:
    counter = tmp_path / "runs"
    return int(counter.read_text()) if counter.exists() else 0


def test_edit_saves_a_valid_edit(tmp_path: Path, pip: Path) -> None:
    result = edit(tmp_path, [['# model = "gpt-5.1"', 'model = "gpt-4o"']])
    assert result.exit_code == 0 and f"Saved {pip}" in result.output, result.output
    assert config()["model"]["model"] == "gpt-4o" and "# my own note" in pip.read_text()  # type: ignore[index]


def test_an_invalid_edit_shows_the_problem_and_can_be_edited_again(tmp_path: Path, pip: Path) -> None:
    bad = ["# idle_s = 60.0", 'idle_s = "soon"']
    fixed = ['idle_s = "soon"', "idle_s = 90.0"]
    result = edit(tmp_path, [bad, fixed], input="y\n")
    assert result.exit_code == 0, result.output
    assert (
        f"{pip}:" in result.output and "key 'sessions.idle_s': must be a number of seconds" in result.output
    )
    assert "Edit again?" in result.output and editor_runs(tmp_path) == 2
    assert config()["sessions"]["idle_s"] == 90.0  # type: ignore[index]


def test_an_invalid_edit_not_edited_again_keeps_the_old_file(tmp_path: Path, pip: Path) -> None:
    before = pip.read_bytes()
    result = edit(tmp_path, [["# idle_s = 60.0", 'idle_s = "soon"']], input="n\n")
    assert result.exit_code == 1 and pip.read_bytes() == before
    saved = Path(result.output.rsplit("your edit is saved in ", 1)[1].strip())
    assert 'idle_s = "soon"' in saved.read_text()
    os.unlink(saved)


@pytest.mark.parametrize(
    ("edits", "code", "message"),
    [(["fail"], 1, "the editor did not finish"), ([["nothing-matches", "x"]], 0, "No changes;")],
)
def test_edit_writes_nothing_when_the_editor_fails_or_changes_nothing(
    tmp_path: Path, pip: Path, edits: list[object], code: int, message: str
) -> None:
    before = pip.read_bytes()
    result = edit(tmp_path, edits)
    assert result.exit_code == code and message in result.output and pip.read_bytes() == before, result.output


def test_edit_writes_nothing_over_a_change_made_meanwhile(tmp_path: Path, pip: Path) -> None:
    result = edit(tmp_path, [["# max_tokens = 1024", "max_tokens = 2000"]], race=pip)
    assert result.exit_code == 1 and "changed while it was being edited; nothing was written" in result.output
    assert pip.read_text().endswith("# someone else\n") and "max_tokens = 2000" not in pip.read_text()
    saved = Path(result.output.rsplit("your edit is saved in ", 1)[1].strip().rstrip(")"))
    assert "max_tokens = 2000" in saved.read_text()
    os.unlink(saved)
