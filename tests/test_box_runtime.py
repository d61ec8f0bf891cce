"""The box's OCI runtime (issue 22): runsc (gVisor) wherever the engine has it, runc on request; never a box
under a runtime nobody asked for, and none at all when runsc is asked for but missing. ``box check`` verifies
the lockdown under each runtime and fails under each when a limit is really absent."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from impyard.backends import BoxSpec, BoxStartError, RefuseAllHost
from impyard.backends import docker as docker_module
from impyard.backends.choose import choose_backend
from impyard.backends.docker import DockerBackend, DockerLimits, run_argv
from impyard.backends.runtimes import (
    RUNSC_ARGS,
    RUNTIME_ENV,
    RuntimeChoice,
    daemon_json,
    resolve_runtime,
    runtime_choice,
)
from impyard.cli import cli
from impyard.cli.doctor_rules import DockerFacts, runtime_finding
from impyard.conversation.spares import SPARE_CHANNEL
from impyard.imps.store import ImpStore
from impyard.runtime import backends_for
from tests.conftest import docker_backend_for
from tests.scripted import ScriptedHost, init_params

BOTH = {"runc", "runsc", "io.containerd.runc.v2"}
RUNC_ONLY = {"runc", "io.containerd.runc.v2"}

# ------------------------------------------------------------------ the rule (pure)


@pytest.mark.parametrize(
    ("setting", "registered", "runtime"),
    [
        ("auto", BOTH, "runsc"),  # gVisor wherever the engine has it
        ("auto", RUNC_ONLY, "runc"),  # else the host's kernel
        ("runc", BOTH, "runc"),  # on request
        ("runsc", BOTH, "runsc"),
    ],
)
def test_the_runtime_follows_the_setting_and_the_engine(
    setting: str, registered: set[str], runtime: str
) -> None:
    assert resolve_runtime(RuntimeChoice(setting, "[box] runtime"), registered) == runtime  # type: ignore[arg-type]


def test_runsc_asked_for_but_not_registered_is_refused_with_the_daemon_json_lines() -> None:
    with pytest.raises(BoxStartError) as refused:
        resolve_runtime(RuntimeChoice("runsc", RUNTIME_ENV), RUNC_ONLY)
    message = str(refused.value)
    assert RUNTIME_ENV in message and "/etc/docker/daemon.json" in message and "kill -HUP" in message
    lines = json.loads(daemon_json("/usr/bin/runsc"))
    assert lines == {"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": list(RUNSC_ARGS)}}}
    assert json.dumps(lines["runtimes"]["runsc"]["runtimeArgs"]) in message
    assert "\n" not in message  # one line


@pytest.mark.parametrize(
    ("environ", "configured", "choice"),
    [
        ({}, "auto", RuntimeChoice("auto", "the default")),
        ({}, "runc", RuntimeChoice("runc", "[box] runtime")),
        ({RUNTIME_ENV: "runc"}, "runsc", RuntimeChoice("runc", RUNTIME_ENV)),  # the operator's override wins
        ({RUNTIME_ENV: " runsc "}, "auto", RuntimeChoice("runsc", RUNTIME_ENV)),
        ({RUNTIME_ENV: ""}, "runc", RuntimeChoice("runc", "[box] runtime")),  # empty: not set
    ],
)
def test_the_environment_overrides_the_imps_setting(
    environ: dict[str, str], configured: str, choice: RuntimeChoice
) -> None:
    assert runtime_choice(configured, environ) == choice


def test_a_bad_environment_value_is_one_line_naming_the_variable() -> None:
    with pytest.raises(
        BoxStartError, match=rf"^{RUNTIME_ENV} must be one of auto, runsc, runc \(got 'gvisor'\)"
    ):
        runtime_choice("auto", {RUNTIME_ENV: "gvisor"})


def test_the_runtime_is_on_the_command_line(tmp_path: Path) -> None:
    spec = BoxSpec("pip", "c1", tmp_path / "state")
    argv = run_argv(spec, "img", limits=DockerLimits(), home_id="h", user="1:1", runtime="runsc")
    assert argv[argv.index("--runtime") + 1] == "runsc"
    assert argv.index("--runtime") < argv.index("img")  # a docker option, not the box's argument


def test_the_imp_setting_reaches_its_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    ImpStore().add("pip", box={"runtime": "runc"})
    ImpStore().add("pix")
    chosen = backends_for([ImpStore().get("pip"), ImpStore().get("pix")], override="docker")
    pip, pix = chosen["pip"], chosen["pix"]
    assert isinstance(pip, DockerBackend) and isinstance(pix, DockerBackend)
    assert (pip.runtime_choice, pix.runtime_choice) == (
        RuntimeChoice("runc", "[box] runtime"),
        RuntimeChoice("auto", "the default"),
    )
    monkeypatch.setenv(RUNTIME_ENV, "runsc")
    overridden = choose_backend("docker", runtime=ImpStore().get("pip").box.runtime)
    assert isinstance(overridden, DockerBackend)
    assert overridden.runtime_choice == RuntimeChoice("runsc", RUNTIME_ENV)


def test_imp_toml_refuses_an_unknown_runtime() -> None:
    ImpStore().add("pip")
    result = CliRunner().invoke(cli, ["imp", "set", "pip", "box.runtime=gvisor"])
    assert result.exit_code == 1 and 'one of "auto", "runsc", "runc"' in result.output


# ------------------------------------------------------------------ doctor names it


@pytest.mark.parametrize(
    ("runtimes", "choices", "status", "detail", "fix"),
    [
        (("runc", "runsc"), {"pip": "auto"}, "ok", "runsc (gVisor, a user-space kernel) for pip", ""),
        (
            ("runc",),
            {"pip": "auto"},
            "ok",
            "runc (the host's kernel) for pip; gVisor (runsc) is not",
            "daemon.json",
        ),
        (
            ("runc", "runsc"),
            {"pip": "runc", "pix": "auto"},
            "ok",
            "runc (the host's kernel) for pip; runsc",
            "",
        ),
        (
            ("runc",),
            {"pip": "runsc", "pix": "auto"},
            "fail",
            "pip: the box runtime runsc (gVisor)",
            "daemon.json",
        ),
        ((), {"pip": "auto"}, "warn", "not checked", "start dockerd"),
        (("runc",), {}, "ok", "no imp runs Docker boxes", ""),
    ],
)
def test_doctor_names_the_runtime(
    runtimes: tuple[str, ...], choices: dict[str, str], status: str, detail: str, fix: str
) -> None:
    facts = DockerFacts(reachable=bool(runtimes), version="20", runtimes=runtimes)
    made = {imp: RuntimeChoice(setting, "[box] runtime") for imp, setting in choices.items()}  # type: ignore[arg-type]
    finding = runtime_finding(facts, made)
    assert (finding.item, finding.status) == ("Box runtime", status)
    assert detail in finding.detail
    assert fix in finding.fix if fix else finding.fix == ""


# ------------------------------------------------------------------ real boxes


def _without_runsc(backend: DockerBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine as one that never had gVisor registered."""
    client = backend.client()
    real_info = client.info
    monkeypatch.setattr(client, "info", lambda: {**real_info(), "Runtimes": {"runc": {"path": "runc"}}})


