"""IMPYARD_STATE_ROOT places every box's /state (issue 21): ``<root>/<imp>/state/{channels,tasks}/…``; unset, the
dirs are where they always were; a relative value stops ``supervise`` before anything starts; ``doctor`` shows it;
``box check`` puts its probe's state inside an enforced root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from impyard.cli import cli
from impyard.cli.doctor_rules import DockerFacts
from impyard.imps.store import ImpStore
from impyard.paths import box_dir_name, home


def test_unset_the_boxes_state_stays_under_the_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IMPYARD_STATE_ROOT", raising=False)
    imps = ImpStore()
    assert imps.session_state_dir("pip", "discord:1") == home() / "imps" / "pip" / "state" / "channels" / (
        box_dir_name("discord:1")
    )
    assert imps.task_state_dir("pip", "t1") == home() / "imps" / "pip" / "state" / "tasks" / box_dir_name(
        "t1"
    )
    assert imps.box_state_dir("pip") == imps.state_dir("pip")


def test_set_the_boxes_state_lies_under_the_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IMPYARD_STATE_ROOT", str(tmp_path / "boxes"))
    imps = ImpStore()
    channel = box_dir_name("terminal:main")
    assert imps.session_state_dir(
        "pip", "terminal:main"
    ) == tmp_path / "boxes" / "pip" / "state" / "channels" / (channel)
    assert imps.task_state_dir("pip", "t1") == tmp_path / "boxes" / "pip" / "state" / "tasks" / box_dir_name(
        "t1"
    )
    assert imps.state_dir("pip") == home() / "imps" / "pip" / "state"  # the imp-wide legacy dir does not move


def test_a_relative_root_stops_supervise_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner(env={"IMPYARD_STATE_ROOT": "boxes", "OPENAI_API_KEY": "sk-test"}).invoke(
        cli, ["supervise", "--once"]
    )
    assert result.exit_code != 0
    assert "IMPYARD_STATE_ROOT must be an absolute path (got 'boxes')" in result.output
    assert "Traceback" not in result.output
    assert not (home() / "impyard.db").exists()  # nothing was opened


def test_doctor_shows_the_root_and_fails_a_bad_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def row(env: dict[str, str]) -> dict[str, str]:
        result = CliRunner(env=env).invoke(cli, ["doctor", "--json", "--no-model-call"])
        return next(r for r in json.loads(result.stdout) if r["item"] == "Box state root")

    monkeypatch.setattr(
        "impyard.cli.doctor.docker_facts", lambda: DockerFacts(False, engine_problem="none here")
    )
    good = row({"IMPYARD_STATE_ROOT": str(tmp_path / "boxes")})
    assert good["status"] == "ok" and good["detail"] == f"{tmp_path / 'boxes'} (IMPYARD_STATE_ROOT, enforced)"
    bad = row({"IMPYARD_STATE_ROOT": "boxes"})
    assert bad["status"] == "fail" and "must be an absolute path" in bad["detail"]
    default = row({"IMPYARD_STATE_ROOT": ""})
    assert default["status"] == "ok" and default["detail"].startswith(str(home() / "imps"))


def test_box_check_puts_its_probe_inside_an_enforced_root(tmp_path: Path) -> None:
    root = tmp_path / "boxes"
    result = CliRunner(env={"IMPYARD_STATE_ROOT": str(root)}).invoke(
        cli, ["box", "check", "--backend", "process", "--json"]
    )
    assert "not inside the state root" not in result.output, result.output
    assert json.loads(result.stdout)["backend"] == "process"
    assert root.is_dir() and list(root.iterdir()) == []  # the probe's dir was made inside it, and removed
