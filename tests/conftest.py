"""Shared fixtures: an isolated IMPYARD_HOME, the anyio backend, and the two box backends."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from impyard.backends import BoxStartError
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.process import ProcessBackend
from impyard.db import Database, open_database


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def impyard_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own IMPYARD_HOME and no model key or Discord token from the environment."""
    home = tmp_path / "home"
    monkeypatch.setenv("IMPYARD_HOME", str(home))
    for name in list(os.environ):
        if name in ("OPENAI_API_KEY", "OPENAI_BASE_URL") or name.startswith("IMPYARD_DISCORD_TOKEN"):
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


@pytest.fixture
def docker_backend(box_image: str, test_home_id: str) -> Iterator[DockerBackend]:
    backend = DockerBackend(box_image, home_id=test_home_id, limits=DockerLimits())
    yield backend
    leftovers = backend.labelled()
    backend.remove_orphans()
    assert not leftovers, f"boxes left behind: {[c.name for c in leftovers]}"


@pytest.fixture(params=["process", "docker"])
def backend(request: pytest.FixtureRequest) -> object:
    """Both backends, for tests that must behave the same on each."""
    if request.param == "process":
        return ProcessBackend(warn=False)
    return request.getfixturevalue("docker_backend")
