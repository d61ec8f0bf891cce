"""Shared fixtures: an isolated IMPYARD_HOME, the anyio backend, and the box backends — the process backend
and the Docker backend under each OCI runtime (runc, and gVisor's runsc where the engine can run it)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from bench.pgcluster import PostgresServer, postgres_bin, private_server, throwaway_database
from impyard.backends import BoxStartError
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.process import ProcessBackend
from impyard.backends.runtimes import RUNTIME_ENV, RuntimeChoice
from impyard.storage import urls as dburl
from impyard.storage.db import Database, open_database
from tests.fixtures import fake, fake_model, kit, model  # noqa: F401 - the shared fixtures of the test kit

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
    from impyard.backends.image import build_image

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


@pytest.fixture(autouse=True)
def _no_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test meets the operator's IMPYARD_DATABASE_URL: each picks its engine itself."""
    monkeypatch.delenv("IMPYARD_DATABASE_URL", raising=False)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer | str]:
    """The test PostgreSQL server, or why there is none (each test that needs it then skips, saying so):
    IMPYARD_TEST_DATABASE_URL, else a private cluster of Debian's binaries (.ci/run installs postgresql)."""
    given = os.environ.get(POSTGRES_ENV, "").strip()
    if given:
        admin = dburl.parse(given).url  # postgresql:// means psycopg 3 here too
        yield PostgresServer(admin.render_as_string(hide_password=False), admin.password)
        return
    if postgres_bin() is None:
        yield (
            "no PostgreSQL server: set IMPYARD_TEST_DATABASE_URL or install Debian's postgresql "
            "(apt-get install postgresql; .ci/run does)"
        )
        return
    with private_server() as server:  # or why it did not start
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer | str) -> Iterator[str]:
    """A throwaway, empty database on the test server, for this test only (dropped after it)."""
    if isinstance(postgres_server, str):
        pytest.skip(postgres_server)
    with throwaway_database(postgres_server, "impyard_test") as name:
        yield postgres_server.url_of(name)


@pytest.fixture(scope="session")
def postgres_template(postgres_server: PostgresServer | str) -> Iterator[str | None]:
    """A database migrated once per test session, the template of each store test's own (``CREATE DATABASE …
    TEMPLATE``): a copy costs a fraction of running every Alembic revision again. None without a server."""
    if isinstance(postgres_server, str):
        yield None
        return
    with throwaway_database(postgres_server, "impyard_template") as name:
        open_database(url=postgres_server.url_of(name)).close()  # migrated, then let go
        yield name


@pytest.fixture
def migrated_postgres_url(
    postgres_server: PostgresServer | str, postgres_template: str | None
) -> Iterator[str]:
    """A throwaway database already at the newest revision (a copy of ``postgres_template``), for this test only."""
    if isinstance(postgres_server, str) or postgres_template is None:
        pytest.skip(str(postgres_server))
    with throwaway_database(postgres_server, "impyard_test", postgres_template) as name:
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
