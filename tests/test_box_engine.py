"""Boxes attached through the Docker Engine's API (issue 18): the lockdown command line becomes exactly the
container ``docker create`` makes of it, the stdio is byte-exact through the multiplexed attach stream with
stderr apart, a start the engine cannot make whole is refused and cleaned up, and no client process per box."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import SocketStream

from impyard.backends import BoxSpec, BoxStartError, RefuseAllHost
from impyard.backends.docker import DockerBackend, DockerLimits, run_argv
from impyard.backends.engine import (
    UNKNOWN_EXIT,
    AttachedBox,
    Engine,
    EngineError,
    dechunk,
    engine_address,
    parse_response,
)
from impyard.backends.multiplex import STDERR, STDOUT, MultiplexDecoder, MultiplexError, frame
from impyard.backends.runflags import CLI_DEFAULTS, create_request, ram_bytes
from impyard.backends.runtimes import RuntimeChoice
from tests.scripted import ScriptedHost, init_params

MIB = 1024**2


def spec(tmp_path: Path, run_id: str | None = None) -> BoxSpec:
    return BoxSpec("pip", "c1", tmp_path / "state", run_id=run_id or uuid.uuid4().hex)


# ------------------------------------------------------------------ the multiplexed stream (pure)

STREAM = [
    (STDOUT, b'{"jsonrpc":"2.0","id":1,"result":{}}\n'),
    (STDERR, b"a log line \xff\xfe not utf-8\n"),
    (STDOUT, "ünïcode ✓ and a \\n escape\n".encode()),
    (STDOUT, b""),  # an empty frame is legal
    (STDERR, bytes(range(256))),
    (STDOUT, b"x" * 70_000),  # bigger than one read
]


def _joined(pieces: list[tuple[int, bytes]]) -> dict[int, bytes]:
    out = {STDOUT: b"", STDERR: b""}
    for stream, payload in pieces:
        out[stream] += payload
    return out


EXPECTED = _joined(STREAM)
WIRE = b"".join(frame(stream, payload) for stream, payload in STREAM)


@pytest.mark.parametrize("chunk", [1, 3, 7, 8, 9, 4096, len(WIRE)])
def test_the_stream_splits_byte_exact_whatever_the_reads(chunk: int) -> None:
    decoder = MultiplexDecoder()
    pieces = []
    for at in range(0, len(WIRE), chunk):
        pieces += decoder.feed(WIRE[at : at + chunk])
    assert _joined(pieces) == EXPECTED
    assert not decoder.inside_frame


def test_a_payload_is_handed_on_before_its_frame_is_whole() -> None:
    decoder = MultiplexDecoder()
    assert decoder.feed(frame(STDOUT, b"0123456789")[:12]) == [(STDOUT, b"0123")]
    assert decoder.inside_frame
    assert decoder.feed(b"456789") == [(STDOUT, b"456789")]


@pytest.mark.parametrize(
    ("header", "stream"),
    [(b"\x00\x00\x00\x00\x00\x00\x00\x01", STDOUT), (b"\x01\x00\x00\x00\x00\x00\x00\x01", STDOUT)],
)
def test_stdin_frames_read_as_stdout(header: bytes, stream: int) -> None:
    assert MultiplexDecoder().feed(header + b"z") == [(stream, b"z")]


@pytest.mark.parametrize(
    "header", [b"\x03\x00\x00\x00\x00\x00\x00\x01", b"\x01\x00\x01\x00\x00\x00\x00\x01", b'{"jsonrp']
)
def test_a_stream_that_is_not_multiplexed_is_refused(header: bytes) -> None:
    with pytest.raises(MultiplexError):
        MultiplexDecoder().feed(header + b"z")


# ------------------------------------------------------------------ the command line as a create request (pure)


def test_every_lockdown_flag_becomes_its_create_field(tmp_path: Path) -> None:
    box = spec(tmp_path, run_id="r1")
    argv = run_argv(box, "img", limits=DockerLimits(), home_id="h", user="10001:10001", runtime="runsc")
    request = create_request(argv)
    body, host = request.body, request.body["HostConfig"]
    assert request.name == argv[argv.index("--name") + 1] and request.interactive
    assert {key: body[key] for key in ("AttachStdin", "AttachStdout", "AttachStderr", "OpenStdin", "StdinOnce", "Tty")} == {
        "AttachStdin": True, "AttachStdout": True, "AttachStderr": True, "OpenStdin": True, "StdinOnce": True, "Tty": False,
    }  # fmt: skip
    assert host == {
        **CLI_DEFAULTS, "AutoRemove": True, "Init": True, "Runtime": "runsc", "NetworkMode": "none", "ReadonlyRootfs": True,
        "Tmpfs": {"/tmp": "rw,nosuid,nodev,noexec,size=64m"}, "CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges"],
        "PidsLimit": 128, "Memory": 512 * MIB, "MemorySwap": 512 * MIB, "NanoCpus": 10**9,
        "Ulimits": [{"Name": "fsize", "Soft": 256 * MIB, "Hard": 256 * MIB}, {"Name": "nofile", "Soft": 1024, "Hard": 1024}],
        "LogConfig": {"Type": "none", "Config": {}},
        "Mounts": [{"Type": "bind", "Source": str(tmp_path / "state"), "Target": "/state"}],
    }  # fmt: skip
    assert body["User"] == "10001:10001" and body["Env"] == ["IMPYARD_STATE_DIR=/state"]
    assert body["Labels"] == {
        "org.impyard.box": "1", "org.impyard.home": "h", "org.impyard.imp": "pip", "org.impyard.channel": "c1",
        "org.impyard.run": "r1", "org.impyard.role": "session",
    }  # fmt: skip
    assert (
        body["Image"] == "img" and "Cmd" not in body and "Entrypoint" not in body
    )  # the image's own command


def test_a_command_replaces_the_entrypoint(tmp_path: Path) -> None:
    argv = run_argv(
        spec(tmp_path), "img", limits=DockerLimits(), home_id="h", user="1:1", command=["python3", "-c", "x"]
    )
    body = create_request(argv).body
    assert (body["Entrypoint"], body["Cmd"], body["Image"]) == (["python3"], ["-c", "x"], "img")


@pytest.mark.parametrize(
    "flag",
    [["--privileged"], ["--cap-add=SYS_ADMIN", "--device", "/dev/kvm"], ["-v", "/:/host"], ["--pid", "host"]],
)
def test_a_flag_with_no_mapping_refuses_the_start(tmp_path: Path, flag: list[str]) -> None:
    argv = run_argv(spec(tmp_path), "img", limits=DockerLimits(), home_id="h", user="1:1")
    with pytest.raises(BoxStartError, match="no Engine API field"):
        create_request([*argv[:2], *flag, *argv[2:]])


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512m", 512 * MIB),
        ("96M", 96 * MIB),
        ("1g", 1024 * MIB),
        ("2048", 2048),
        ("1.5k", 1536),
        ("64mb", 64 * MIB),
    ],
)
def test_sizes_read_as_the_docker_cli_reads_them(text: str, size: int) -> None:
    assert ram_bytes(text) == size


def test_an_unreadable_size_refuses_the_start() -> None:
    with pytest.raises(BoxStartError):
        ram_bytes("lots")


# ------------------------------------------------------------------ HTTP answers (pure)


def test_a_chunked_answer_is_read_whole() -> None:
    body = b'{"StatusCode":137,"Error":null}\n'
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % len(body)
        + body
        + b"\r\n0\r\n\r\n"
    )
    answer = parse_response(wire)
    assert (answer.status, answer.json()) == (200, {"StatusCode": 137, "Error": None})
    assert dechunk(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n") == b"hello world"


def test_an_error_answer_says_what_the_engine_said() -> None:
    wire = b'HTTP/1.1 404 Not Found\r\nContent-Length: 42\r\n\r\n{"message":"No such image: impyard-box:x"}'
    assert parse_response(wire).message() == "No such image: impyard-box:x"


@pytest.mark.parametrize(
    ("host", "path"),
    [(None, "/var/run/docker.sock"), ("", "/var/run/docker.sock"), ("unix:///run/d.sock", "/run/d.sock")],
)
def test_the_socket_comes_from_docker_host(host: str | None, path: str) -> None:
    assert engine_address({} if host is None else {"DOCKER_HOST": host}) == path


def test_an_engine_that_is_not_a_local_socket_is_refused() -> None:
    with pytest.raises(EngineError, match="not a unix socket"):
        engine_address({"DOCKER_HOST": "tcp://10.0.0.1:2375"})


# ------------------------------------------------------------------ a fake engine: what the engine answers decides


class FakeEngine:
    """Speaks just enough of the engine's API on a unix socket; records each request it got."""

    def __init__(
        self, *, warnings: list[str] | None = None, start_status: int = 204, exit_code: int | None = 3
    ) -> None:
        self.warnings = warnings or []
        self.start_status = start_status
        self.exit_code = exit_code  # None: the wait's connection breaks without an answer
        self.requests: list[str] = []
        self.attached: SocketStream | None = None
        self.exited = anyio.Event()

    async def handle(self, stream: SocketStream) -> None:
        try:
            await self._answer(stream)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            pass  # the client went away first (it was told enough)
        finally:
            await stream.aclose()

    async def _answer(self, stream: SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive()
        head, _, body = data.partition(b"\r\n\r\n")
        line = head.split(b"\r\n")[0].decode()
        method, path = line.split()[:2]
        self.requests.append(f"{method} {path.split('?')[0]}")
        if path.startswith("/containers/create"):
            answer = json.dumps({"Id": "c0ffee", "Warnings": self.warnings}).encode()
            await stream.send(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
        elif path.endswith("/attach?stream=1&stdin=1&stdout=1&stderr=1"):
            await stream.send(b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
            await stream.send(frame(STDOUT, b"out\n") + frame(STDERR, b"err\n"))
            await self.exited.wait()
        elif "/wait" in path:
            await stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            await self.exited.wait()
            if self.exit_code is not None:
                body_out = b'{"StatusCode":%d}' % self.exit_code
                await stream.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body_out), body_out))
        elif path.endswith("/start"):
            answer = b'{"message":"OCI runtime create failed"}' if self.start_status >= 400 else b""
            await stream.send(
                b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (self.start_status, len(answer), answer)
            )
        elif method == "DELETE":
            self.exited.set()
            await stream.send(b"HTTP/1.1 204 No Content\r\n\r\n")


