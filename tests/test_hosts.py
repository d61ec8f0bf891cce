"""Issue 21, "Seeing the cluster" and "one holder at a time" through the real CLI: two homes on one database.

A terminal channel has one chat at a time across every home on the database (a second is refused naming the
holder's host and pid); a shard has one ``impyard serve --shard I/N`` (a second is refused before it logs in,
and takes over at once when the holder is killed with SIGKILL); ``impyard hosts`` lists them from the database.
"""

from __future__ import annotations

import getpass
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pexpect
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from impyard.backends.process import ProcessBackend
from impyard.cli import cli
from impyard.cli.hosts import cluster
from impyard.clock import FixedClock
from impyard.discord.shards import Shard
from impyard.imps.store import ImpStore
from impyard.storage import leases as leases_module
from impyard.storage.db import open_database
from impyard.storage.leases import LeaseInfo, LeaseLost, LeaseStore
from impyard.storage.liveness import Holder
from impyard.storage.tables import leases as leases_table
from impyard.terminal.chat import run_chat
from testing.fake_openai import FakeOpenAI
from tests.discord_yard import ALICE, GENERAL, serving
from tests.test_discord_shards import TOKEN, make_fake, prepare_home, wait_for_line

IMPYARD = str(Path(sys.executable).parent / "impyard")
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
ALPHA = Holder("alpha", "b00t", 100, "5")
BETA = Holder("beta", "f00d", 200, "7")
FAR = Holder("far-away", "b00t", 4242, "9")  # a host of another machine
START_S = 60
pytestmark = pytest.mark.fake_model(answer="Hello from Pip!")


def info(name: str, holder: Holder | None, expires_in_s: float, **detail: object) -> LeaseInfo:
    return LeaseInfo(
        name, holder, str(holder), 3, NOW - timedelta(minutes=5), NOW - timedelta(seconds=4),
        NOW + timedelta(seconds=expires_in_s), dict(detail),
    )  # fmt: skip


def test_the_cluster_pairs_each_host_with_the_leases_it_holds() -> None:
    found = cluster(
        [
            info("channel:terminal:ann", BETA, -2),
            info("host:alpha/100", ALPHA, 26, command="serve", home="/srv/a", shard="1/2", warm_boxes=2,
                 started_at="2026-12-03T11:00:00.000000+00:00"),
            info("host:beta/200", BETA, -1, command="chat", home="/srv/b", warm_boxes="many"),
            info("shard:0/2", BETA, 20),
            info("shard:1/2", ALPHA, 26),
        ],
        NOW,
        alive=lambda holder: False if holder == BETA else None,
    )  # fmt: skip
    alpha, beta = found["hosts"]
    assert alpha == {
        "host": "alpha", "pid": 100, "command": "serve", "home": "/srv/a", "shard": "1/2", "warm_boxes": 2,
        "spare_boxes": None, "holds": ["shard:1/2"], "started_at": "2026-12-03T11:00:00.000000+00:00",
        "renewed_at": "2026-12-03T11:59:56.000000+00:00", "expires_at": "2026-12-03T12:00:26.000000+00:00",
        "lease_age_s": 4.0, "expires_in_s": 26.0, "state": "held",
    }  # fmt: skip
    assert (beta["state"], beta["holds"], beta["warm_boxes"], beta["shard"]) == ("expired", [], None, None)
    assert [(lease["name"], lease["state"], lease["token"]) for lease in found["leases"]] == [
        ("channel:terminal:ann", "expired", 3),
        ("shard:0/2", "dead", 3),  # its holder is a process of this machine that is gone: free at once
        ("shard:1/2", "held", 3),
    ]


def test_hosts_lists_a_host_of_another_machine_until_its_record_expires(impyard_home: Path) -> None:
    db = open_database()
    clock = FixedClock(datetime.now(UTC))
    elsewhere = LeaseStore(db, clock, me=Holder("far-away", "b00t", 4242, "9"))
    elsewhere.acquire(
        "host:far-away/4242", {"command": "serve", "home": "/srv/yard", "shard": "0/2", "warm_boxes": 3}
    )
    elsewhere.acquire("shard:0/2")
    db.close()
    result = CliRunner().invoke(cli, ["hosts"])
    assert result.exit_code == 0, result.output
    header, host, _blank, lease_header, lease = result.output.splitlines()
    assert header.split("\t") == [
        "host", "pid", "command", "shard", "warm boxes", "imp settings", "holds", "home", "started", "renewed",
        "expires", "state",
    ]  # fmt: skip
    assert host.split("\t")[:8] == ["far-away", "4242", "serve", "0/2", "3", "-", "shard:0/2", "/srv/yard"]
    assert host.split("\t")[-1] == "held"
    assert lease_header.split("\t")[0] == "lease" and lease.split("\t")[:4] == [
        "shard:0/2",
        "far-away",
        "4242",
        "1",
    ]
    listed = json.loads(CliRunner().invoke(cli, ["hosts", "--json"]).output)
    assert [(h["host"], h["pid"], h["state"]) for h in listed["hosts"]] == [("far-away", 4242, "held")]


