"""The same box behaviour on every backend, and the Docker lockdown of a real container under each runtime
(runc, runsc), observed from inside and from outside."""

from __future__ import annotations

import json
import platform
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import docker
import pytest
from click.testing import CliRunner

from impyard.backends import BoxHost, BoxSpec, BoxStartError, RefuseAllHost, RunningBox
from impyard.backends.docker import DockerBackend, DockerLimits, run_argv
from impyard.backends.lockdown import evaluate
from impyard.backends.process import ProcessBackend
from impyard.cli import cli
from impyard.cli.box import probe
from impyard.conversation.spares import SPARE_CHANNEL
from tests.scripted import ScriptedHost, chat_result, deliver_params, envelope, init_params

pytestmark = pytest.mark.anyio


def spec(tmp_path: Path, channel: str = "c1") -> BoxSpec:
    return BoxSpec(imp="pip", channel_id=channel, state_dir=tmp_path / "state")


async def test_the_same_scripted_conversation_on_each_backend(backend: object, tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[chat_result(envelope("hello ann")), chat_result(envelope(None, answer_needed=False))]
    )
    async with backend.open(spec(tmp_path), host) as running:  # type: ignore[attr-defined]
        await running.init(init_params())
        first = await running.deliver(deliver_params("hi pip", "m1"), timeout=30)
        second = await running.deliver(deliver_params("ok", "m2", mode="judge"), timeout=30)
    assert (first.outcome, first.message_ids, second.outcome) == ("sent", ["out-1"], "silent")
    assert [sent.content for sent in host.sent] == ["hello ann"]  # type: ignore[attr-defined]
    assert running.returncode == 0  # box.shutdown, then a clean exit
    assert (tmp_path / "state" / "journal.jsonl").exists()  # the box's files land in its state dir


async def test_cancelling_the_host_leaves_no_box_behind(backend: object, tmp_path: Path) -> None:
    boxes = []
    with anyio.CancelScope() as scope:
        async with backend.open(spec(tmp_path), ScriptedHost(answers=[])) as running:  # type: ignore[attr-defined]
            boxes.append(running)
            await running.init(init_params())
            scope.cancel()  # the host is cancelled while the box is live
            await anyio.sleep_forever()
    assert boxes and boxes[0].exited.is_set()
    if isinstance(backend, DockerBackend):
        assert backend.labelled() == []  # `docker ps` by label is empty


# ------------------------------------------------------------------ Docker only


