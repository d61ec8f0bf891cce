"""The state root (issue 21, docs/kubernetes.md): a backend is handed a box's /state as a name under the state
root and mounts nothing else of the host's; ``IMPYARD_STATE_ROOT`` makes the root a fence that refuses a box
before anything is created."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from impyard.backends import BoxSpec, BoxStartError, RefuseAllHost
from impyard.backends.docker import DockerBackend, DockerLimits, docker_argv, run_argv
from impyard.backends.mounts import CLAIMS_DIR
from impyard.backends.plan import STATE_ENV, box_plan
from impyard.backends.process import ProcessBackend
from impyard.backends.stateroot import STATE_ROOT_ENV, StateRoot, StateVolume, state_root
from impyard.imps.store import ImpStore
from tests.scripted import ScriptedHost, init_params

ROOT = Path("/srv/boxes")


@pytest.mark.parametrize(
    ("state_dir", "strict", "root", "name"),
    [
        ("/srv/boxes/pip/state/channels/c1-ab", False, "/srv/boxes", "pip/state/channels/c1-ab"),
        ("/srv/boxes/pip/state/channels/c1-ab", True, "/srv/boxes", "pip/state/channels/c1-ab"),
        ("/tmp/check/state", False, "/tmp/check", "state"),  # outside the default root: a root of its own
        ("/srv/boxes/../boxes/pip/state", False, "/srv/boxes/../boxes/pip", "state"),  # never a name with ..
    ],
)
def test_a_state_dir_is_a_name_under_the_root(state_dir: str, strict: bool, root: str, name: str) -> None:
    volume = StateRoot(ROOT, strict=strict).volume(Path(state_dir))
    assert (volume.root, volume.name) == (Path(root), PurePosixPath(name))
    assert volume.path == (Path(state_dir).resolve() if strict else Path(state_dir))


@pytest.mark.parametrize(
    "state_dir",
    ["/tmp/check/state", "/srv/boxes", "/srv", "/srv/boxes/../elsewhere/state", "/srv/boxes-other/pip"],
)
def test_an_enforced_root_refuses_every_state_dir_not_strictly_inside_it(state_dir: str) -> None:
    with pytest.raises(BoxStartError, match=f"not inside the state root /srv/boxes \\({STATE_ROOT_ENV}\\)"):
        StateRoot(ROOT, strict=True, source=STATE_ROOT_ENV).volume(Path(state_dir))


def test_an_enforced_root_follows_a_link_before_it_judges(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "pip").symlink_to(outside)  # a link under the root that leads out of it
    with pytest.raises(BoxStartError, match="not inside the state root"):
        StateRoot(root, strict=True).volume(root / "pip" / "state")


def test_a_link_in_the_state_dirs_own_place_is_not_followed(tmp_path: Path) -> None:
    """The volume is the link itself, which the backend then refuses to open (test_hostile_docker)."""
    root = tmp_path / "root"
    (root / "pip" / "other").mkdir(parents=True)
    (root / "pip" / "state").symlink_to(root / "pip" / "other")
    volume = StateRoot(root, strict=True).volume(root / "pip" / "state")
    assert volume.path == root / "pip" / "state" and volume.path.is_symlink()


@pytest.mark.parametrize("name", ["/etc", "..", "a/../../b", ""])
def test_a_volume_name_never_leaves_its_root(name: str) -> None:
    with pytest.raises(BoxStartError, match="a name under the state root"):
        StateVolume(ROOT, PurePosixPath(name))


def test_the_setting(tmp_path: Path) -> None:
    assert state_root({}, home=tmp_path) == StateRoot(
        tmp_path / "imps"
    )  # unset: the home's imps, not enforced
    assert state_root({STATE_ROOT_ENV: "  "}, home=tmp_path).strict is False
    chosen = state_root({STATE_ROOT_ENV: "/srv/boxes"})
    assert (chosen.path, chosen.strict, chosen.source) == (ROOT, True, STATE_ROOT_ENV)
    with pytest.raises(BoxStartError, match=f"{STATE_ROOT_ENV} must be an absolute path \\(got 'boxes'\\)"):
        state_root({STATE_ROOT_ENV: "boxes"})


def test_todays_state_dirs_are_names_under_the_default_root() -> None:
    """Unset, nothing moves: every box's /state of a home is already under IMPYARD_HOME/imps."""
    store, root = ImpStore(), state_root()
    for state_dir in (store.session_state_dir("pip", "discord:1"), store.task_state_dir("pip", "t-1")):
        volume = root.volume(state_dir)
        assert volume.root == store.root and volume.path == state_dir
        assert volume.name.parts[:2] == ("pip", "state")


