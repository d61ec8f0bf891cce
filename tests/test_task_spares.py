"""Issue 37: a task run (depart, reflect, sleep, prompt) takes a spare box of its imp where its host keeps one — the
session manager's pool, under ``impyard serve`` and ``impyard chat`` — exactly as a conversation's first message
does: its /state handed in and back, ``box.init`` once, ``task.run``, closed by the pool. A spare that fails before
its task begins costs nothing: the task starts a box, once. A spare is never handed to a second task or to another
imp; a lost lease stops a claimed spare's box; a standalone ``impyard supervise --once`` keeps no spare.

Real box processes (the process backend, the real box program) on the real gateway and the fake OpenAI, as
``tests/test_supervisor.py`` runs them; the conversation's own box talks to a scripted host, as in
``tests/test_spares.py``. Docker in the test marked by its fixture."""

from __future__ import annotations

import io
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner

from impyard import metrics
from impyard.backends import BoxBackend
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.plan import LABEL_CHANNEL, LABEL_ROLE
from impyard.backends.process import ProcessBackend
from impyard.backends.runtimes import RuntimeChoice
from impyard.cli import cli
from impyard.clock import SystemClock
from impyard.conversation.sessions import SessionKey, SessionManager, SessionSettings
from impyard.conversation.spares import Spare, SpareSettings, same_lockdown
from impyard.gateway.gate_pump import GatePump
from impyard.imps.store import ImpStore
from impyard.storage.db import open_database
from impyard.storage.leases import LeaseStore, task_lease_name
from impyard.supervisor import Supervisor, SupervisorSettings
from impyard.supervisor.orphans import looks_like_box_process
from impyard.tasks import TaskRequest, TaskStore
from testing.fake_openai import FakeOpenAI, envelope, slow
from testing.inprocess import InProcessBackend
from tests.discord_yard import ALICE, GENERAL
from tests.discord_yard import serving as discord_serving
from tests.scripted import ScriptedHost
from tests.test_departures_chat import Pipe, add_pip, assert_departed_from_the_terminal, chat, depart_tasks
from tests.test_sessions import Recorder, delivery
from tests.test_spares import Counting, SparePlan, ready, until
from tests.test_supervisor import FAST, KEY, Yard, alive, wait_until, yard
from tests.test_task_leases import HANGS_S, PATIENT, START_S, steal

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]

SPARE = SessionSettings(spares=SpareSettings(count=1, idle_s=600))


@dataclass
class Alike(Counting):
    """A backend that notes each box it starts, around a real one, and starts the box the real one would (its
    ``lockdown``): a spare another backend of the same lockdown started serves its tasks."""

    @property
    def lockdown(self) -> object:
        return getattr(self.inner, "lockdown", None)


@asynccontextmanager
async def host_of(
    y: Yard, backend: BoxBackend, recorder: Recorder, settings: SessionSettings = SPARE, **kwargs: object
) -> AsyncIterator[SessionManager]:
    """The session manager of the yard's host: its boxes' /state, and its spares', under the home's state root."""
    plan = SparePlan(backend, y.imps.box_state_dir("pip").parent.parent, settings)
    async with SessionManager(plan=plan, host=ScriptedHost(), events=recorder, **kwargs) as sessions:  # type: ignore[arg-type]
        yield sessions


def supervisor_of(
    y: Yard, backend: BoxBackend, sessions: SessionManager, settings: SupervisorSettings = FAST
) -> Supervisor:
    """The supervisor of that host: its task runs claim from the session manager's pool (serve, chat)."""
    return Supervisor(
        db=y.db, gateway=y.gateway, imps=y.imps, backend_for=lambda imp: backend, clock=y.clock,
        settings=settings, pump=GatePump(y.gateway), spares=sessions.spares,
    )  # fmt: skip


async def conversation(sessions: SessionManager, recorder: Recorder, channel: str = "a") -> str:
    """A conversation of pip's: a box is started for it, then pip's spare; the spare's run id."""
    sessions.deliver(delivery(1, key=SessionKey("pip", channel)))
    await recorder.until(lambda: recorder.answered() == ["m1"])
    await until(lambda: len(ready(sessions)) == 1)
    (spare,) = ready(sessions)
    return spare