async def test_lockdown_observed_from_inside_and_outside(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    seen = await probe(docker_backend, tmp_path / "state")
    report, outside = seen.inside, seen.outside
    assert seen.runtime == docker_backend.runtime_choice.setting  # the runtime asked for is the one in force
    assert report["interfaces"] == "lo"
    assert report["can_route_out"] is False
    assert report["root_writable"] is False
    assert report["uid"] != 0
    assert report["cap_eff"] == 0
    assert report["no_new_privs"] == 1  # under gVisor too: asked of its kernel (prctl)
    assert report["state_writable"] is True
    quota = docker_backend.limits.state_quota.max_bytes
    assert (
        report["file_size_limit"] == quota == 256 * 1024**2
    )  # one file never outgrows /state (issue 11 #11)
    # From outside, whatever the runtime: the engine's record and the box's cgroup on the host.
    assert outside is not None and outside["runtime"] == seen.runtime
    assert (outside["pids_limit"], outside["no_new_privs"]) == ("128", 1)
    assert outside["memory_limit"] == outside["memory_swap_limit"] == str(512 * 1024**2)
    checks = evaluate(
        report,
        memory=docker_backend.limits.memory,
        pids_limit=docker_backend.limits.pids_limit,
        state_quota_bytes=quota,
        outside=outside,
        runtime=seen.runtime,
        host_kernel=platform.release(),
    )
    assert [check.name for check in checks if not check.ok] == []
    assert {"runtime", "file size limit"} <= {check.name for check in checks}
    if seen.runtime == "runsc":  # gVisor hides the box's own cgroups: the host confirms the limits
        assert "gVisor" in str(report["kernel_log"])
        assert report["pids_limit"] is None and report["memory_limit"] is None
        limits = {"pids limit", "memory limit", "no swap beyond memory", "cpu quota"}
        assert {check.confirmed_by for check in checks if check.name in limits} == {"outside"}
    else:
        assert str(report["kernel"]).split()[0] == platform.release()
        assert {check.confirmed_by for check in checks} == {"both"} | {"inside"}  # state mount: inside only


FORK_LOOP = """
import os, sys, time
children = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        children += 1
        if children % 8 == 0:
            print(f"forked {children}", file=sys.stderr, flush=True)
except OSError as exc:
    print(f"fork stopped after {children} children: errno {exc.errno}", file=sys.stderr, flush=True)
"""
FORK_TALLY = """
print(f"forked {children}", file=sys.stderr, flush=True)
"""

MEMORY_HOG = """
import sys
hoard = []
while True:
    hoard.append(b"x" * (8 * 1024 * 1024))
    print(f"holding {len(hoard) * 8} MiB", file=sys.stderr, flush=True)
"""


async def _run_to_exit(backend: DockerBackend, tmp_path: Path, script: str) -> tuple[int | None, list[str]]:
    async with backend.open(
        spec(tmp_path, "hostile"), RefuseAllHost(), command=["python3", "-c", script]
    ) as running:
        with anyio.fail_after(60):
            await running.exited.wait()
    return running.returncode, list(running.stderr_tail)


async def test_fork_loop_is_stopped_by_the_pids_limit(docker_backend: DockerBackend, tmp_path: Path) -> None:
    returncode, log = await _run_to_exit(docker_backend, tmp_path, FORK_LOOP + FORK_TALLY)
    forked = [int(line.split()[1]) for line in log if line.startswith("forked")]
    assert forked, log
    assert max(forked) < docker_backend.limits.pids_limit
    if docker_backend.runtime == "runc":  # the box's fork fails; the box lives on
        stopped = [line for line in log if line.startswith("fork stopped")]
        assert stopped, log
        assert returncode == 0
    else:  # runsc: the sandbox's own threads count against the limit on the host, and the whole box dies
        assert returncode != 0 and not any(line.startswith("fork stopped") for line in log)
    # The supervisor is fine: the next box works.
    await test_lockdown_observed_from_inside_and_outside(docker_backend, tmp_path)


async def test_memory_hog_is_killed_by_the_memory_limit(
    test_home_id: str, box_image: str, tmp_path: Path, box_runtime: str
) -> None:
    backend = DockerBackend(box_image, home_id=test_home_id, limits=DockerLimits(memory="96m"))
    assert backend.runtime_choice.setting == box_runtime  # through IMPYARD_BOX_RUNTIME
    returncode, log = await _run_to_exit(backend, tmp_path, MEMORY_HOG)
    assert returncode == 137  # SIGKILL from the OOM killer
    held = max(int(line.split()[1]) for line in log if line.startswith("holding"))
    assert held <= 96
    assert backend.labelled() == []


async def test_labelled_orphans_are_removed_at_start(
    docker_backend: DockerBackend, box_image: str, tmp_path: Path
) -> None:
    # An orphan: a box started like ours whose supervisor vanished.
    docker_backend.client().containers.run(
        box_image, ["300"], entrypoint="sleep", detach=True, labels={
            "org.impyard.box": "1", "org.impyard.home": docker_backend.home_id, "org.impyard.imp": "pip",
            "org.impyard.role": "session",
        }, network_mode="none",
    )  # fmt: skip
    assert len(docker_backend.labelled()) == 1
    assert docker_backend.remove_orphans() == 1
    assert docker_backend.labelled() == []


async def test_a_box_gone_between_listing_and_inspection_is_not_listed(
    docker_backend: DockerBackend, box_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A box that ends between the engine's listing and the inspection of each listed container (a session
    closing, a spare drained, while ``remove_orphans`` or a test lists) is left out, not a NotFound for all."""
    labels = {
        "org.impyard.box": "1", "org.impyard.home": docker_backend.home_id, "org.impyard.imp": "pip",
        "org.impyard.role": "session",
    }  # fmt: skip
    client = docker_backend.client()
    gone, kept = (
        client.containers.run(
            box_image, ["300"], entrypoint="sleep", detach=True, labels=labels, network_mode="none"
        )
        for _ in range(2)
    )
    inspect = docker.models.containers.ContainerCollection.get

    def get(self: docker.models.containers.ContainerCollection, container_id: str) -> object:
        if container_id in (gone.id, gone.name):  # removed by its own host a moment after it was listed
            raise docker.errors.NotFound(f"No such container: {container_id}")
        return inspect(self, container_id)

    monkeypatch.setattr(docker.models.containers.ContainerCollection, "get", get)
    try:
        assert [container.id for container in docker_backend.labelled()] == [kept.id]
    finally:
        monkeypatch.undo()
        gone.remove(force=True)
    assert docker_backend.remove_orphans() == 1 and docker_backend.labelled() == []


async def test_missing_image_fails_closed(test_home_id: str, tmp_path: Path) -> None:
    backend = DockerBackend("impyard-box:does-not-exist", home_id=test_home_id)
    with pytest.raises(BoxStartError, match="impyard box build"):
        async with backend.open(spec(tmp_path), RefuseAllHost()):
            pytest.fail("a box started without its image")


async def test_unreachable_engine_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(BoxStartError, match="not reachable"):
        async with DockerBackend("impyard-box:any", home_id="x").open(spec(tmp_path), RefuseAllHost()):
            pytest.fail("a box started without an engine")


async def test_an_engine_that_cannot_apply_a_limit_fails_closed(
    docker_backend: DockerBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    client = docker_backend.client()
    real_info = client.info
    monkeypatch.setattr(client, "info", lambda: {**real_info(), "SwapLimit": False})
    docker_backend._checked = False
    with pytest.raises(BoxStartError, match="--memory-swap"):
        async with docker_backend.open(spec(tmp_path), RefuseAllHost()):
            pytest.fail("an unconfined box started")


def test_every_lockdown_flag_is_on_the_command_line(tmp_path: Path) -> None:
    argv = run_argv(spec(tmp_path), "img", limits=DockerLimits(), home_id="h", user="10001:10001")
    line = " ".join(argv)
    for flag in (
        "run -i --rm --init", "--network none", "--read-only", "--tmpfs /tmp:", "--cap-drop ALL",
        "--security-opt no-new-privileges", "--pids-limit 128", "--memory 512m", "--memory-swap 512m",
        "--cpus 1", "--user 10001:10001", "--label org.impyard.imp=pip", "--label org.impyard.channel=c1",
        "--label org.impyard.run=",
    ):  # fmt: skip
        assert flag in line, flag
    mounts = [argv[i + 1] for i, arg in enumerate(argv) if arg in ("--mount", "-v", "--volume")]
    assert mounts == [f"type=bind,source={tmp_path / 'state'},target=/state"]  # exactly one rw mount


# ------------------------------------------------------------------ the CLI


def test_box_check_passes_on_docker(box_runtime: str) -> None:
    result = CliRunner().invoke(cli, ["box", "check", "--backend", "docker", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["confined"] is True and shown["runtime"] == shown["outside"]["runtime"] == box_runtime
    assert shown["runtime_setting"] == f"{box_runtime} (IMPYARD_BOX_RUNTIME)"
    # Issue 37: a spare too, as the pool starts it, then claimed; the same lockdown from both sides.
    spare = shown["spare"]
    assert spare["confined"] is True and spare["error"] is None
    started = {row["name"]: row for row in shown["checks"]}
    unclaimed = {row["name"]: row for row in spare["checks"] if row["box"] == "spare (unclaimed)"}
    claimed = {row["name"]: row for row in spare["checks"] if row["box"] == "spare (claimed)"}
    assert set(unclaimed) == set(started) - {"state mount writable"} | {
        "refused before its claim",
        "a fresh /state of its own",
    }
    assert {row["confirmed_by"] for row in unclaimed.values()} == {"outside"}  # it was asked nothing
    assert spare["unclaimed"]["outside"]["runtime"] == spare["claimed"]["outside"]["runtime"] == box_runtime
    # Claimed, the probe ran inside it: each property confirmed by the same sides as the started box's.
    assert set(claimed) == set(started) | {"the channel's /state inside", "/state handed back"}
    assert {name: row["confirmed_by"] for name, row in claimed.items() if name in started} == {
        name: row["confirmed_by"] for name, row in started.items()
    }
    observed = spare["claimed"]["observed"]
    assert observed["uid"] == shown["observed"]["uid"] and observed["kernel"] == shown["observed"]["kernel"]
    assert "box-check-marker" in observed["state_entries"].split(",")  # the channel's /state, handed in
    assert spare["unclaimed"]["state"] == []  # before: a fresh dir of its own


def test_box_check_fails_on_the_process_backend() -> None:
    result = CliRunner().invoke(cli, ["box", "check", "--backend", "process"])
    assert result.exit_code == 1
    assert "lockdown properties missing" in result.output
    assert "no network" in result.output


def test_box_check_checks_a_spare_before_and_after_its_claim_on_the_process_backend() -> None:
    """Issue 37: the spare fails as the started box does (no lockdown: clear, non-zero), and what the process
    backend can show still holds: refused before its claim, a fresh /state, the channel's files in it once
    claimed (the probe ran inside it) and the channel's again once it closed."""
    result = CliRunner().invoke(cli, ["box", "check", "--backend", "process", "--json"])
    assert result.exit_code == 1
    shown = json.loads(result.stdout)
    keys = {"backend", "runtime", "runtime_setting", "observed", "outside", "checks", "confined"}
    assert set(shown) == keys | {"spare"}  # the started box's keys, as scripts read them
    assert shown["confined"] is False and shown["spare"]["confined"] is False
    spare = shown["spare"]
    rows = {(row["box"], row["name"]): row for row in spare["checks"]}
    started = {row["name"]: row["ok"] for row in shown["checks"]}
    seen_outside = set(started) - {"state mount writable"}
    assert {name for box, name in rows if box == "spare (unclaimed)"} == seen_outside | {
        "refused before its claim",
        "a fresh /state of its own",
    }
    assert not any(rows["spare (unclaimed)", name]["ok"] for name in seen_outside)  # nothing to see: missing
    refused = rows["spare (unclaimed)", "refused before its claim"]
    assert (
        refused["ok"]
        and "denied (unbound)" in refused["outside"]
        and "the gateway heard nothing" in refused["outside"]
    )
    assert rows["spare (unclaimed)", "a fresh /state of its own"]["ok"]
    # Claimed: the same probe ran inside it, and the same rules judged it as the started box.
    observed = spare["claimed"]["observed"]
    assert (
        observed["uid"] == shown["observed"]["uid"]
        and observed["interfaces"] == shown["observed"]["interfaces"]
    )
    assert {name: rows["spare (claimed)", name]["ok"] for name in started} == started
    assert rows["spare (claimed)", "the channel's /state inside"]["ok"]
    assert "box-check-marker" in observed["state_entries"].split(",")
    assert rows["spare (claimed)", "/state handed back"]["ok"]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "in the started box" in error and "in the spare (unclaimed) box" in error
    assert "in the spare (claimed) box" in error and "use the Docker backend" in error


def test_a_spare_that_cannot_start_fails_box_check_naming_the_spare(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: a spare the pool could not start is a failed check of the spare box, said in one line; the
    started box's result is shown all the same."""

    class NoSpares(ProcessBackend):
        @asynccontextmanager
        async def open(self, spec: BoxSpec, host: BoxHost) -> AsyncIterator[RunningBox]:
            if spec.channel_id == SPARE_CHANNEL:
                raise BoxStartError("no room for a spare here")
            async with super().open(spec, host) as running:
                yield running

    monkeypatch.setattr("impyard.cli.box.choose_backend", lambda name: NoSpares(warn=False))
    result = CliRunner().invoke(cli, ["box", "check", "--json"])
    assert result.exit_code == 1
    shown = json.loads(result.stdout)
    assert shown["observed"]["uid"] is not None  # the started box ran and is shown
    assert shown["spare"]["confined"] is False
    assert shown["spare"]["error"] == "the spare box did not start: no room for a spare here"
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "; the spare box did not start: no room for a spare here (the process backend)" in error


def test_doctor_names_what_is_missing_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 1  # no model key stops a chat (issue 17)
    assert "OPENAI_API_KEY not set" in result.output and "apt-get install docker.io" in result.output


def test_process_backend_is_selectable_without_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    from impyard.backends.choose import choose_backend

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert isinstance(choose_backend("auto"), ProcessBackend)
    assert isinstance(choose_backend("docker"), DockerBackend)  # explicit docker never falls back
    assert docker.errors  # the SDK is importable: lifecycle goes through it


async def test_a_docker_box_can_use_state_a_process_box_wrote_as_root(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "history.lock").write_text("")  # written by a process box running as the host's user
    (state / "notes").mkdir()
    (state / "evil").symlink_to("/etc/hostname")  # a link planted by a box is not followed
    before = Path("/etc/hostname").stat().st_uid
    host = ScriptedHost()
    async with docker_backend.open(spec(tmp_path), host) as running:
        await running.init(init_params())
        result = await running.deliver(deliver_params(), timeout=30)
    assert result.outcome == "sent", result.error
    assert Path("/etc/hostname").stat().st_uid == before


def test_doctor_reports_each_imps_token_without_showing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from impyard.imps.store import ImpStore

    ImpStore().add("pip")
    ImpStore().add("pix")
    monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", "very-secret-token")
    result = CliRunner().invoke(cli, ["doctor", "--json", "--no-model-call"])
    assert "Discord token (pip)" in result.output and "env IMPYARD_DISCORD_TOKEN_PIP: set" in result.output
    assert "IMPYARD_DISCORD_TOKEN_PIX" in result.output  # the fix names the variable to set
    assert "very-secret-token" not in result.output
