"""The test kit's shared fixtures (imported by tests/conftest.py): the fake model, and the memory engine's kit.

A test file keeps only what is particular to it: its model key, whether the host finds the fake through the
environment, the reply it scripts first, all said in one marker, e.g.::

    pytestmark = pytest.mark.fake_model(key=KEY, env=True, answer="hello there")

A file that scripts more overrides ``fake`` on top of ``fake_model``::

    @pytest.fixture
    def fake(fake_model: FakeOpenAI) -> FakeOpenAI:
        fake_model.script({"summary": "..."}, purpose="summary")
        return fake_model
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from testing.fake_openai import DEFAULT_API_KEY, FakeOpenAI, envelope

if TYPE_CHECKING:
    from tests.memory.engine_kit import Kit


def point_host_at(server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's model API is ``server``: OPENAI_API_KEY and OPENAI_BASE_URL name it."""
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key or "")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)


@pytest.fixture
def fake_model(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    """The loopback fake OpenAI (``testing.fake_openai``), as the test's ``fake_model`` marker says."""
    marker = request.node.get_closest_marker("fake_model")
    options = dict(marker.kwargs) if marker is not None else {}
    unknown = set(options) - {"key", "env", "answer"}
    assert not unknown, f"fake_model marker: unknown options {sorted(unknown)}"
    with FakeOpenAI(api_key=options.get("key") or DEFAULT_API_KEY) as server:
        if options.get("env"):
            point_host_at(server, monkeypatch)
        if options.get("answer") is not None:
            server.script(envelope(answer=options["answer"], answer_needed=True))
        yield server


@pytest.fixture
def fake(fake_model: FakeOpenAI) -> FakeOpenAI:
    """The fake model under the name most tests use; a file that scripts more overrides this one."""
    return fake_model


@pytest.fixture
def model(fake_model: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> FakeOpenAI:
    """The fake model as the host's model API, whatever the marker says of ``env`` (the Discord yard's tests)."""
    point_host_at(fake_model, monkeypatch)
    return fake_model


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[Kit]:
    """The memory engine's world (``tests/memory/engine_kit.py``): the host's store, the scripted model, a box."""
    from tests.memory.engine_kit import Kit

    world = Kit(tmp_path)
    yield world
    world.close()