@asynccontextmanager
async def fake_engine(tmp_path: Path, **answers: Any) -> AsyncIterator[tuple[Engine, FakeEngine]]:
    fake = FakeEngine(**answers)
    path = tmp_path / "engine.sock"
    listener = await anyio.create_unix_listener(path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, fake.handle)
        yield Engine(str(path)), fake
        tg.cancel_scope.cancel()


def _request(tmp_path: Path) -> Any:
    return create_request(run_argv(spec(tmp_path), "img", limits=DockerLimits(), home_id="h", user="1:1"))


@pytest.mark.anyio
async def test_the_engine_is_asked_what_docker_run_asks_in_that_order(tmp_path: Path) -> None:
    async with fake_engine(tmp_path) as (engine, fake):
        box = await engine.run_attached(_request(tmp_path))
        assert await box.stdout.receive() == b"out\n" and await box.stderr.receive() == b"err\n"
        fake.exited.set()
        assert await box.wait() == 3 and box.removed
        await box.remove()  # gone already (--rm): no second request
        await box.aclose()
    assert fake.requests == ["POST /containers/create", "POST /containers/c0ffee/attach", "POST /containers/c0ffee/wait",
                             "POST /containers/c0ffee/start"]  # fmt: skip


@pytest.mark.anyio
async def test_a_box_the_engine_could_not_lock_down_whole_never_starts(tmp_path: Path) -> None:
    warning = "Your kernel does not support swap limit capabilities. Memory limited without swap."
    async with fake_engine(tmp_path, warnings=[warning]) as (engine, fake):
        with pytest.raises(EngineError, match="could not apply the whole lockdown: Your kernel"):
            await engine.run_attached(_request(tmp_path))
    assert fake.requests == ["POST /containers/create", "DELETE /containers/c0ffee"]  # removed, never started