def journal(y: Yard, task_id: str) -> list[dict[str, object]]:
    """What the task's boxes wrote in their /state's journal, read from the task's own dir."""
    path = y.imps.task_state_dir("pip", task_id) / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def spare_dirs(y: Yard, imp: str = "pip") -> list[str]:
    spares = y.imps.box_state_dir(imp) / "spares"
    return sorted(entry.name for entry in spares.iterdir()) if spares.exists() else []


def test_a_spare_serves_only_a_backend_that_would_start_the_same_box() -> None:
    """Which spares a task's backend may take: one it started, or one of a backend with the same lockdown —
    whatever role label the two give their boxes — never one of another command, image, limit or runtime."""
    process = ProcessBackend(warn=False)
    runc = RuntimeChoice("runc", "the test")  # the test's, never IMPYARD_BOX_RUNTIME's
    assert same_lockdown(process, ProcessBackend(warn=False))
    assert not same_lockdown(process, ProcessBackend(warn=False, command=[*process.command, "--other"]))
    docker = DockerBackend("impyard-box:abc", home_id="h1", runtime=runc, role="session")
    assert same_lockdown(docker, DockerBackend("impyard-box:abc", home_id="h1", runtime=runc, role="task"))
    for other in (
        DockerBackend("impyard-box:def", home_id="h1", runtime=runc),
        DockerBackend("impyard-box:abc", home_id="h1", runtime=RuntimeChoice("runsc", "the test")),
        DockerBackend("impyard-box:abc", home_id="h1", runtime=runc, limits=DockerLimits(memory="1g")),
        DockerBackend("impyard-box:abc", home_id="h2", runtime=runc),
    ):
        assert not same_lockdown(docker, other)
    assert not same_lockdown(docker, process)
    in_process = InProcessBackend()
    assert same_lockdown(in_process, in_process) and not same_lockdown(in_process, InProcessBackend())


async def test_a_task_run_after_a_conversation_is_served_by_the_imps_spare(fake: FakeOpenAI) -> None:
    metrics.fresh()
    fake.script(envelope(answer="Noted: a quiet day."), purpose="reply")
    tasks_backend, recorder = Alike(ProcessBackend(warn=False)), Recorder()
    async with yard(fake, tasks_backend) as y, host_of(y, ProcessBackend(warn=False), recorder) as sessions:
        spare = await conversation(sessions, recorder)
        supervisor = supervisor_of(y, tasks_backend, sessions)  # another backend object, the same lockdown
        task = y.add("Note what you did today")
        await supervisor.run(once=True)

        done = y.task(task.id)
        assert (done.state, done.attempts, done.run_id) == ("done", 1, spare)  # its run is the spare's
        assert tasks_backend.opened == [] and supervisor.started == 0  # no box was started for it
        assert spare not in ready(sessions) and sessions.spares.claimed == 1
        assert metrics.sample("impyard_box_starts_total", runtime="process", kind="spare") == 1
        assert [sent.content for sent in y.surface.sent] == ["Noted: a quiet day."]
        rows = [r.method for r in y.gateway.audit.tail(50) if r.run_id == spare]
        assert rows == ["model.request", "discord.send", "history.commit"]  # judged and audited as the task's
        # Its /state is the task's own dir again before the run ended: the journal line its box wrote is there.
        assert [(line["task_id"], line["outcome"]) for line in journal(y, task.id)] == [(task.id, "done")]
        assert spare not in spare_dirs(y) and f"{spare}.channel" not in spare_dirs(y)
        await until(lambda: len(ready(sessions)) == 1)  # the pool refills
        assert ready(sessions) != [spare]


async def test_a_task_of_an_imp_with_no_spare_starts_its_own_box_and_another_imps_spare_stays(
    fake: FakeOpenAI,
) -> None:
    fake.script(envelope(answer="Noted."), purpose="reply")
    tasks_backend, recorder = Alike(ProcessBackend(warn=False)), Recorder()
    async with yard(fake, tasks_backend) as y, host_of(y, ProcessBackend(warn=False), recorder) as sessions:
        y.imps.add("pop", box={"backend": "process"})
        supervisor = supervisor_of(y, tasks_backend, sessions)
        first = y.add("Before any conversation")
        await supervisor.run(once=True)
        assert y.task(first.id).state == "done" and supervisor.started == 1
        assert sessions.spares.started == 0  # a task never starts an imp's spares: its conversations do

        spare = await conversation(sessions, recorder)
        other = y.supervisor.tasks.add(TaskRequest("pop", "Another imp's task"))
        await supervisor.run(once=True)
        assert y.task(other.id).state == "done" and y.task(other.id).run_id != spare
        assert [spec.channel_id for spec in tasks_backend.opened] == ["task:pip", "task:pop"]
        assert ready(sessions) == [spare] and sessions.spares.claimed == 0  # pip's spare was never pop's


