"""Issue 21: the whole host on PostgreSQL — every store speaks the engine API, so ``IMPYARD_DATABASE_URL``
naming PostgreSQL serves a conversation and every command, as the SQLite file does (skipped, visibly, where no
PostgreSQL server can run)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta

import anyio
import pytest
from click.testing import CliRunner

from box.protocol.models import Author, Message
from impyard.cli import cli
from impyard.clock import FixedClock
from impyard.conversation.inbound import Inbound
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.runtime import Runtime, open_runtime
from impyard.storage import urls as dburl
from testing.fake_openai import FakeOpenAI
from testing.inprocess import InProcessBackend

CHANNEL = "4242"
pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True, answer="hello from postgres")]


@pytest.fixture
def on_postgres(migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(dburl.ENV, migrated_postgres_url)
    return migrated_postgres_url


@pytest.fixture
async def runtime(on_postgres: str, fake: FakeOpenAI) -> AsyncIterator[tuple[Runtime, RecordingSurface]]:
    ImpStore().add("pip", "You are Pip.")
    surface = RecordingSurface()
    async with open_runtime(
        ["pip"], surface, clock=FixedClock(), backends={"pip": InProcessBackend()},
        surfaces=("discord", "terminal"), pump_period_s=None,
    ) as rt:  # fmt: skip
        yield rt, surface


async def test_a_conversation_runs_on_postgresql(runtime: tuple[Runtime, RecordingSurface]) -> None:
    rt, surface = runtime
    assert rt.db.dialect == "postgresql"
    now = rt.host.clock.now()
    for n in (1, 2):
        message = Message(
            id=f"m{n}", author=Author(id="ann", name="ann"), content=f"hi {n}",
            created_at=now + timedelta(seconds=n),
        )  # fmt: skip
        inbound = Inbound(surface="discord", channel_id=CHANNEL, channel_kind="dm", message=message)
        assert await rt.conversations.receive("pip", inbound) in ("started", "queued")
        with anyio.fail_after(30):
            await rt.conversations.wait_finished(f"m{n}")
        assert rt.history.outcome("pip", CHANNEL, f"m{n}") == "sent"
    assert [s.content for s in surface.sent] == ["hello from postgres", "hello from postgres"]
    assert [m.id for m in rt.history.recent(CHANNEL) if m.id.startswith("m")] == ["m1", "m2"]
    spent = rt.gateway.ledger.summary()  # the two model calls were reserved and settled in PostgreSQL
    assert spent, spent


def test_the_commands_run_on_postgresql(on_postgres: str) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["imp", "add", "pip", "--persona", "You are Pip."]).exit_code == 0
    added = runner.invoke(cli, ["task", "add", "pip", "Summarise the week", "--json"])
    assert added.exit_code == 0, added.output
    task = json.loads(added.output)
    listed = json.loads(runner.invoke(cli, ["task", "ls", "--json"]).output)
    assert [t["id"] for t in listed] == [task["id"]]
    for args in (
        ["budget", "show"],
        ["hosts"],
        ["audit", "tail", "--json"],
        ["history", "show", "pip"],
        ["approvals", "ls"],
    ):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, (args, result.output)
        assert "PostgreSQL yet" not in result.output
    doctor = json.loads(runner.invoke(cli, ["doctor", "--json", "--no-model-call"]).output)
    row = next(r for r in doctor if r["item"] == "Database")
    assert row["status"] == "ok" and row["detail"].startswith("postgresql"), row
    password = dburl.parse(on_postgres).password
    assert password and password not in json.dumps(doctor)  # the URL is shown, never its password