@pytest.mark.anyio
async def test_a_start_the_engine_refuses_is_a_start_error_and_is_cleaned_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fake_engine(tmp_path, start_status=500) as (engine, fake):
        backend = DockerBackend("img", home_id="h", runtime=RuntimeChoice("runc", "the test"))
        backend._checked, backend._runtime, backend._engine = True, "runc", engine
        monkeypatch.setattr(backend, "prepare_state_dir", lambda state_dir, user: None)
        with pytest.raises(BoxStartError, match="did not start the box .OCI runtime create failed"):
            async with backend.open(spec(tmp_path), RefuseAllHost()):
                pytest.fail("a box the engine did not start was handed out")
    assert fake.requests[-2:] == ["POST /containers/c0ffee/start", "DELETE /containers/c0ffee"]


@pytest.mark.anyio
async def test_a_wait_that_breaks_says_the_exit_is_unknown(tmp_path: Path) -> None:
    async with fake_engine(tmp_path, exit_code=None) as (engine, fake):
        box = await engine.run_attached(_request(tmp_path))
        fake.exited.set()
        assert await box.wait() == UNKNOWN_EXIT and not box.removed
        await box.remove()  # so it is removed by hand
        await box.aclose()
    assert fake.requests[-1] == "DELETE /containers/c0ffee"


# ------------------------------------------------------------------ real boxes


def _inspect(container: str) -> dict[str, Any]:
    out = subprocess.run(["docker", "inspect", container], capture_output=True, text=True, check=True)
    attrs: dict[str, Any] = json.loads(out.stdout)[0]
    return attrs


