"""Shared fixtures: an isolated IMPYARD_HOME, the anyio backend, and the box backends — the process backend
and the Docker backend under each OCI runtime (runc, and gVisor's runsc where the engine can run it)."""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from impyard import dburl
from impyard.backends import BoxStartError
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.process import ProcessBackend
from impyard.backends.runtimes import RUNTIME_ENV, RuntimeChoice
from impyard.db import Database, open_database

# Every Docker test of the lockdown, the protocol and end to end runs once per runtime (issue 22).
RUNTIMES = ("runc", "runsc")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def impyard_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own IMPYARD_HOME and no model key or Discord token from the environment."""
    home = tmp_path / "home"
    monkeypatch.setenv("IMPYARD_HOME", str(home))
    for name in list(os.environ):
        if name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", RUNTIME_ENV) or name.startswith(
            "IMPYARD_DISCORD_TOKEN"
        ):
            monkeypatch.delenv(name)
    return home


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    """A fresh, migrated host database for store tests."""
    database = open_database(tmp_path / "impyard.db")
    yield database
    database.close()


@pytest.fixture(scope="session")
def box_image() -> str:
    """The box image for this box version, built if missing. Skips only when no Docker engine can run."""
    try:
        DockerBackend(image="unused").client()
    except BoxStartError as exc:
        pytest.skip(f"no Docker engine can run here: {exc}")
    from impyard.boximage import build_image

    return build_image(progress=lambda line: None)


@pytest.fixture(scope="session")
def test_home_id() -> str:
    """Labels this test run's containers, so orphan checks never see anyone else's boxes."""
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def runtime_problems(box_image: str) -> Callable[[str], str | None]:
    """Why a box cannot run under a runtime here (None: it can), asked of the engine once per runtime: it must
    be registered (.ci/run registers runsc), and a box must start under it."""
    known: dict[str, str | None] = {}

    def problem(runtime: str) -> str | None:
        if runtime not in known:
            known[runtime] = _runtime_problem(box_image, runtime)
        return known[runtime]

    return problem


def _runtime_problem(box_image: str, runtime: str) -> str | None:
    client = DockerBackend(box_image).client()
    if runtime not in (client.info().get("Runtimes") or {}):
        return (
            f"the Docker engine has no {runtime} runtime registered "
            "(.ci/run installs and registers gVisor's runsc; see docs/box.md)"
        )
    try:  # the lockdown's own shape: a box that cannot start like this cannot start at all
        client.containers.run(
            box_image, ["-c", "pass"], entrypoint="python3", runtime=runtime, network_mode="none",
            read_only=True, user="10001:10001", remove=True,
        )  # fmt: skip
    except docker.errors.DockerException as exc:
        return f"{runtime} is registered but cannot run a box here: {str(exc)[:300]}"
    return None


def use_runtime(request: pytest.FixtureRequest, runtime: str) -> None:
    """Skip, visibly, where ``runtime`` cannot run a box here; else every Docker box the test starts with the
    default setting (through the CLI, the host, or a ``DockerBackend()`` of its own) runs under it."""
    problem = request.getfixturevalue("runtime_problems")(runtime)
    if problem is not None:
        pytest.skip(problem)
    request.getfixturevalue("monkeypatch").setenv(RUNTIME_ENV, runtime)


def docker_backend_for(request: pytest.FixtureRequest, runtime: str, **settings: Any) -> DockerBackend:
    """A Docker backend whose boxes run under ``runtime``, labelled for this test run; a box it leaves
    behind fails the test. For tests that parametrise their own backends (``getfixturevalue`` cannot reach a
    parametrised fixture)."""
    box_image = request.getfixturevalue("box_image")
    use_runtime(request, runtime)
    backend = DockerBackend(
        box_image,
        home_id=request.getfixturevalue("test_home_id"),
        runtime=RuntimeChoice(runtime, "the test"),  # type: ignore[arg-type]
        **{"limits": DockerLimits(), **settings},
    )

    def nothing_left_behind() -> None:
        leftovers = backend.labelled()
        backend.remove_orphans()
        assert not leftovers, f"boxes left behind: {[c.name for c in leftovers]}"

    request.addfinalizer(nothing_left_behind)
    return backend


@pytest.fixture(params=RUNTIMES)
def box_runtime(request: pytest.FixtureRequest) -> str:
    """Each OCI runtime in turn (runc, runsc); runsc is skipped, visibly, only where it cannot run."""
    use_runtime(request, request.param)
    return str(request.param)


@pytest.fixture
def docker_backend(request: pytest.FixtureRequest, box_runtime: str) -> DockerBackend:
    """The Docker backend, once under each runtime."""
    return docker_backend_for(request, box_runtime)


@pytest.fixture(params=["process", *RUNTIMES], ids=["process", *(f"docker-{r}" for r in RUNTIMES)])
def backend(request: pytest.FixtureRequest) -> object:
    """Every backend, for tests that must behave the same on each: the process backend, and Docker under
    each runtime."""
    if request.param == "process":
        return ProcessBackend(warn=False)
    return docker_backend_for(request, request.param)


# --- the host database on each engine (issue 21): SQLite, and PostgreSQL from a private cluster ---------------

POSTGRES_ENV = (
    "IMPYARD_TEST_DATABASE_URL"  # an admin URL of a server to use instead (it must allow CREATE DATABASE)
)
POSTGRES_START_TIMEOUT_S = 60


@pytest.fixture(autouse=True)
def _no_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test meets the operator's IMPYARD_DATABASE_URL: each picks its engine itself."""
    monkeypatch.delenv("IMPYARD_DATABASE_URL", raising=False)