async def test_a_spare_that_dies_as_its_task_claims_it_leaves_the_task_to_a_started_box_once(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics.fresh()
    fake.script(envelope(answer="Noted, on a box of its own."), purpose="reply")
    tasks_backend, recorder = Alike(ProcessBackend(warn=False)), Recorder()
    async with yard(fake, tasks_backend) as y, host_of(y, ProcessBackend(warn=False), recorder) as sessions:
        spare = await conversation(sessions, recorder)
        claim = sessions.spares.claim

        def claim_and_die(imp: str, backend: BoxBackend) -> Spare | None:
            got = claim(imp, backend)
            if got is not None and got.box is not None:
                got.box.process.kill()  # it dies just as its task claims it: before its box.init
            return got

        monkeypatch.setattr(sessions.spares, "claim", claim_and_die)
        supervisor = supervisor_of(y, tasks_backend, sessions)
        task = y.add("Note what you did today")
        await supervisor.run(once=True)

        done = y.task(task.id)
        assert (done.state, done.attempts, done.run_id) == ("done", 1, spare)  # one run, its run id kept
        assert [run.result for run in y.supervisor.tasks.runs(task.id)] == ["done"]
        [started] = tasks_backend.opened  # a box started for it, once
        assert (started.run_id, started.channel_id) == (spare, "task:pip") and supervisor.started == 1
        assert len(fake.requests) == 1 and [s.content for s in y.surface.sent] == [
            "Noted, on a box of its own."
        ]
        assert metrics.sample("impyard_box_starts_total", runtime="process", kind="spare") == 0
        assert [line["task_id"] for line in journal(y, task.id)] == [task.id]
        assert spare not in spare_dirs(y)


async def test_a_spare_is_never_handed_to_a_second_task(fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Noted."), purpose="reply")
    tasks_backend, recorder = Alike(ProcessBackend(warn=False)), Recorder()
    async with yard(fake, tasks_backend) as y, host_of(y, ProcessBackend(warn=False), recorder) as sessions:
        spare = await conversation(sessions, recorder)
        sessions.plan.settings = SessionSettings(spares=SpareSettings(count=0, idle_s=600))  # type: ignore[attr-defined]
        supervisor = supervisor_of(y, tasks_backend, sessions)  # no refill now: one spare, two tasks at once
        tasks = [y.add("One"), y.add("Two")]
        await supervisor.run(once=True)
        done = [y.task(task.id) for task in tasks]
        assert [task.state for task in done] == ["done", "done"]
        runs = [task.run_id for task in done]
        assert (
            runs.count(spare) == 1 and len(set(runs)) == 2
        )  # one of them got it, the other a box of its own
        assert [spec.run_id for spec in tasks_backend.opened] == [run for run in runs if run != spare]
        assert sessions.spares.claimed == 1 and supervisor.started == 1


async def test_a_lost_lease_stops_the_box_of_the_spare_its_run_claimed(fake: FakeOpenAI) -> None:
    fake.script(slow(envelope(answer="never posted"), HANGS_S), purpose="reply", times=1)
    fake.script(envelope(answer="Recovered and posted."), purpose="reply")
    settings = SupervisorSettings(tick_s=0.05, shutdown_grace_s=1.0, run_lease_renew_s=0.1)
    tasks_backend, recorder = Alike(ProcessBackend(warn=False)), Recorder()
    async with (
        yard(fake, tasks_backend, settings, now=datetime.now(UTC), pip=PATIENT) as y,
        host_of(y, ProcessBackend(warn=False), recorder) as sessions,
    ):
        spare = await conversation(sessions, recorder)
        (claimed,) = [s for s in sessions.spares.spares if s.spec.run_id == spare]
        supervisor = supervisor_of(y, tasks_backend, sessions, settings)
        task = y.add()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: supervisor.run(stop=stop))
            await anyio.to_thread.run_sync(lambda: fake.wait_for_requests(1, timeout_s=START_S))
            assert y.task(task.id).run_id == spare  # its box is the spare, waiting on its model call
            name = task_lease_name(task.id, spare)

            async def renewed() -> bool:
                [row] = [row for row in LeaseStore(y.db).list() if row.name == name]
                return row.renewed_at > row.acquired_at

            await wait_until(renewed, START_S)
            steal(y.db, name)

            async def done() -> bool:
                return y.task(task.id).state == "done"

            await wait_until(done, START_S)  # stopped, requeued, and run again
            stop.set()
        first, second = y.supervisor.tasks.runs(task.id)
        assert (first.run_id, first.result, second.result) == (spare, "reclaimed", "done")
        assert claimed.box is not None and claimed.box.exited.is_set() and claimed.closed.is_set()
        assert first.box_pid is not None and not alive(first.box_pid)  # the spare's box was stopped
        assert [sent.content for sent in y.surface.sent] == ["Recovered and posted."]
        assert spare not in spare_dirs(y)  # its /state went back to the task's dir


async def test_a_task_on_a_spare_is_killed_at_its_ceiling(fake: FakeOpenAI) -> None:
    fake.script(slow(envelope(answer="never posted"), HANGS_S), purpose="reply")
    settings = SupervisorSettings(tick_s=0.05, max_ceiling_s=3.0)
    tasks_backend, recorder = Alike(ProcessBackend(warn=False)), Recorder()
    async with (
        yard(fake, tasks_backend, settings, pip=PATIENT) as y,
        host_of(y, ProcessBackend(warn=False), recorder) as sessions,
    ):
        spare = await conversation(sessions, recorder)
        (claimed,) = [s for s in sessions.spares.spares if s.spec.run_id == spare]
        task = y.add()
        await supervisor_of(y, tasks_backend, sessions, settings).run(once=True)
        failed = y.task(task.id)
        assert failed.state == "failed" and "killed at its ceiling of 3s" in (failed.outcome or "")
        [run] = y.supervisor.tasks.runs(task.id)
        assert (run.run_id, run.result) == (spare, "ceiling") and tasks_backend.opened == []
        assert run.box_pid is not None and not alive(run.box_pid)  # the spare's box is gone, not abandoned
        assert claimed.closed.is_set() and spare not in spare_dirs(y) and y.surface.sent == []


async def test_the_idle_drain_counts_from_the_last_conversation_not_from_a_tasks_claim(
    fake: FakeOpenAI,
) -> None:
    """A task taking the imp's spare is no conversation: the spares still close ``spares_idle_s`` after the
    imp's last conversation ended."""
    fake.script(envelope(answer="Noted."), purpose="reply")
    asked: list[float] = []
    waiting: list[anyio.Event] = []
    now = [0.0]

    async def sleep(seconds: float) -> None:
        event = anyio.Event()
        asked.append(seconds)
        waiting.append(event)
        await event.wait()

    tasks_backend, recorder = Alike(ProcessBackend(warn=False)), Recorder()
    async with (
        yard(fake, tasks_backend) as y,
        host_of(y, ProcessBackend(warn=False), recorder, sleep=sleep, monotonic=lambda: now[0]) as sessions,
    ):
        spare = await conversation(sessions, recorder)
        while SessionKey("pip", "a") in sessions.sessions:  # the conversation idles out
            await until(lambda: bool(waiting))
            while waiting:
                waiting.pop().set()
            await anyio.sleep(0.05)
        await until(lambda: 600 in asked)  # the imp's idle period began as its conversation ended
        now[0] = 400.0
        seen = len(asked)
        task = y.add("Note what you did today")
        await supervisor_of(y, tasks_backend, sessions).run(once=True)
        assert y.task(task.id).run_id == spare
        await until(lambda: len(ready(sessions)) == 1)
        assert asked[seen:] and all(
            left <= 200 for left in asked[seen:]
        )  # 600 s from the end, not from the task


@pytest.mark.fake_model(key=KEY, env=True, answer="Hello from Pip!")
async def test_leaving_a_chat_departs_on_the_spare_its_conversation_left(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    """``impyard chat``'s departures claim from its session manager's pool (as ``serve``'s tasks do)."""
    metrics.fresh()
    add_pip()
    pipe, out = Pipe(), io.StringIO()
    async with anyio.create_task_group() as tg:
        tg.start_soon(chat, pipe, out)
        pipe.send("hello pip\n")
        await until(lambda: "pip> Hello from Pip!" in out.getvalue(), timeout=90)
        await until(lambda: metrics.sample("impyard_boxes", imp="pip", state="spare") == 1, timeout=90)
        pipe.send("/quit\n")
        pipe.close()
    [task] = depart_tasks()
    assert_departed_from_the_terminal(task)  # in the conversation's scopes, on the spare
    assert metrics.sample("impyard_box_starts_total", runtime="process", kind="spare") == 1
    assert (
        metrics.sample("impyard_box_starts_total", runtime="process", kind="cold") == 1
    )  # the chat's own box


async def test_under_serve_a_task_takes_the_spare_its_bots_conversation_left(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    """``impyard serve --supervise``: the supervisor's task backend (role ``task``) and the session manager's are
    two backends of one lockdown; its tasks claim from the session manager's pool."""
    metrics.fresh()
    fast = SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0)
    async with discord_serving(
        monkeypatch, model, backend=ProcessBackend(warn=False), supervise=True, supervisor_settings=fast,
        pip={"box": {"backend": "process"}},
    ) as yard:  # fmt: skip
        asked = yard.fake.post_message(GENERAL, ALICE, "hello pip")
        await yard.answered(asked.id)
        await until(lambda: metrics.sample("impyard_boxes", imp="pip", state="spare") == 1, timeout=60)
        db = open_database()
        try:
            tasks = TaskStore(db, SystemClock(), ImpStore())
            task = tasks.add(TaskRequest("pip", "Note it in the log"))
            await until(lambda: tasks.get(task.id).state == "done", timeout=60)
        finally:
            db.close()
        assert metrics.sample("impyard_box_starts_total", runtime="process", kind="spare") == 1


def box_processes(state_dir: Path) -> list[int]:
    """This machine's box processes of an imp (their /state under its box state dir)."""
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if pid != os.getpid() and looks_like_box_process(pid, state_dir)]


@pytest.mark.fake_model(key=KEY, env=True)
def test_supervise_once_keeps_no_spare_and_leaves_no_box(impyard_home: Path, fake: FakeOpenAI) -> None:
    """A standalone supervisor keeps no spares (docs/tasks.md): its tasks start their own boxes, and none is left
    once it exits, whatever the imp's ``[box] spares``."""
    ImpStore().add("pip", box={"backend": "process", "spares": 2})
    fake.script(envelope(answer="Noted."), purpose="reply")
    db = open_database()
    try:
        tasks = [TaskStore(db, SystemClock()).add(TaskRequest("pip", f"Note {n}")) for n in range(3)]
    finally:
        db.close()
    result = CliRunner().invoke(cli, ["supervise", "--once"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    db = open_database()
    try:
        assert [TaskStore(db, SystemClock()).get(task.id).state for task in tasks] == ["done"] * 3
    finally:
        db.close()
    state = ImpStore().box_state_dir("pip")
    assert not (state / "spares").exists()  # no spare was ever started
    assert box_processes(state) == []


async def test_under_docker_a_task_runs_on_the_spare_a_conversation_left(
    fake: FakeOpenAI, docker_backend: DockerBackend
) -> None:
    fake.script(envelope(answer="Noted under Docker."), purpose="reply")
    tasks_backend = Alike(
        DockerBackend(
            docker_backend.image, home_id=docker_backend.home_id, runtime=docker_backend.runtime_choice,
            limits=docker_backend.limits, role="task",
        )
    )  # fmt: skip
    recorder = Recorder()
    async with yard(fake, tasks_backend) as y, host_of(y, docker_backend, recorder) as sessions:
        sessions.deliver(delivery(1, key=SessionKey("pip", "a")))
        await recorder.until(lambda: recorder.answered() == ["m1"], timeout=120)
        await until(lambda: len(ready(sessions)) == 1, timeout=120)
        (spare,) = ready(sessions)
        [container] = docker_backend.labelled(run=spare)
        assert (container.labels[LABEL_CHANNEL], container.labels[LABEL_ROLE]) == ("", "session")
        task = y.add("Note what you did today")
        await supervisor_of(y, tasks_backend, sessions).run(once=True)
        done = y.task(task.id)
        assert (done.state, done.run_id) == ("done", spare) and tasks_backend.opened == []
        assert [sent.content for sent in y.surface.sent] == ["Noted under Docker."]
        assert docker_backend.labelled(run=spare) == []  # its box is gone, found by the run's label
        assert [line["task_id"] for line in journal(y, task.id)] == [task.id]
