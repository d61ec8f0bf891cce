"""Issue 21, "a due task run is held through a lease": each run holds ``task:<task>/<run>`` from its claim to its
end, renewed while its box runs; a reclaim takes only a run whose lease expired or whose holder is dead, never one a
live host runs; a run whose lease is lost stops its box and its acts are refused. Two real processes on one
database, on SQLite and on PostgreSQL."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
from box.protocol.models import DiscordSendParams, LogParams
from impyard.backends import BoxBackend, BoxHost, BoxSpec, RunningBox
from impyard.backends.process import ProcessBackend
from impyard.clock import FixedClock, SystemClock
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.core import Gateway, GatewayStores
from impyard.gateway.policy import load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.host import build_gateway
from impyard.imps.store import ImpStore
from impyard.storage import liveness
from impyard.storage.db import Database, open_database
from impyard.storage.leases import LeaseStore, task_lease_name
from impyard.storage.liveness import Holder
from impyard.storage.tables import leases
from impyard.supervisor import Supervisor, SupervisorSettings
from impyard.supervisor.fence import RunFence, fenced
from impyard.tasks import TaskRequest
from testing.fake_openai import FakeOpenAI, envelope, slow
from tests.test_faults_leftovers import plant_process_box
from tests.test_supervisor import KEY, Yard, alive, wait_until, yard

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]

REPO = Path(__file__).resolve().parent.parent
FAR = Holder("far-away", "0ddba11", 4242, "9")  # a host of another machine: only its lease's expiry frees it
TTL = timedelta(seconds=30)
START_S = 60.0
LOST = "lost lease {name}: the lease passed to far-away pid 4242 (token 2, this host held 1)"
# The first model call hangs (for longer than any test waits) and a box waits for it: only a stop ends that run.
PATIENT: dict[str, Any] = {"sessions": {"turn_ceiling_s": 3600}}
HANGS_S = 600.0


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """One database the hosts share: a SQLite file, or a throwaway PostgreSQL database (migrated)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shared.db'}"
        open_database(url=url).close()  # migrated once, before any process opens it
        return url
    found: str = request.getfixturevalue("migrated_postgres_url")
    return found


def lease_rows(db: Database) -> dict[str, tuple[str, int]]:
    """The task runs' lease rows: name -> (holder, token)."""
    query = sa.select(leases.c.name, leases.c.holder, leases.c.token).where(leases.c.name.startswith("task:"))
    return db.read(lambda conn: {name: (holder, int(token)) for name, holder, token in conn.execute(query)})


# --- the fence: which requests, and the refusal ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "is_fenced"),
    [
        ("model.request", True),
        ("discord.send", True),
        ("http.fetch", True),
        ("history.load", True),
        ("history.commit", True),
        ("history.anything_new", True),  # every history act, as the gateway's own lease fence
        ("memory.search", True),  # issue 32 #5: a memory kept, recalled or forgotten is an act too
        ("memory.encode", True),
        ("memory.forget", True),
        ("turn.stage", False),
        ("log", False),
    ],
)
def test_which_requests_a_runs_lease_fences(method: str, is_fenced: bool) -> None:
    assert fenced(method) is is_fenced


class Guard:
    """A run's lease as the fence asks it: None while held, else why it was lost."""

    def __init__(self) -> None:
        self.lost: str | None = None

    def check(self) -> str | None:
        return self.lost


class SeenGateway(Gateway):
    """The real gateway, recording what reached it instead of acting on it."""

    seen: list[str]

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        self.seen.append(method)
        return None