def test_hosts_on_an_empty_database_says_who_registers() -> None:
    result = CliRunner().invoke(cli, ["hosts"])
    assert result.exit_code == 0
    assert "no hosts on this database yet" in result.output
    assert json.loads(CliRunner().invoke(cli, ["hosts", "--json"]).output) == {
        "hosts": [], "leases": [], "layout": None,
    }  # fmt: skip


def test_hosts_with_a_bad_database_url_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["hosts"], env={"IMPYARD_DATABASE_URL": "mysql://db/yard"})
    assert result.exit_code == 1
    assert "impyard runs on SQLite or PostgreSQL only" in result.output
    assert "Traceback" not in result.output


# --- two homes, one database, real processes -----------------------------------------------------------------


@pytest.fixture
def shared_db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'shared.db'}"


def env_for(home: Path, database: str, model: FakeOpenAI) -> dict[str, str]:
    return {
        **os.environ, "IMPYARD_HOME": str(home), "IMPYARD_DATABASE_URL": database,
        "OPENAI_API_KEY": str(model.api_key), "OPENAI_BASE_URL": model.base_url, "PROMPT_TOOLKIT_NO_CPR": "1",
    }  # fmt: skip


def hosts_json(database: str) -> dict[str, list[dict[str, object]]]:
    result = CliRunner().invoke(cli, ["hosts", "--json"], env={"IMPYARD_DATABASE_URL": database})
    assert result.exit_code == 0, result.output
    found: dict[str, list[dict[str, object]]] = json.loads(result.output)
    return found


def test_a_second_chat_of_the_same_channel_is_refused_naming_the_holder_and_hosts_shows_it(
    tmp_path: Path, shared_db: str, model: FakeOpenAI
) -> None:
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    channel = f"channel:terminal:{getpass.getuser()}"
    first = pexpect.spawn(
        IMPYARD, ["chat", "--backend", "process"], env=env_for(home_a, shared_db, model), encoding="utf-8",
        timeout=START_S, dimensions=(40, 200),
    )  # fmt: skip
    try:
        first.expect("you> ")
        first.sendline("hello pip")
        first.expect("pip> Hello from Pip!")
        cluster_now = hosts_json(shared_db)
        (host,) = cluster_now["hosts"]
        assert (host["host"], host["pid"], host["command"], host["home"]) == (
            socket.gethostname(), first.pid, "chat", str(home_a.resolve()),
        )  # fmt: skip
        assert (host["holds"], host["state"], host["shard"]) == ([channel], "held", None)
        assert 0 <= float(host["expires_in_s"]) <= 30  # type: ignore[arg-type]
        (lease,) = cluster_now["leases"]
        assert (lease["name"], lease["pid"], lease["token"], lease["state"]) == (
            channel,
            first.pid,
            1,
            "held",
        )

        second = subprocess.run(
            [IMPYARD, "chat", "--backend", "process"], env=env_for(home_b, shared_db, model),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=START_S,
        )  # fmt: skip
        assert second.returncode == 1, second.stdout + second.stderr
        refusal = [line for line in second.stderr.splitlines() if line.startswith("Error:")]
        assert len(refusal) == 1 and re.fullmatch(
            rf"Error: {re.escape(channel)} is held by {re.escape(socket.gethostname())} \(pid {first.pid}\); it is "
            r"free once that process stops, or in \d+ s if it stops renewing",
            refusal[0],
        ), second.stderr
        assert "Traceback" not in second.stderr
        assert len(hosts_json(shared_db)["hosts"]) == 1  # the refused chat left no record
    finally:
        first.sendline("/quit")
        first.expect(pexpect.EOF)
        first.close()
    assert first.exitstatus == 0
    after = hosts_json(shared_db)
    assert after["hosts"] == []  # a host's record goes with it
    assert [(lease["name"], lease["state"]) for lease in after["leases"]] == [(channel, "expired")]


