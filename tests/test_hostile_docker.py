"""A hostile box on the real Docker backend: its state dir (issue 11 #2 and #11).

The attacks run as programs inside real boxes (``--entrypoint`` replaced); the host code under test
is the Docker backend's own preparation of the state dir and its quota watch.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from impyard.backends import BoxSpec, BoxStartError
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.statedir import FOREIGN_WRITER_MARK, StateQuota, measure_state_dir, prepare_state_dir
from tests.scripted import ScriptedHost

pytestmark = pytest.mark.anyio

BOX_USER = "10001:10001"

# Swaps /state/d (a directory full of files) with /state/l (a symlink to a host directory) as fast as it
# can, atomically, the way renameat2(RENAME_EXCHANGE) lets any box do it.
SWAPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/state/d", exist_ok=True)
for n in range(int(sys.argv[2])):
    open(f"/state/d/f{n}", "w").close()
os.symlink(sys.argv[1], "/state/l")
open("/state/ready", "w").close()
while True:
    libc.renameat2(-100, b"/state/d", -100, b"/state/l", 2)
"""

FILLER = r"""
import os, sys, time
what = sys.argv[1]
if what == "bytes":
    for n in range(64):
        with open(f"/state/blob{n}", "wb") as fh:
            fh.write(os.urandom(1024 * 1024))
elif what == "files":
    for n in range(5000):
        open(f"/state/e{n}", "w").close()
elif what == "one-big-file":
    try:
        with open("/state/big", "wb") as fh:
            for _ in range(64):
                fh.write(b"\0" * (1024 * 1024))
                fh.flush()
    except OSError as exc:
        open("/state/refused", "w").write(str(exc.errno))
time.sleep(120)
"""


@pytest.fixture
def root_only() -> None:
    if os.getuid() != 0:
        pytest.skip("ownership changes need a root host")


async def test_a_box_swapping_a_dir_for_a_symlink_never_gets_host_files_chowned(
    tmp_path: Path, docker_backend: DockerBackend, root_only: None
) -> None:
    files = 300
    host_dir = tmp_path / "host-secrets"
    host_dir.mkdir()
    for n in range(files):
        (host_dir / f"f{n}").write_text("root's")
    state = tmp_path / "imp" / "state"
    attacker = ["python3", "-c", SWAPPER, str(host_dir), str(files)]
    async with docker_backend.open(BoxSpec("pip", "c1", state), ScriptedHost(), command=attacker) as running:
        with anyio.fail_after(30):
            while not (state / "ready").exists():
                await anyio.sleep(0.05)
        for _ in range(40):  # every start of a sibling box prepares the same state dir, under the race
            (state.parent / FOREIGN_WRITER_MARK).touch()  # and forces the one-time repair walk each time
            await anyio.to_thread.run_sync(docker_backend.prepare_state_dir, state, BOX_USER)
        assert not running.exited.is_set()  # the attack ran all along
    owners = {(host_dir / f"f{n}").stat().st_uid for n in range(files)}
    assert owners == {0} and host_dir.stat().st_uid == 0


def test_the_state_dir_itself_is_never_followed_when_it_is_a_link(tmp_path: Path, root_only: None) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "imp").mkdir()
    (tmp_path / "imp" / "state").symlink_to(target)
    with pytest.raises(OSError):
        prepare_state_dir(tmp_path / "imp" / "state", 10001, 10001)
    with pytest.raises(
        BoxStartError, match="cannot be prepared"
    ):  # the backend refuses the start in one line
        DockerBackend(image="unused").prepare_state_dir(tmp_path / "imp" / "state", BOX_USER)
    assert target.stat().st_uid == 0


def test_the_one_time_repair_gives_root_written_files_to_the_box_user_then_stops(
    tmp_path: Path, root_only: None
) -> None:
    state = tmp_path / "imp" / "state"
    (state / "sub").mkdir(parents=True)
    (state / "sub" / "history.json").write_text("{}")
    (state / "link").symlink_to("/etc/passwd")
    prepare_state_dir(state, 10001, 10001)  # the top was root's: repaired once
    assert {
        p.lstat().st_uid for p in [state, state / "sub", state / "sub" / "history.json", state / "link"]
    } == {10001}
    assert Path("/etc/passwd").stat().st_uid == 0  # the link itself changed owner, never its target
    (state / "late.json").write_text("{}")  # written as root after the repair, with no mark set
    prepare_state_dir(state, 10001, 10001)
    assert (state / "late.json").stat().st_uid == 0  # no walk on an ordinary start


@pytest.mark.parametrize("what", ["bytes", "files"])
async def test_a_box_filling_its_state_dir_past_the_quota_is_killed_and_not_restarted(
    tmp_path: Path, box_image: str, test_home_id: str, what: str, box_runtime: str
) -> None:
    quota = StateQuota(max_bytes=8 * 1024**2, max_entries=1000)
    backend = DockerBackend(box_image, home_id=test_home_id, limits=DockerLimits(state_quota=quota))
    spec = BoxSpec("pip", "c1", tmp_path / "imp" / "state")
    async with backend.open(spec, ScriptedHost(), command=["python3", "-c", FILLER, what]) as running:
        with anyio.fail_after(60):
            await running.exited.wait()
    assert running.violation is not None and "over its quota" in running.violation
    with pytest.raises(BoxStartError, match="over its quota"):
        async with backend.open(spec, ScriptedHost()):
            pass
    assert backend.labelled() == []


async def test_one_file_can_never_outgrow_the_quota(
    tmp_path: Path, box_image: str, test_home_id: str, box_runtime: str
) -> None:
    quota = StateQuota(max_bytes=4 * 1024**2, max_entries=1000)
    backend = DockerBackend(box_image, home_id=test_home_id, limits=DockerLimits(state_quota=quota))
    state = tmp_path / "imp" / "state"
    async with backend.open(
        BoxSpec("pip", "c1", state), ScriptedHost(), command=["python3", "-c", FILLER, "one-big-file"]
    ):
        with anyio.fail_after(30):
            while not (state / "refused").exists():
                await anyio.sleep(0.05)
    assert (state / "refused").read_text() == "27"  # EFBIG: the write past the limit was refused
    assert (state / "big").stat().st_size <= quota.max_bytes


def test_measuring_stops_early_and_counts_blocks_not_links(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "data").write_bytes(b"x" * 100_000)
    (state / "to-root").symlink_to("/")  # never followed: / is not counted
    usage = measure_state_dir(state, StateQuota(max_bytes=10**9, max_entries=10))
    assert usage.complete and usage.entries == 2 and 100_000 <= usage.bytes < 200_000
    for n in range(20):
        (state / f"e{n}").touch()
    crowded = measure_state_dir(state, StateQuota(max_bytes=10**9, max_entries=10))
    assert not crowded.complete and crowded.entries == 11
    assert crowded.over(StateQuota(max_bytes=10**9, max_entries=10)) == "11+ files, over its quota of 10"