async def test_the_fence_refuses_every_act_once_the_runs_lease_is_lost_with_an_audit_row(
    db: Database,
) -> None:
    policy = load_policy()
    gateway = SeenGateway(
        policy=policy, stores=GatewayStores.over(db, policy=policy, clock=SystemClock(), secrets=[KEY]),
        secrets=[KEY],
    )  # fmt: skip
    gateway.seen = []
    guard = Guard()
    fence = RunFence(gateway, guard)
    spec = BoxSpec("pip", "task:pip", Path("/nonexistent"), run_id="run-1")
    send = DiscordSendParams(channel_id="100000000000000001", content="hello")
    note = LogParams(level="info", message="still here")
    await fence.serve(spec, "discord.send", send)
    assert gateway.seen == ["discord.send"]  # held: the gateway judges it as ever

    why = LOST.format(name="task:t-1/run-1")
    guard.lost = why
    for method in ("discord.send", "model.request", "http.fetch", "history.commit"):
        with pytest.raises(RpcError) as refused:
            await fence.serve(spec, method, send)
        reason = f"this task run holds no lease to act: {why}"
        assert (refused.value.code, refused.value.message, refused.value.data) == (
            ErrorCode.DENIED, f"denied by policy rule lease: {reason}", {"rule": "lease", "reason": reason},
        )  # fmt: skip
    await fence.serve(spec, "log", note)  # a log line is no act: it still reaches the gateway
    assert gateway.seen == ["discord.send", "log"]  # no refused act reached it
    rows = [(r.method, r.verdict, r.rule, r.run_id, r.channel_id, r.reason) for r in gateway.audit.tail(10)]
    assert rows == [
        (method, "denied", "lease", "run-1", "task:pip", f"this task run holds no lease to act: {why}")
        for method in ("discord.send", "model.request", "http.fetch", "history.commit")
    ]
    await gateway.aclose()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"run_lease_renew_s": 0}, "run_lease_renew_s must be more than 0 and less than run_lease_ttl_s"),
        (
            {"run_lease_renew_s": 30, "run_lease_ttl_s": 30},
            "(a lease is renewed before it expires; got 30 and 30 s)",
        ),
        ({"reclaim_every_s": 0}, "reclaim_every_s must be more than 0"),
    ],
)
def test_run_lease_settings_out_of_bounds_are_refused(fields: dict[str, float], says: str) -> None:
    with pytest.raises(ValueError) as refused:
        SupervisorSettings(**fields)  # type: ignore[arg-type]
    assert says in str(refused.value)


def test_a_task_run_holds_its_lease_for_thirty_seconds_renewed_every_ten_and_is_looked_at_every_ten() -> None:
    settings = SupervisorSettings()
    assert (settings.run_lease_ttl_s, settings.run_lease_renew_s, settings.reclaim_every_s) == (
        30.0,
        10.0,
        10.0,
    )
    assert task_lease_name("t-0a1b2c3d4e", "5e1f") == "task:t-0a1b2c3d4e/5e1f"


# --- who reclaims a task left running -------------------------------------------------------------------------