def _comparable(attrs: dict[str, Any]) -> dict[str, Any]:
    """What the lockdown decides: the whole HostConfig and Config, less what names one container."""
    config = {key: value for key, value in attrs["Config"].items() if key not in ("Hostname",)}
    config["Labels"] = {k: v for k, v in config["Labels"].items() if k != "org.impyard.run"}
    return {"HostConfig": attrs["HostConfig"], "Config": config}


@pytest.mark.anyio
async def test_the_attached_box_is_the_container_docker_create_makes(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    """The docker CLI is the oracle of the flag mapping: the same command line, once through the CLI, once
    through the API; the engine's record of both must be the same."""
    host = ScriptedHost()
    box = spec(tmp_path)
    async with docker_backend.open(box, host) as running:
        await running.init(init_params())
        ours = await anyio.to_thread.run_sync(docker_backend.inspect_box, box)
        assert isinstance(running.process, AttachedBox)
        argv = run_argv(
            spec(tmp_path / "cli"), docker_backend.image, limits=docker_backend.limits, home_id=docker_backend.home_id,
            user=ours["Config"]["User"], runtime=docker_backend.runtime,
        )  # fmt: skip
        (tmp_path / "cli" / "state").mkdir(parents=True)
        argv[1] = "create"
        cli_id = (await anyio.run_process(argv)).stdout.decode().strip()
        try:
            theirs = _inspect(cli_id)
        finally:
            await anyio.run_process(["docker", "rm", "-f", cli_id], check=False)
    cli = _comparable(theirs)
    for mount in cli["HostConfig"]["Mounts"]:  # the two boxes' own state dirs
        mount["Source"] = str(tmp_path / "state")
    assert _comparable(ours) == cli


ECHO = r"""
import sys
data = sys.stdin.buffer.read()
sys.stderr.buffer.write(b"err:" + data[:64]); sys.stderr.flush()
for at in range(0, len(data), 4093):  # odd-sized writes, so frames split where lines do not
    sys.stdout.buffer.write(data[at:at + 4093]); sys.stdout.flush()
sys.exit(5)
"""


@pytest.mark.anyio
async def test_stdio_through_the_engine_is_byte_exact_and_stderr_stays_apart(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    lines = [json.dumps({"jsonrpc": "2.0", "id": n, "result": {"text": "ü✓\u2028" * n, "raw": "\\n"}}).encode() + b"\n"
             for n in range(300)]  # fmt: skip
    sent = b"".join(lines) + b"\xff\x00 not json, not utf-8\n" + b"y" * 300_000
    argv = run_argv(
        spec(tmp_path), docker_backend.image, limits=docker_backend.limits, home_id=docker_backend.home_id,
        user="10001:10001", runtime=docker_backend.runtime, command=["python3", "-c", ECHO],
    )  # fmt: skip
    (tmp_path / "state").mkdir()
    if os.getuid() == 0:
        os.chown(tmp_path / "state", 10001, 10001)
    box = await Engine().run_attached(create_request(argv))
    try:
        got, err = b"", b""

        async def read_out() -> None:
            nonlocal got
            try:
                while True:
                    got += await box.stdout.receive()
            except anyio.EndOfStream:
                pass

        async def read_err() -> None:
            nonlocal err
            try:
                while True:
                    err += await box.stderr.receive()
            except anyio.EndOfStream:
                pass

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_out)
                tg.start_soon(read_err)
                for at in range(0, len(sent), 10_007):
                    await box.stdin.send(sent[at : at + 10_007])
                await box.stdin.aclose()  # the box reads EOF: stdin closes with the half-closed socket
            assert await box.wait() == 5
    finally:
        await box.remove()
        await box.aclose()
    assert got == sent
    assert err == b"err:" + sent[:64]


def _children() -> list[int]:
    found: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        found += [int(pid) for pid in (task / "children").read_text().split()]
    return found


@pytest.mark.anyio
async def test_a_docker_box_adds_no_process_to_the_host(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    before = set(_children())
    async with docker_backend.open(spec(tmp_path), ScriptedHost()) as running:
        await running.init(init_params())
        assert set(_children()) - before == set()  # no `docker run` client relaying its stdio
        with pytest.raises(NotImplementedError):
            running.process.pid  # noqa: B018 - a box has no host pid to signal by mistake
        assert running.host_pid is None  # what the supervisor asks instead: none of its own (issue 21)
    assert running.returncode == 0


@pytest.mark.anyio
async def test_a_killed_box_reports_137_and_leaves_nothing(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    async with docker_backend.open(spec(tmp_path), RefuseAllHost(), command=["sleep", "60"]) as running:
        await running.kill()
        assert running.returncode == 137
    assert docker_backend.labelled() == []
