"""Issue 21, "several hosts … each with its own Docker engine": two ``serve --shard I/2`` processes on two homes,
one PostgreSQL database, and two Docker engines — the machine's own and a second ``dockerd`` this module starts
on a socket, data root and exec root of its own (what a second machine would bring). Each host runs its shard's
boxes on its own engine (``DOCKER_HOST``), and every message is answered once, by its shard's host.

Skipped, visibly, where a second engine cannot start (no Docker engine, not root, no ``dockerd``). The second
engine builds the box image itself (no registry, as ``impyard box build`` does on a fresh machine: about a
minute here)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from impyard import paths
from impyard.backends.plan import LABEL_CHANNEL, LABEL_HOME
from testing.fake_openai import FakeOpenAI, envelope
from tests.test_discord_shards import (
    ALICE,
    CAROL,
    EVEN_A,
    IMPYARD,
    ODD_A,
    ODD_B,
    START_S,
    make_fake,
    prepare_home,
    serve_process,
    wait_for_line,
)  # fmt: skip

ENGINE_START_S = 60.0
BUILD_S = 600.0


@pytest.fixture(scope="module")
def second_engine(box_image: str) -> Iterator[str]:
    """A second Docker engine (its DOCKER_HOST), with the box image built in it; stopped and removed after."""
    dockerd = shutil.which("dockerd") or ("/usr/sbin/dockerd" if Path("/usr/sbin/dockerd").exists() else None)
    if os.geteuid() != 0 or dockerd is None:
        pytest.skip("a second Docker engine needs root and dockerd (.ci/run runs as root)")
    root = Path(tempfile.mkdtemp(prefix="impyard-engine2-"))
    socket = root / "docker.sock"
    (root / "daemon.json").write_text("{}")  # none of the machine's own settings (its hosts, its data root)
    log = (root / "dockerd.log").open("w")
    engine = subprocess.Popen(
        [
            dockerd, "--host", f"unix://{socket}", "--data-root", str(root / "data"),
            "--exec-root", str(root / "exec"), "--pidfile", str(root / "docker.pid"),
            "--config-file", str(root / "daemon.json"), "--bridge", "none", "--iptables=false",
            "--ip-masq=false",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    host = f"unix://{socket}"
    try:
        deadline = time.monotonic() + ENGINE_START_S
        while True:
            try:
                docker.DockerClient(base_url=host).ping()
                break
            except Exception:  # noqa: BLE001 - not up yet
                if engine.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(
                        f"the second Docker engine did not start: {(root / 'dockerd.log').read_text()[-500:]}"
                    )
                time.sleep(0.2)
        built = subprocess.run(
            [IMPYARD, "box", "build"], env={**os.environ, "DOCKER_HOST": host}, capture_output=True, text=True,
            timeout=BUILD_S,
        )  # fmt: skip
        assert built.returncode == 0, built.stdout + built.stderr
        assert box_image in built.stdout  # the same image, by content, on both engines
        yield host
    finally:
        engine.send_signal(signal.SIGTERM)
        try:
            engine.wait(timeout=60)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()
        log.close()
        subprocess.run(["umount", "-R", str(root / "exec")], capture_output=True)  # whatever it left mounted
        shutil.rmtree(root, ignore_errors=True)


def _box_channels(docker_host: str, homes: list[Path]) -> set[str]:
    """The channels whose boxes of these homes run on that engine now (not another test's, running beside)."""
    client = docker.DockerClient(base_url=docker_host)
    ours = {paths.home_id(home.resolve()) for home in homes}
    try:
        return {
            c.labels.get(LABEL_CHANNEL, "")
            for c in client.containers.list(filters={"label": LABEL_CHANNEL})
            if c.labels.get(LABEL_HOME) in ours
        }
    finally:
        client.close()


def test_two_hosts_on_two_docker_engines_answer_every_message_once_each_on_its_own_engine(
    tmp_path: Path, second_engine: str, migrated_postgres_url: str
) -> None:
    url = migrated_postgres_url
    first_engine = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    asked: dict[int, int] = {}
    with make_fake() as fake, FakeOpenAI() as model0, FakeOpenAI() as model1:
        for shard, model in ((0, model0), (1, model1)):
            model.script(envelope(answer=f"pip of shard {shard}"))
            prepare_home(tmp_path / f"home{shard}", url)
        with (
            serve_process(
                tmp_path / "home0", "0/2", model0, fake, url, backend="docker", DOCKER_HOST=first_engine
            ) as log0,
            serve_process(
                tmp_path / "home1", "1/2", model1, fake, url, backend="docker", DOCKER_HOST=second_engine
            ) as log1,
        ):
            wait_for_line(log0, "serving pip on Discord as shard 0/2")
            wait_for_line(log1, "serving pip on Discord as shard 1/2")
            for channel, author, shard in ((EVEN_A, ALICE, 0), (ODD_A, ALICE, 1), (ODD_B, CAROL, 1)):
                asked[fake.post_message(channel, author, "hello pip").id] = shard
            fake.wait_for_sync(
                lambda: sum(len(fake.messages(c)) for c in (EVEN_A, ODD_A, ODD_B)) >= len(asked),
                timeout=START_S,
            )
            homes = [tmp_path / "home0", tmp_path / "home1"]
            on_first, on_second = _box_channels(first_engine, homes), _box_channels(second_engine, homes)
        replies = [m for c in (EVEN_A, ODD_A, ODD_B) for m in fake.messages(c)]
    answered = {m.reference_id: m.content for m in replies}
    assert len(replies) == len(asked), [(m.channel_id, m.content) for m in replies]  # each exactly once
    assert answered == {message: f"pip of shard {shard}" for message, shard in asked.items()}
    # each host's warm boxes ran on its own engine: shard 0's channel on the first, shard 1's on the second
    assert str(EVEN_A) in on_first and not {str(ODD_A), str(ODD_B)} & on_first, (
        on_first,
        json.dumps(sorted(on_second)),
    )
    assert {str(ODD_A), str(ODD_B)} <= on_second and str(EVEN_A) not in on_second, on_second