def dead_pid() -> int:
    """The pid of a process of this machine that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def this_machine(pid: int) -> Holder:
    me = liveness.this_process()
    return Holder(me.host, me.boot, pid, "")  # no start time: the pid alone says whether it lives


@asynccontextmanager
async def supervisor_on(url: str, settings: SupervisorSettings | None = None) -> AsyncIterator[Supervisor]:
    """A supervisor of this home on the shared database (no box is run: its upstream answers nothing)."""
    imps = ImpStore()
    imps.add("pip", box={"backend": "process"})
    db = open_database(url=url)
    gateway = build_gateway(
        policy=load_policy(), db=db, surface=RecordingSurface(), secrets=[KEY],
        upstream=UpstreamConfig(base_url="http://127.0.0.1:9/v1", api_key=KEY),
    )  # fmt: skip
    backend = ProcessBackend(warn=False)
    try:
        yield Supervisor(
            db=db, gateway=gateway, imps=imps, backend_for=lambda imp: backend, settings=settings,
            clock=FixedClock(datetime.now(UTC)),
        )  # fmt: skip
    finally:
        await gateway.aclose()
        db.close()


HOLDERS = {
    # who holds the run's lease -> (how it is written, whether a reclaim takes the task)
    "a live host of another machine": (lambda db: LeaseStore(db, me=FAR), False),
    "a host of another machine, expired": (
        lambda db: LeaseStore(db, FixedClock(datetime.now(UTC) - timedelta(minutes=1)), me=FAR),
        True,
    ),
    "a live process of this machine": (lambda db: LeaseStore(db, me=this_machine(os.getppid())), False),
    "a dead process of this machine": (lambda db: LeaseStore(db, me=this_machine(dead_pid())), True),
    "this very process": (lambda db: LeaseStore(db), False),  # another supervisor of this process runs it
    "nobody (a run of before run leases)": (None, True),
}


@pytest.mark.parametrize("holder", list(HOLDERS))
async def test_a_reclaim_takes_only_a_run_whose_lease_expired_or_whose_holder_died(
    database_url: str, holder: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="impyard.supervisor")
    writer, taken = HOLDERS[holder]
    async with supervisor_on(database_url) as supervisor:
        task = supervisor.tasks.add(TaskRequest("pip", "Post the daily summary"))
        name = task_lease_name(task.id, "run-a")
        if writer is not None:
            writer(supervisor.db).acquire(name, {}, TTL)
        before = lease_rows(supervisor.db)
        assert supervisor.tasks.claim(task.id, "run-a", "process") is not None
        passes = [[t.id for t in await supervisor.reclaim_pass()] for _ in range(2)]  # at start, then later
        assert passes == ([[task.id], []] if taken else [[], []])
        after = supervisor.tasks.get(task.id)
        left_to_it = [r.getMessage() for r in caplog.records if "left to it" in r.getMessage()]
        if taken:
            assert (after.state, after.attempts) == ("queued", 1)
            assert [run.result for run in supervisor.tasks.runs(task.id)] == ["reclaimed"]
            token = 1 if writer is None else 2  # a takeover raises the token
            assert lease_rows(supervisor.db) == {name: (str(liveness.this_process()), token)}
            [row] = LeaseStore(supervisor.db).list()
            assert row.expired(datetime.now(UTC))  # released: the run's old holder learns who took it
            assert left_to_it == []
        else:
            assert (after.state, after.run_id) == ("running", "run-a")
            assert lease_rows(supervisor.db) == before  # untouched: same holder, same token
            [said] = left_to_it  # once, however many passes
            assert said.startswith(
                f"task {task.id} is running under a live host's lease, left to it: {name} is held by"
            )


@pytest.mark.parametrize(
    ("holder", "shot"),
    [
        ("a dead process of this machine", True),  # its box pid is this machine's: the orphan is killed
        ("a host of another machine, expired", False),  # its pid means nothing here
        ("a process of this machine before a reboot", False),  # every pid of that boot is gone: maybe reused
    ],
)
async def test_a_box_pid_recorded_by_a_host_of_another_machine_or_boot_is_never_shot_here(
    database_url: str, holder: str, shot: bool
) -> None:
    writers = {
        **{name: writer for name, (writer, _) in HOLDERS.items() if writer is not None},
        "a process of this machine before a reboot": lambda db: LeaseStore(
            db, me=Holder(liveness.this_process().host, "0ldb00t", dead_pid(), "")
        ),
    }
    async with supervisor_on(database_url) as supervisor:
        task = supervisor.tasks.add(TaskRequest("pip", "Post the daily summary"))
        writers[holder](supervisor.db).acquire(task_lease_name(task.id, "run-a"), {}, TTL)
        assert supervisor.tasks.claim(task.id, "run-a", "process") is not None
        planted = plant_process_box(supervisor.imps.state_dir("pip"))  # a box of this imp, by every sign
        try:
            supervisor.tasks.record_pid("run-a", planted.pid)
            [reclaimed] = await supervisor.reclaim_pass()
            assert reclaimed.state == "queued"
            if shot:
                await anyio.to_thread.run_sync(lambda: planted.wait(timeout=10))
            assert (planted.poll() is not None) is shot
        finally:
            if planted.poll() is None:
                planted.kill()
                planted.wait()


# --- a run holds its lease; a run that loses it stops ---------------------------------------------------------


# --- a run holds its lease; a run that loses it stops and acts no more ---------------------------------------


@dataclass
class Capturing:
    """The process backend, keeping the host each box was given (what every request of the box goes through)."""

    inner: BoxBackend = field(default_factory=lambda: ProcessBackend(warn=False))
    hosts: list[tuple[BoxSpec, BoxHost]] = field(default_factory=list)
    name: str = "process"

    @asynccontextmanager
    async def open(self, spec: BoxSpec, host: BoxHost) -> AsyncIterator[RunningBox]:
        self.hosts.append((spec, host))
        async with self.inner.open(spec, host) as box:
            yield box


def steal(db: Database, name: str) -> None:
    """Another machine takes the run's lease over (as after an expiry it could not see from here)."""
    with db.begin() as conn:
        conn.execute(sa.update(leases).where(leases.c.name == name).values(holder=str(FAR), token=2))