def test_the_docker_box_mounts_its_volume_and_no_other_host_path(tmp_path: Path) -> None:
    spec = BoxSpec("pip", "c1", tmp_path / "elsewhere")  # the spec's own path is not what is mounted
    volume = StateVolume(tmp_path / "root", PurePosixPath("pip/state/channels/c1"))
    argv = run_argv(spec, "img", limits=DockerLimits(), home_id="h", user="10001:10001", state=volume)
    assert [arg for arg in argv if str(tmp_path) in arg] == [
        f"type=bind,source={tmp_path / 'root' / 'pip' / 'state' / 'channels' / 'c1'},target=/state"
    ]
    assert f"{STATE_ENV}=/state" in argv


def test_the_plan_renders_the_same_command_line_as_before(tmp_path: Path) -> None:
    spec = BoxSpec("pip", "discord:1", tmp_path / "state", run_id="r1")
    volume = StateRoot(tmp_path).volume(spec.state_dir)
    plan = box_plan(
        spec, "img", limits=DockerLimits(), home_id="h", user="1:1", state=volume, runtime="runsc"
    )
    assert docker_argv(plan) == run_argv(
        spec, "img", limits=DockerLimits(), home_id="h", user="1:1", runtime="runsc"
    )
    assert dict(plan.labels) == {
        "org.impyard.box": "1", "org.impyard.home": "h", "org.impyard.imp": "pip",
        "org.impyard.channel": "discord:1", "org.impyard.run": "r1", "org.impyard.role": "session",
    }  # fmt: skip


# ------------------------------------------------------------------ the fence, on each backend


@pytest.mark.anyio
async def test_a_process_box_outside_the_enforced_root_is_refused_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATE_ROOT_ENV, str(tmp_path / "root"))
    outside = tmp_path / "state"
    with pytest.raises(BoxStartError, match="not inside the state root"):
        async with ProcessBackend(warn=False).open(BoxSpec("pip", "c1", outside), ScriptedHost()):
            pytest.fail("a box started on a host path outside the state root")
    assert not outside.exists()  # never created
    assert list((tmp_path / "home" / CLAIMS_DIR).glob("*.claim")) == []  # never claimed


@pytest.mark.anyio
async def test_a_process_box_inside_the_enforced_root_starts_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    monkeypatch.setenv(STATE_ROOT_ENV, str(root))
    inside = root / "pip" / "state" / "channels" / "c1"
    async with ProcessBackend(warn=False).open(BoxSpec("pip", "c1", inside), ScriptedHost()) as running:
        await running.init(init_params(), timeout=60)
        assert running.host_pid is not None and running.host_pid == running.process.pid
        environ = (Path("/proc") / str(running.host_pid) / "environ").read_bytes().split(b"\0")
        assert f"{STATE_ENV}={inside}".encode() in environ
    assert inside.is_dir()


@pytest.mark.anyio
async def test_a_bad_setting_starts_no_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STATE_ROOT_ENV, "relative/boxes")
    for backend in (ProcessBackend(warn=False), DockerBackend("impyard-box:any", home_id="x")):
        with pytest.raises(BoxStartError, match=f"{STATE_ROOT_ENV} must be an absolute path"):
            async with backend.open(BoxSpec("pip", "c1", tmp_path / "state"), RefuseAllHost()):
                pytest.fail("a box started under a state root that is no path")


@pytest.mark.anyio
async def test_the_docker_backend_judges_the_state_before_it_asks_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before preflight: an unreachable engine is not even asked."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    backend = DockerBackend(
        "impyard-box:any", home_id="x", state_root=StateRoot(tmp_path / "root", strict=True)
    )
    with pytest.raises(BoxStartError, match="not inside the state root"):
        async with backend.open(BoxSpec("pip", "c1", tmp_path / "state"), RefuseAllHost()):
            pytest.fail("a box started on a host path outside the state root")
    assert not (tmp_path / "state").exists()


@pytest.mark.anyio
async def test_a_docker_box_mounts_its_name_under_the_enforced_root(
    docker_backend: DockerBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    monkeypatch.setenv(STATE_ROOT_ENV, str(root))
    spec = BoxSpec("pip", "c1", root / "pip" / "state" / "channels" / "c1")
    async with docker_backend.open(spec, ScriptedHost()) as running:
        await running.init(init_params(), timeout=60)
        attrs = docker_backend.inspect_box(spec)
        assert running.host_pid is None
    mounts = attrs["HostConfig"]["Mounts"]
    assert [(m["Type"], m["Source"], m["Target"]) for m in mounts] == [
        ("bind", str(spec.state_dir), "/state")
    ]
