"""Issue 21, "the database going away while serving": a PostgreSQL server stopped under a running host. A
transaction waits for it (up to the database's patience) and runs once it answers; one that never reached its
commit is run again, one whose commit was on its way when the connection broke is never run again; a server
that stays away fails visibly, in words that say so. A real server: a private cluster of this test module's own,
stopped and started for real (the session's shared cluster is left alone)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa

from bench.pgcluster import PostgresServer, postgres_bin, start_cluster, throwaway_database
from box.protocol.models import Author, Message
from impyard.clock import FixedClock
from impyard.conversation.inbound import Inbound
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.runtime import open_runtime
from impyard.storage import faults as storage_faults
from impyard.storage import urls as dburl
from impyard.storage.db import Database, open_database
from impyard.storage.faults import CommitUncertain
from impyard.storage.tables import channels
from testing.fake_openai import FakeOpenAI, envelope
from testing.inprocess import InProcessBackend

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]  # a cluster of its own, stopped and started


@dataclass
class Cluster:
    """A private server this module may stop and start."""

    server: PostgresServer
    data: Path
    as_user: list[str]
    pg_ctl: Path

    def _pg_ctl(self, *args: str) -> None:
        done = subprocess.run(
            [*self.as_user, str(self.pg_ctl), "-D", str(self.data), *args], capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr or done.stdout

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        """Again, with the options it was first started with (pg_ctl keeps them in postmaster.opts)."""
        argv = shlex.split((self.data / "postmaster.opts").read_text())
        self._pg_ctl("-w", "-l", str(self.data.parent / "log"), "-o", shlex.join(argv[1:]), "start")

    def start_after(self, delay_s: float) -> threading.Thread:
        def later() -> None:
            time.sleep(delay_s)
            self.start()

        thread = threading.Thread(target=later, daemon=True)
        thread.start()
        return thread


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL binaries: apt-get install postgresql (.ci/run does)")
    root = Path(tempfile.mkdtemp(prefix="impyard-outage-"))
    server, stop = start_cluster(bin_dir, root)
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    try:
        yield Cluster(server, root / "data", as_user, bin_dir / "pg_ctl")
    finally:
        stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def url(cluster: Cluster) -> Iterator[str]:
    with throwaway_database(cluster.server, "impyard_outage") as name:
        yield cluster.server.url_of(name)


def _add_channel(channel_id: str, runs: list[int]) -> Callable[[sa.Connection], None]:
    def fn(conn: sa.Connection) -> None:
        runs.append(1)
        conn.execute(
            sa.insert(channels).values(channel_id=channel_id, updated_at="2026-12-03T00:00:00+00:00")
        )

    return fn


def _channels(db: Database) -> list[str]:
    return db.read(lambda conn: list(conn.execute(sa.select(channels.c.channel_id)).scalars()))


def test_a_write_waits_for_the_server_and_runs_once_it_answers(cluster: Cluster, url: str) -> None:
    db = open_database(url=url)
    try:
        db.write(_add_channel("before", []))
        cluster.stop()
        restarted = cluster.start_after(2.0)
        runs: list[int] = []
        db.write(_add_channel("during", runs))  # waits: the server is down for about two seconds
        restarted.join()
        assert _channels(db) == [
            "before",
            "during",
        ]  # kept once, though it may have been tried more than once
        assert len(runs) == 1  # the work itself ran once: it waited for a connection before it began
    finally:
        db.close()


def test_a_server_that_stays_away_fails_after_the_patience_in_words_that_say_so(
    cluster: Cluster, url: str
) -> None:
    db = open_database(url=url)
    db.patience_s = 1.5
    try:
        db.write(_add_channel("before", []))
        cluster.stop()
        try:
            started = time.monotonic()
            with pytest.raises(sa.exc.DBAPIError) as raised:
                db.write(_add_channel("lost", []))
            assert time.monotonic() - started >= 1.5  # it waited its patience, then gave up
            where = db.url.where()
            assert storage_faults.describe(raised.value, where) == (
                f"impyard can't reach its database ({where} is not answering)"
            )
            password = dburl.parse(url).password
            assert password and password not in storage_faults.describe(raised.value, where)
        finally:
            cluster.start()
        assert _channels(db) == ["before"]  # and when it is back, nothing of the failed write is there
    finally:
        db.close()


def test_a_connection_lost_at_commit_is_never_run_again(cluster: Cluster, url: str) -> None:
    """The server's side of the connection ends after the work and before its COMMIT: the host cannot know
    whether the commit was kept, so it says so and does not run the work again (nothing executed twice)."""
    db = open_database(url=url)
    admin = sa.create_engine(cluster.server.admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    runs: list[int] = []

    def work_then_lose_the_connection(conn: sa.Connection) -> None:
        runs.append(1)
        conn.execute(sa.insert(channels).values(channel_id="x", updated_at="2026-12-03T00:00:00+00:00"))
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with admin.connect() as other:
            other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
            for _ in range(200):  # until that backend is gone, so the COMMIT meets a closed connection
                if not other.exec_driver_sql(
                    f"SELECT 1 FROM pg_stat_activity WHERE pid = {int(pid)}"
                ).first():
                    break
                time.sleep(0.01)

    try:
        with pytest.raises(CommitUncertain) as raised:
            db.write(work_then_lose_the_connection)
        assert runs == [1]
        assert "whether that was kept is not known, so it was not done again" in str(raised.value)
        assert storage_faults.classify(raised.value).kind == "uncertain"
        assert _channels(db) == []  # here it was not kept: the server never saw the COMMIT
    finally:
        admin.dispose()
        db.close()


async def test_a_message_that_arrives_while_the_server_is_down_is_answered_once_when_it_is_back(
    cluster: Cluster, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole host on the PostgreSQL server: the server stops, a direct message arrives, the server comes
    back two seconds later. The message is kept and answered, once: one reply, one reservation, one wake."""
    monkeypatch.setenv(dburl.ENV, url)
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_API_KEY", str(fake.api_key))
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        fake.script(envelope(answer="back again", answer_needed=True))
        ImpStore().add("pip", "You are Pip.")
        surface = RecordingSurface()
        async with open_runtime(
            ["pip"], surface, clock=FixedClock(), backends={"pip": InProcessBackend()},
            surfaces=("discord", "terminal"), pump_period_s=None,
        ) as rt:  # fmt: skip
            now = rt.host.clock.now()

            def dm(n: int) -> Inbound:
                message = Message(
                    id=f"m{n}", author=Author(id="ann", name="ann"), content=f"hi {n}",
                    created_at=now + timedelta(seconds=n),
                )  # fmt: skip
                return Inbound(surface="discord", channel_id="4242", channel_kind="dm", message=message)

            assert await rt.conversations.receive("pip", dm(1)) in ("started", "queued")
            with anyio.fail_after(60):
                await rt.conversations.wait_finished("m1")
            cluster.stop()
            restarted = cluster.start_after(2.0)
            assert await rt.conversations.receive("pip", dm(2)) in ("started", "queued")
            with anyio.fail_after(60):
                await rt.conversations.wait_finished("m2")
            await anyio.to_thread.run_sync(restarted.join)
            assert rt.history.outcome("pip", "4242", "m2") == "sent"
            assert [s.content for s in surface.sent] == ["back again", "back again"]
            reservations = rt.db.read(
                lambda conn: conn.exec_driver_sql(
                    "SELECT count(*) FROM ledger WHERE imp = 'pip'"
                ).scalar_one()
            )
            assert reservations == 2  # one model call per message: none was made twice