async def test_a_run_holds_its_lease_and_once_it_is_taken_over_its_box_stops_and_its_acts_are_refused(
    fake: FakeOpenAI, database_url: str
) -> None:
    fake.script(slow(envelope(answer="never posted"), HANGS_S), purpose="reply", times=1)
    fake.script(envelope(answer="Recovered and posted."), purpose="reply")
    backend = Capturing()
    settings = SupervisorSettings(tick_s=0.05, shutdown_grace_s=1.0, run_lease_renew_s=0.1)
    async with yard(
        fake, backend, settings, database_url=database_url, now=datetime.now(UTC), pip=PATIENT
    ) as y:
        task = y.add()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: y.supervisor.run(stop=stop))
            await anyio.to_thread.run_sync(lambda: fake.wait_for_requests(1, timeout_s=START_S))
            run_a = y.task(task.id).run_id
            assert run_a is not None
            name = task_lease_name(task.id, run_a)
            assert lease_rows(y.db) == {name: (str(liveness.this_process()), 1)}  # held while its box runs

            async def renewed() -> bool:
                [row] = [row for row in LeaseStore(y.db).list() if row.name == name]
                return row.renewed_at > row.acquired_at

            await wait_until(renewed, START_S)
            steal(y.db, name)

            async def done() -> bool:
                return y.task(task.id).state == "done"

            await wait_until(done, START_S)  # stopped, requeued, and run again under a lease of its own
            stop.set()
        first, second = y.supervisor.tasks.runs(task.id)
        assert (first.result, second.result, y.task(task.id).attempts) == ("reclaimed", "done", 2)
        assert first.detail == f"requeued: its supervisor stopped during attempt 1; {LOST.format(name=name)}"
        assert first.box_pid is not None and not alive(first.box_pid)  # its box was stopped
        assert [sent.content for sent in y.surface.sent] == [
            "Recovered and posted."
        ]  # the first never posted
        assert lease_rows(y.db) == {name: (str(FAR), 2)}  # the second run's lease went with it
        spec, host = backend.hosts[0]  # what the first box's requests went through: every act is refused now
        with pytest.raises(RpcError) as refused:
            await host.serve(spec, "discord.send", DiscordSendParams(channel_id="task:pip", content="late"))
        assert refused.value.code == ErrorCode.DENIED
        assert refused.value.data == {
            "rule": "lease", "reason": f"this task run holds no lease to act: {LOST.format(name=name)}",
        }  # fmt: skip
        sends = [
            (r.verdict, r.rule)
            for r in y.gateway.audit.tail(50)
            if (r.method, r.run_id) == ("discord.send", run_a)
        ]
        assert sends == [("denied", "lease")]  # refused, and audited


# --- two hosts, two real processes, one database --------------------------------------------------------------

HOST_A = """
import sys, anyio
from impyard.backends.process import ProcessBackend
from impyard.supervisor import SupervisorSettings, open_supervisor
from impyard.gateway.surfaces import RecordingSurface

async def main():
    backend = ProcessBackend(warn=False)
    settings = SupervisorSettings(
        tick_s=0.05, run_lease_ttl_s=float(sys.argv[1]), run_lease_renew_s=float(sys.argv[2])
    )
    async with open_supervisor(
        surface=RecordingSurface(), backend_for=lambda imp: backend, settings=settings
    ) as supervisor:
        print("supervising", flush=True)
        await supervisor.run()

anyio.run(main)
"""
HOST_B = SupervisorSettings(tick_s=0.05, shutdown_grace_s=1.0, reclaim_every_s=0.1)


def start_host_a(home: Path, url: str, fake: FakeOpenAI, log: Path, ttl_s: float, renew_s: float) -> Any:
    """``impyard supervise`` of another home on the same database, as its own process."""
    ImpStore(home).add("pip", box={"backend": "process"}, **PATIENT)
    env = {
        **os.environ, "IMPYARD_HOME": str(home), "IMPYARD_DATABASE_URL": url, "OPENAI_API_KEY": KEY,
        "OPENAI_BASE_URL": fake.base_url, "PYTHONPATH": str(REPO),
    }  # fmt: skip
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", HOST_A, str(ttl_s), str(renew_s)], stdout=subprocess.PIPE, stderr=stderr,
            text=True, env=env, cwd=REPO,
        )  # fmt: skip
    assert process.stdout is not None
    said = process.stdout.readline().strip()
    assert said == "supervising", log.read_text()[-2000:]
    return process