def test_a_second_serve_of_a_shard_is_refused_and_takes_over_once_the_holder_is_killed(
    tmp_path: Path, shared_db: str, model: FakeOpenAI
) -> None:
    with make_fake() as fake:
        homes = [tmp_path / "home-a", tmp_path / "home-b"]
        for home in homes:
            os.environ["IMPYARD_DATABASE_URL"] = shared_db
            try:
                prepare_home(home)
            finally:
                del os.environ["IMPYARD_DATABASE_URL"]

        def serve(home: Path, log: Path) -> subprocess.Popen[bytes]:
            env = {
                **env_for(home, shared_db, model), "IMPYARD_DISCORD_TOKEN_PIP": TOKEN,
                "IMPYARD_DISCORD_API_BASE": fake.api_base, "IMPYARD_DISCORD_GUILD_READY_TIMEOUT": "0.05",
            }  # fmt: skip
            with log.open("w") as out:
                return subprocess.Popen(
                    [IMPYARD, "serve", "pip", "--backend", "process", "--shard", "1/2"],
                    env=env, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip

        first_log, second_log, third_log = (tmp_path / f"serve-{n}.log" for n in (1, 2, 3))
        first = serve(homes[0], first_log)
        third: subprocess.Popen[bytes] | None = None
        try:
            wait_for_line(first_log, "serving pip on Discord as shard 1/2")
            (host,) = hosts_json(shared_db)["hosts"]
            assert (host["pid"], host["command"], host["shard"], host["holds"]) == (
                first.pid, "serve", "1/2", ["shard:1/2"],
            )  # fmt: skip
            second = serve(homes[1], second_log)
            assert second.wait(START_S) == 1
            said = second_log.read_text()
            assert f"Error: shard:1/2 is held by {socket.gethostname()} (pid {first.pid})" in said
            assert "Traceback" not in said and "serving pip" not in said
            assert fake.shards_connected == [(1, 2)]  # the refused host never connected

            os.kill(first.pid, signal.SIGKILL)
            first.wait(START_S)
            third = serve(homes[1], third_log)  # at once: its holder is a dead process of this machine
            wait_for_line(third_log, "serving pip on Discord as shard 1/2", timeout=20)
            leases = {lease["name"]: lease for lease in hosts_json(shared_db)["leases"]}
            assert (leases["shard:1/2"]["pid"], leases["shard:1/2"]["token"]) == (third.pid, 2)
            hosts = {h["pid"]: h for h in hosts_json(shared_db)["hosts"]}
            assert hosts[third.pid]["state"] == "held" and hosts[first.pid]["state"] == "dead"
            third.send_signal(signal.SIGTERM)
            assert third.wait(START_S) == 0, third_log.read_text()
        finally:
            for process in (first, third):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()


# --- a host that loses its lease stops -------------------------------------------------------------------------


def steal(name: str) -> None:
    """Another machine takes the lease over (as after an expiry it could not see from here): the next token."""
    db = open_database()
    try:
        with db.begin() as conn:
            conn.execute(
                sa.update(leases_table).where(leases_table.c.name == name).values(holder=str(FAR), token=2)
            )
    finally:
        db.close()


async def until_held(name: str) -> None:
    with anyio.fail_after(START_S):
        while True:
            db = open_database()
            try:
                if name in {row.name for row in LeaseStore(db).list()}:
                    return
            finally:
                db.close()
            await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_a_chat_whose_channel_is_taken_over_says_by_whom_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    monkeypatch.setattr(leases_module, "RENEW_EVERY", timedelta(seconds=0.1))
    monkeypatch.setenv("OPENAI_API_KEY", str(model.api_key))
    monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
    ImpStore().add("pip", box={"backend": "process"})
    channel = f"channel:terminal:{getpass.getuser()}"
    read, write = os.pipe()
    out = io.StringIO()
    lost: list[LeaseLost] = []
    with os.fdopen(read, "r") as stdin:
        try:

            async def chat() -> None:
                try:
                    await run_chat("pip", stdin=stdin, out=out, backends={"pip": ProcessBackend(warn=False)})
                except LeaseLost as exc:
                    lost.append(exc)

            with anyio.fail_after(START_S):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(chat)
                    await until_held(channel)
                    steal(channel)  # the chat ends by itself: nothing was typed, nothing closed its input
        finally:
            os.close(write)
    said = f"lost lease {channel}: the lease passed to far-away pid 4242 (token 2, this host held 1)"
    assert [str(exc) for exc in lost] == [said]
    assert f"(impyard) {said}; stopping" in out.getvalue()
    assert "bye" in out.getvalue()  # the chat closed its runtime (and its boxes) before it raised


@pytest.mark.anyio
async def test_a_serving_host_whose_shard_is_taken_over_stops_and_says_by_whom(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    monkeypatch.setattr(leases_module, "RENEW_EVERY", timedelta(seconds=0.1))
    monkeypatch.setenv("OPENAI_API_KEY", str(model.api_key))
    monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
    async with serving(monkeypatch, model, answer=None, shard=Shard(0, 1)) as yard:
        yard.fake.post_message(GENERAL, ALICE, "hello pip")
        await yard.posted(GENERAL)
        assert len(yard.rt.sessions.sessions) == 1  # a warm box
        steal("shard:0/1")
        with anyio.fail_after(START_S):
            await yard.host.stop.wait()
        assert yard.host.failure == (
            "lost lease shard:0/1: the lease passed to far-away pid 4242 (token 2, this host held 1)"
        )
    assert yard.host.runtime.sessions.sessions == {}  # every box closed


def warm_boxes_listed() -> object:
    """The warm boxes ``impyard hosts --json`` lists for the one host of this home's database."""
    result = CliRunner().invoke(cli, ["hosts", "--json"])
    assert result.exit_code == 0, result.output
    (host,) = json.loads(result.output)["hosts"]
    return host["warm_boxes"]


async def until_listed(warm_boxes: int) -> None:
    with anyio.fail_after(START_S):
        while warm_boxes_listed() != warm_boxes:
            await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_hosts_shows_the_warm_boxes_as_soon_as_a_box_opens_or_closes(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    """Not at the next renewal (none comes within the test): the host record is written when the count changed."""
    monkeypatch.setattr(leases_module, "RENEW_EVERY", timedelta(hours=1))
    monkeypatch.setattr(leases_module, "DEFAULT_TTL", timedelta(hours=2))
    monkeypatch.setenv("OPENAI_API_KEY", str(model.api_key))
    monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
    async with serving(monkeypatch, model, answer=None, shard=Shard(0, 1)) as yard:
        assert warm_boxes_listed() == 0
        yard.fake.post_message(GENERAL, ALICE, "hello pip")
        await yard.posted(GENERAL)
        assert len(yard.rt.sessions.sessions) == 1  # a warm box, kept for the next message
        await until_listed(1)
        await yard.rt.sessions.shutdown(grace_s=5.0)  # every box closes
        await until_listed(0)


def test_hosts_shows_the_shard_layout_held_or_free(impyard_home: Path) -> None:
    """Issue 36: once a `serve` fixed the layout, a line above the tables (and "layout" in --json) says which, who
    fixed it, and whether a host of another layout would be refused now."""
    from impyard.storage import shard_layout

    db = open_database()
    clock = FixedClock(datetime.now(UTC))
    elsewhere = LeaseStore(db, clock, me=FAR)

    def take(conn: sa.Connection, now: datetime) -> None:
        shard_layout.take(conn, shard_layout.UNSHARDED, "no --shard", me=FAR, now=now, alive=lambda _: None)

    detail = {"command": "serve", "home": "/srv/yard", "shard": None}
    held = elsewhere.acquire("host:far-away/4242", detail, timedelta(seconds=30), guard=take)
    listed = CliRunner().invoke(cli, ["hosts"])
    assert listed.exit_code == 0, listed.output
    assert re.fullmatch(
        r"Shard layout: Discord is served without shards \(serve without --shard\), fixed by far-away \(pid 4242\) "
        r"(now|\d+s ago); held by 1 lease: a host of another layout is refused",
        listed.output.splitlines()[0],
    ), listed.output
    layout = json.loads(CliRunner().invoke(cli, ["hosts", "--json"]).output)["layout"]
    assert layout["shards"] is None and layout["state"] == "held"
    assert layout["held_by"] == [{"lease": "host:far-away/4242", "host": "far-away", "pid": 4242}]
    elsewhere.release(held, forget=True)  # it stopped (a host's record goes with it)
    db.close()
    listed = CliRunner().invoke(cli, ["hosts"])
    assert listed.output.splitlines()[0].endswith(
        "; free: no host holds it, the next host may start with another layout"
    ), listed.output
    assert "no hosts on this database yet" in listed.output
    layout = json.loads(CliRunner().invoke(cli, ["hosts", "--json"]).output)["layout"]
    assert (layout["state"], layout["held_by"], layout["fixed_by"]) == (
        "free",
        [],
        {"host": "far-away", "pid": 4242},
    )