@pytest.mark.anyio
@pytest.mark.docker  # docker_backend_for: the marker cannot see it (tests/conftest.py)
async def test_no_box_starts_when_runsc_is_asked_for_but_missing(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    backend = docker_backend_for(request, "runc")
    backend.runtime_choice = RuntimeChoice("runsc", "[box] runtime")
    _without_runsc(backend, monkeypatch)
    started: list[object] = []

    def run_argv_seen(*args: object, **kwargs: object) -> list[str]:
        started.append(args)
        return ["false"]

    monkeypatch.setattr(docker_module, "run_argv", run_argv_seen)
    with pytest.raises(BoxStartError, match=r"runsc \(gVisor\) is asked for by \[box\] runtime.*runtimeArgs"):
        async with backend.open(BoxSpec("pip", "c1", tmp_path / "state"), RefuseAllHost()):
            pytest.fail("a box started without the runtime it was asked to run under")
    assert started == [] and backend.labelled() == []


@pytest.mark.anyio
@pytest.mark.docker  # docker_backend_for: the marker cannot see it (tests/conftest.py)
async def test_auto_falls_back_to_runc_only_where_runsc_is_missing(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = docker_backend_for(request, "runc")
    backend.runtime_choice = RuntimeChoice()
    _without_runsc(backend, monkeypatch)
    assert backend.runtime == "runc"


def test_box_check_refuses_runsc_where_it_is_not_registered(
    box_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_info = docker_module.docker.DockerClient.info
    monkeypatch.setattr(
        docker_module.docker.DockerClient,
        "info",
        lambda self: {**real_info(self), "Runtimes": {"runc": {"path": "runc"}}},
    )
    result = CliRunner().invoke(cli, ["box", "check", "--runtime", "runsc"])
    assert result.exit_code == 1
    assert "the box did not start" in result.output and '"runtimeArgs"' in result.output


@pytest.mark.anyio
async def test_a_box_runs_under_the_runtime_asked_for_and_says_so(
    docker_backend: DockerBackend, box_runtime: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = BoxSpec("pip", "c1", tmp_path / "state")
    with caplog.at_level(logging.INFO, logger="impyard.box"):
        async with docker_backend.open(spec, ScriptedHost()) as running:
            await running.init(init_params())
            attrs = docker_backend.inspect_box(spec)
    assert attrs["HostConfig"]["Runtime"] == box_runtime
    started = [record.getMessage() for record in caplog.records if "starting" in record.getMessage()]
    assert len(started) == 1 and f"under runtime {box_runtime} (" in started[0], started


def test_auto_runs_runsc_where_the_engine_has_it(request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("use_runsc")
    assert DockerBackend(runtime=RuntimeChoice()).runtime == "runsc"


@pytest.fixture
def use_runsc(request: pytest.FixtureRequest) -> None:
    problem = request.getfixturevalue("runtime_problems")("runsc")
    if problem is not None:
        pytest.skip(problem)


# ------------------------------------------------------------------ box check fails when a limit is absent

# The flags a test removes from the real `docker run` line, and the check that must then fail.
REMOVED = [
    (("--pids-limit",), "pids limit"),
    (("--cpus",), "cpu quota"),
    (("--memory-swap",), "no swap beyond memory"),
    (("--security-opt",), "no new privileges"),
]


@pytest.mark.parametrize(("flags", "check"), REMOVED, ids=[check for _flags, check in REMOVED])
def test_box_check_fails_when_a_limit_is_really_absent(
    box_runtime: str, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], check: str
) -> None:
    real_run_argv = docker_module.run_argv

    def without(*args: object, **kwargs: object) -> list[str]:
        argv = real_run_argv(*args, **kwargs)  # type: ignore[arg-type]
        for flag in flags:
            at = argv.index(flag)
            del argv[at : at + 2]  # the flag and its value
        return argv

    monkeypatch.setattr(docker_module, "run_argv", without)
    result = CliRunner().invoke(cli, ["box", "check", "--json", "--no-spare"])  # the started box: enough here
    assert result.exit_code == 1, result.output
    shown = json.loads(result.stdout)
    assert shown["runtime"] == box_runtime and shown["confined"] is False and shown["spare"] is None
    failed = {row["name"] for row in shown["checks"] if not row["ok"]}
    assert check in failed, shown["checks"]


def test_box_check_fails_when_only_the_spare_lacks_a_limit(
    box_runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: box check starts a spare as the pool does (through the same `docker run` line) and checks it
    unclaimed and claimed: a limit missing from the spare alone fails the check, and the error names the spare."""
    real_run_argv = docker_module.run_argv

    def spare_without_pids_limit(spec: BoxSpec, *args: object, **kwargs: object) -> list[str]:
        argv = real_run_argv(spec, *args, **kwargs)  # type: ignore[arg-type]
        if spec.channel_id == SPARE_CHANNEL:  # a spare's box only: the started box keeps it
            at = argv.index("--pids-limit")
            del argv[at : at + 2]
        return argv

    monkeypatch.setattr(docker_module, "run_argv", spare_without_pids_limit)
    result = CliRunner().invoke(cli, ["box", "check", "--json"])
    assert result.exit_code == 1, result.output
    shown = json.loads(result.stdout)
    assert shown["confined"] is True and shown["spare"]["confined"] is False  # the started box is whole
    failed = {(row["box"], row["name"]) for row in shown["spare"]["checks"] if not row["ok"]}
    assert failed == {("spare (unclaimed)", "pids limit"), ("spare (claimed)", "pids limit")}
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "in the spare (unclaimed) box (pids limit)" in error and "started box" not in error