@asynccontextmanager
async def host_a_runs_a_slow_task(
    fake: FakeOpenAI, url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, ttl_s: float = 30.0
) -> AsyncIterator[tuple[Yard, Any, str, anyio.Event]]:
    """Host A (a process of its own, home-a) runs a task whose model call is slow; host B (this process, its
    own home, the same database) then runs its supervisor, and must leave the task to A while A lives. Yields
    B, A's process, the name of A's run lease, and B's stop event (B runs until it is set)."""
    fake.script(slow(envelope(answer="never posted"), HANGS_S), purpose="reply", times=1)
    fake.script(envelope(answer="Recovered and posted."), purpose="reply")
    caplog.set_level(logging.INFO, logger="impyard.supervisor")
    async with yard(
        fake, ProcessBackend(warn=False), HOST_B, database_url=url, now=datetime.now(UTC), pip=PATIENT
    ) as y:
        task = y.add()
        log = tmp_path / "host-a.log"
        process = await anyio.to_thread.run_sync(
            lambda: start_host_a(tmp_path / "home-a", url, fake, log, ttl_s, ttl_s / 5)
        )
        try:
            await anyio.to_thread.run_sync(lambda: fake.wait_for_requests(1, timeout_s=START_S))
            run_a = y.task(task.id).run_id
            assert run_a is not None
            name = task_lease_name(task.id, run_a)
            [(holder, token)] = lease_rows(y.db).values()
            parsed = Holder.parse(holder)
            assert parsed is not None and (parsed.pid, token) == (process.pid, 1)  # A holds its run's lease
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: y.supervisor.run(stop=stop))

                async def passes() -> bool:
                    return y.supervisor.reclaim_passes >= 3  # at start, then twice more

                await wait_until(passes, START_S)
                still = y.task(task.id)
                assert (still.state, still.run_id, still.attempts) == ("running", run_a, 1)  # left to A
                assert lease_rows(y.db) == {name: (holder, 1)}
                said = [r.getMessage() for r in caplog.records if "left to it" in r.getMessage()]
                assert len(said) == 1 and re.fullmatch(  # said once, naming A, however many passes
                    rf"task {task.id} is running under a live host's lease, left to it: {re.escape(name)} is held "
                    rf"by {re.escape(socket.gethostname())} \(pid {process.pid}\); it is free once that process "
                    r"stops, or in \d+ s if it stops renewing",
                    said[0],
                ), said
                yield y, process, name, stop
        finally:
            process.kill()
            process.wait()


async def b_reclaimed_it_exactly_once(y: Yard, name: str) -> None:
    task_id = name.removeprefix("task:").split("/")[0]

    async def done() -> bool:  # and B's own run has let its lease go (just after it wrote the run's end)
        return y.task(task_id).state == "done" and task_id not in y.supervisor.running

    await wait_until(done, START_S)
    first, second = y.supervisor.tasks.runs(task_id)
    assert (first.result, second.result, y.task(task_id).attempts) == ("reclaimed", "done", 2)
    assert first.detail == "requeued: its supervisor stopped during attempt 1"
    assert [sent.content for sent in y.surface.sent] == ["Recovered and posted."]
    assert lease_rows(y.db) == {name: (str(liveness.this_process()), 2)}  # B took it over, then let it go


async def test_host_b_leaves_a_task_to_live_host_a_and_reclaims_it_once_when_a_is_killed(
    fake: FakeOpenAI, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with host_a_runs_a_slow_task(fake, database_url, tmp_path, caplog) as (y, host_a, name, stop):
        os.kill(host_a.pid, signal.SIGKILL)  # its lease had 30 s to run: B sees it dead, on this machine
        await anyio.to_thread.run_sync(host_a.wait)
        await b_reclaimed_it_exactly_once(y, name)
        stop.set()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reclaimed ")]
    assert said == ["reclaimed 1 task(s) left running by a supervisor that stopped"]


async def test_host_b_reclaims_a_frozen_host_as_task_once_its_lease_expired_and_a_then_stops_its_box(
    fake: FakeOpenAI, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A frozen host lives (its pid answers) but renews nothing, as a host of another machine cut off: only its
    lease's expiry frees the task. Woken, it finds the lease lost and stops its box, and ends nothing twice."""
    async with host_a_runs_a_slow_task(fake, database_url, tmp_path, caplog, ttl_s=5.0) as (
        y,
        host_a,
        name,
        stop,
    ):
        box_a = y.supervisor.tasks.runs(name.removeprefix("task:").split("/")[0])[0].box_pid
        assert box_a is not None and alive(box_a)
        os.kill(host_a.pid, signal.SIGSTOP)
        try:
            await b_reclaimed_it_exactly_once(y, name)
        finally:
            os.kill(host_a.pid, signal.SIGCONT)

        async def box_a_stopped() -> bool:
            return not alive(box_a)

        await wait_until(box_a_stopped, START_S)
        log = (tmp_path / "host-a.log").read_text()
        assert f"lost lease {name}: " in log and "; stopping its box" in log
        assert host_a.poll() is None  # A goes on: only that run stopped
        stop.set()
    task_id = name.removeprefix("task:").split("/")[0]
    assert [run.result for run in y.supervisor.tasks.runs(task_id)] == [
        "reclaimed",
        "done",
    ]  # A ended nothing