@dataclass(frozen=True)
class PostgresServer:
    """A PostgreSQL server the tests may create databases on."""

    admin_url: str  # holds the password
    password: str | None

    def url_of(self, database: str) -> str:
        return str(make_url(self.admin_url).set(database=database).render_as_string(hide_password=False))


def _postgres_bin() -> Path | None:
    """Debian's binaries (postgresql-NN), the newest version."""
    found = [
        path for path in glob.glob("/usr/lib/postgresql/*/bin")
        if (Path(path) / "initdb").exists() and (Path(path) / "pg_ctl").exists()
    ]  # fmt: skip
    return Path(max(found, key=lambda p: int(re.sub(r"\D", "", Path(p).parent.name) or 0))) if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_cluster(bin_dir: Path, root: Path) -> tuple[PostgresServer, Callable[[], None]]:
    """initdb + pg_ctl start in ``root``: loopback TCP and a socket in ``root`` only, password auth over TCP.
    PostgreSQL refuses to run as root: as root it runs as the ``postgres`` user (runuser)."""
    as_user: list[str] = []
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")  # Debian's postgresql package creates it
        os.chown(root, entry.pw_uid, entry.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    password = uuid.uuid4().hex
    (root / "pw").write_text(password)
    if as_user:
        os.chown(root / "pw", entry.pw_uid, entry.pw_gid)
    data, port = root / "data", _free_port()

    def run(*args: str) -> None:
        done = subprocess.run(
            [*as_user, *args], capture_output=True, text=True, timeout=POSTGRES_START_TIMEOUT_S
        )
        if done.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed: {(done.stderr or done.stdout).strip()[-500:]}")

    run(
        str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
        "--auth-host=scram-sha-256", f"--pwfile={root / 'pw'}", "--no-sync", "-E", "UTF8", "--no-instructions",
    )  # fmt: skip
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
    )
    run(
        str(bin_dir / "pg_ctl"),
        "-D",
        str(data),
        "-l",
        str(root / "log"),
        "-w",
        "-t",
        "60",
        "-o",
        options,
        "start",
    )

    def stop() -> None:
        subprocess.run(
            [*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True, timeout=POSTGRES_START_TIMEOUT_S,
        )  # fmt: skip

    admin = f"postgresql+psycopg://postgres:{password}@127.0.0.1:{port}/postgres"
    return PostgresServer(admin, password), stop


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer | str]:
    """The test PostgreSQL server, or why there is none (each test that needs it then skips, saying so):
    IMPYARD_TEST_DATABASE_URL, else a private cluster of Debian's binaries (.ci/run installs postgresql)."""
    given = os.environ.get(POSTGRES_ENV, "").strip()
    if given:
        admin = dburl.parse(given).url  # postgresql:// means psycopg 3 here too
        yield PostgresServer(admin.render_as_string(hide_password=False), admin.password)
        return
    bin_dir = _postgres_bin()
    if bin_dir is None:
        yield (
            "no PostgreSQL server: set IMPYARD_TEST_DATABASE_URL or install Debian's postgresql "
            "(apt-get install postgresql; .ci/run does)"
        )
        return
    root = Path(tempfile.mkdtemp(prefix="impyard-pg-"))
    try:
        server, stop = _start_cluster(bin_dir, root)
    except (OSError, KeyError, RuntimeError, subprocess.SubprocessError) as exc:
        log = root / "log"
        tail = log.read_text(errors="replace")[-300:] if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        yield f"the private PostgreSQL cluster of {bin_dir} did not start: {exc} {tail}".strip()
        return
    try:
        yield server
    finally:
        stop()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def _throwaway_database(server: PostgresServer, prefix: str, template: str | None = None) -> Iterator[str]:
    """A database of its own on the test server (a copy of ``template`` when given): its name; dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server.admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")
            )
        yield name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer | str) -> Iterator[str]:
    """A throwaway, empty database on the test server, for this test only (dropped after it)."""
    if isinstance(postgres_server, str):
        pytest.skip(postgres_server)
    with _throwaway_database(postgres_server, "impyard_test") as name:
        yield postgres_server.url_of(name)


@pytest.fixture(scope="session")
def postgres_template(postgres_server: PostgresServer | str) -> Iterator[str | None]:
    """A database migrated once per test session, the template of each store test's own (``CREATE DATABASE …
    TEMPLATE``): a copy costs a fraction of running every Alembic revision again. None without a server."""
    if isinstance(postgres_server, str):
        yield None
        return
    with _throwaway_database(postgres_server, "impyard_template") as name:
        open_database(url=postgres_server.url_of(name)).close()  # migrated, then let go
        yield name


@pytest.fixture
def migrated_postgres_url(
    postgres_server: PostgresServer | str, postgres_template: str | None
) -> Iterator[str]:
    """A throwaway database already at the newest revision (a copy of ``postgres_template``), for this test only."""
    if isinstance(postgres_server, str) or postgres_template is None:
        pytest.skip(str(postgres_server))
    with _throwaway_database(postgres_server, "impyard_test", postgres_template) as name:
        yield postgres_server.url_of(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_engine_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A fresh, migrated host database on each engine in turn, for store tests that use the engine API
    (``db.write``/``db.read``/``db.begin``); the PostgreSQL run skips, visibly, only where no server can run."""
    if request.param == "sqlite":
        database = open_database(tmp_path / "impyard.db")
    else:
        database = open_database(url=request.getfixturevalue("migrated_postgres_url"))
    yield database
    database.close()
