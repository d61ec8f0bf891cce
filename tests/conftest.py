"""Shared fixtures: an isolated IMPYARD_HOME, the anyio backend, and the box backends — the process backend
and the Docker backend under each OCI runtime (runc, and gVisor's runsc where the engine can run it)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import pytest_timeout

from bench.pgcluster import PostgresServer, postgres_bin, private_server, throwaway_database
from impyard.backends import BoxStartError
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.process import ProcessBackend
from impyard.backends.runtimes import RUNTIME_ENV, RuntimeChoice
from impyard.storage import urls as dburl
from impyard.storage.db import Database, open_database
from tests.fixtures import fake, fake_model, kit, model  # noqa: F401 - the shared fixtures of the test kit
from tests.postgres_session import SessionDatabase
from tests.slow import SLOW_TESTS

# Every Docker test of the lockdown, the protocol and end to end runs once per runtime (issue 22).
RUNTIMES = ("runc", "runsc")


# pytest-timeout times the test function alone (timeout_func_only in pyproject.toml): a fixture's setup or
# cleanup (a Docker engine's data root removed, a box image built) never counts against a test's 120 s. Setup and
# teardown get their own, wider limit here, so a hung fixture still fails instead of stopping the suite.
FIXTURE_TIMEOUT_S = 900


@contextmanager
def _fixture_timer(item: pytest.Item) -> Iterator[None]:
    settings = pytest_timeout._get_item_settings(item)
    if not settings.timeout or settings.timeout <= 0:  # --timeout=0 (no timeouts) turns this one off too
        yield
        return
    hooks = item.config.pluginmanager.hook
    hooks.pytest_timeout_set_timer(item=item, settings=settings._replace(timeout=FIXTURE_TIMEOUT_S))
    try:
        yield
    finally:
        hooks.pytest_timeout_cancel_timer(item=item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _fixture_timer(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with _fixture_timer(item):
        return (yield)


# --- markers for a quick inner loop, and what keeps a module on one xdist worker -----------------------------

# Fixtures through which a test reaches Docker or PostgreSQL, and the parameter values that pick them (a test
# that parametrises its engine or backend reaches the fixture with request.getfixturevalue).
DOCKER_FIXTURES = frozenset({"box_image", "runtime_problems", "docker_backend", "box_runtime"})
DOCKER_PARAMS = frozenset(RUNTIMES)
POSTGRES_FIXTURES = frozenset({"postgres_server", "postgres_url", "migrated_postgres_url"})
POSTGRES_PARAMS = frozenset({"postgresql"})
SHARED_SCOPES = frozenset({"module", "class", "package"})
SLOW_FALLBACK_S = 2.0  # the order of a test marked slow by hand, not measured in tests/slow.py


_SECONDS = pytest.StashKey[float]()  # how long a test is expected to take, for the order


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks each test ``docker``, ``postgres`` or ``slow`` (``-m "not slow and not docker"``), and keeps the
    tests of a module that share a module-scoped fixture on one xdist worker (``--dist loadgroup``), so an
    expensive one (a second Docker engine, a PostgreSQL cluster of its own) is set up once, not once per worker.
    Here, as each test is collected: before ``-m`` selects by the markers and xdist reads the groups."""
    module, _, name = item.nodeid.partition("::")
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    params = {value for value in callspec.params.values() if isinstance(value, str)} if callspec else set()
    if names & DOCKER_FIXTURES or params & DOCKER_PARAMS:
        item.add_marker(pytest.mark.docker)
    if names & POSTGRES_FIXTURES or params & POSTGRES_PARAMS:
        item.add_marker(pytest.mark.postgres)
    measured = SLOW_TESTS.get(module, {}).get(name.split("[")[0])
    if measured is not None:
        item.add_marker(pytest.mark.slow)
    item.stash[_SECONDS] = measured or (SLOW_FALLBACK_S if item.get_closest_marker("slow") else 0.0)
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    if any(d.scope in SHARED_SCOPES for defs in definitions for d in defs):
        item.add_marker(pytest.mark.xdist_group(module))


@pytest.hookimpl(trylast=True)  # after pytest's own order (by fixture scope) and its -m selection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first, so that the workers finish together instead of one running a long test last
    while the others wait; a group moves as one, by its longest test. Every xdist worker sorts alike."""
    longest: dict[str, float] = {}
    for item in items:
        group = _group_of(item)
        longest[group] = max(longest.get(group, 0.0), item.stash.get(_SECONDS, 0.0))
    items.sort(key=lambda item: -longest[_group_of(item)])  # stable: the rest keep their order


def _group_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker is not None else str(id(item))


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


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite host database migrated once per test session (per xdist worker): each store test's own is a copy."""
    path = tmp_path_factory.mktemp("sqlite-template") / "impyard.db"
    open_database(path).close()  # closed: the WAL is folded into the file, which is then the whole database
    return path


@pytest.fixture
def fresh_sqlite(sqlite_template: Path) -> Callable[[Path], Database]:
    """Opens a migrated SQLite database at a path: a copy of ``sqlite_template`` (opening it checks the revision
    as every open does) instead of running the migrations again."""

    def fresh(path: Path) -> Database:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sqlite_template, path)
        return open_database(path)

    return fresh


@pytest.fixture
def db(tmp_path: Path, fresh_sqlite: Callable[[Path], Database]) -> Iterator[Database]:
    """A fresh, migrated host database for store tests."""
    database = fresh_sqlite(tmp_path / "impyard.db")
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
def postgres_session(postgres_server: PostgresServer | str) -> Iterator[SessionDatabase | None]:
    """The database migrated once per test session (per xdist worker) that ``migrated_postgres_url`` empties for
    each test (``tests/postgres_session.py``). None without a server."""
    if isinstance(postgres_server, str):
        yield None
        return
    database = SessionDatabase(postgres_server)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def migrated_postgres_url(
    postgres_server: PostgresServer | str, postgres_session: SessionDatabase | None
) -> str:
    """A database at the newest revision with no rows and no other connection, for this test: the session's,
    emptied (a test that needs a second database, or an unmigrated one, asks for ``postgres_url``)."""
    if isinstance(postgres_server, str) or postgres_session is None:
        pytest.skip(str(postgres_server))
    return postgres_session.fresh()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_engine_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A fresh, migrated host database on each engine in turn, for store tests that use the engine API
    (``db.write``/``db.read``/``db.begin``); the PostgreSQL run skips, visibly, only where no server can run."""
    if request.param == "sqlite":
        database = request.getfixturevalue("fresh_sqlite")(tmp_path / "impyard.db")
    else:
        database = open_database(url=request.getfixturevalue("migrated_postgres_url"))
    yield database
    database.close()
