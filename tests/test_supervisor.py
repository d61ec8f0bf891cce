"""The supervise loop end to end: real boxes, the real gateway, the fake OpenAI, a recording surface, a fixed clock.

Boxes run the real box program in this process (``testing.inprocess``) where the test is about the loop; as
box processes where one is killed, hangs or is orphaned, and on every backend (process, Docker where the
``backend`` fixture can start it) in the first test; time that decides anything is the FixedClock, moved by the test;
the loop's own tick is real but short.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from impyard.backends import BoxBackend, BoxHost, BoxSpec, RunningBox
from impyard.backends.docker import DockerBackend, run_argv
from impyard.backends.process import ProcessBackend
from impyard.clock import FixedClock
from impyard.gateway.audit import AuditRecord
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.core import Gateway
from impyard.gateway.gate_pump import GatePump
from impyard.gateway.gates import Approver, GateStore
from impyard.gateway.ledger import Ledger
from impyard.gateway.policy import load_policy
from impyard.gateway.spending import read_spend
from impyard.gateway.surfaces import RecordingSurface
from impyard.gateway.trust import ChannelInfo, DbChannelTrust
from impyard.host import build_gateway
from impyard.imps.store import ImpStore
from impyard.storage.db import Database, open_database
from impyard.supervisor import Supervisor, SupervisorSettings
from impyard.tasks import Task, TaskRequest
from impyard.tasks.schedules import ScheduleRequest
from testing.fake_openai import FakeOpenAI, envelope, slow
from testing.inprocess import InProcessBackend

KEY = "sk-impyard-supervise-SECRET-77aa"
pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]
T0 = datetime(2026, 5, 11, 8, 59, 59, tzinfo=UTC)  # a Monday, one second before 09:00 UTC
TRUSTED = "100000000000000001"  # a channel the operator trusts: the task's post goes out alone
UNTRUSTED = "100000000000000002"  # a channel nobody trusted: the post is gated
BAD_BOX = Path(__file__).parent / "boxes" / "bad_box.py"
FAST = SupervisorSettings(tick_s=0.05, shutdown_grace_s=2.0)


@dataclass
class Yard:
    db: Database
    clock: FixedClock
    surface: RecordingSurface
    fake: FakeOpenAI
    gateway: Gateway
    imps: ImpStore
    supervisor: Supervisor

    def task(self, task_id: str) -> Task:
        return self.supervisor.tasks.get(task_id)

    def add(self, prompt: str = "Post the daily summary", **fields: Any) -> Task:
        return self.supervisor.tasks.add(TaskRequest("pip", prompt, **fields))

    def fresh_supervisor(self, backend: BoxBackend, settings: SupervisorSettings = FAST) -> Supervisor:
        return Supervisor(db=self.db, gateway=self.gateway, imps=self.imps, backend_for=lambda imp: backend,
                          clock=self.clock, settings=settings, pump=GatePump(self.gateway))  # fmt: skip


@asynccontextmanager
async def yard(
    fake: FakeOpenAI,
    backend: BoxBackend,
    settings: SupervisorSettings = FAST,
    *,
    database_url: str | None = None,
    now: datetime = T0,
    pip: dict[str, Any] | None = None,
) -> AsyncIterator[Yard]:
    """``database_url``: a database other hosts share (default: this home's); ``now``: where the clock starts;
    ``pip``: more of pip's settings."""
    imps = ImpStore()
    imps.add("pip", **{"box": {"backend": "process"}, **(pip or {})})
    db = open_database(url=database_url)
    clock = FixedClock(now)
    surface = RecordingSurface()
    gateway = build_gateway(
        policy=load_policy(), db=db, surface=surface, clock=clock,
        upstream=UpstreamConfig(base_url=fake.base_url, api_key=KEY), secrets=[KEY],
    )  # fmt: skip
    DbChannelTrust(db, clock).upsert(ChannelInfo(TRUSTED, kind="guild", name="daily", trusted=True))
    DbChannelTrust(db, clock).upsert(ChannelInfo(UNTRUSTED, kind="guild", name="general", trusted=False))
    supervisor = Supervisor(
        db=db, gateway=gateway, imps=imps, backend_for=lambda imp: backend, clock=clock, settings=settings,
        pump=GatePump(gateway),
    )  # fmt: skip
    try:
        yield Yard(db, clock, surface, fake, gateway, imps, supervisor)
    finally:
        await gateway.aclose()
        db.close()


def hanging_box() -> ProcessBackend:
    """Answers box.init, then never answers task.run (and outlives a closed stdin by a minute)."""
    return ProcessBackend(command=[sys.executable, str(BAD_BOX), "silent"], warn=False)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


async def wait_until(condition: Any, timeout: float = 20.0, what: str = "condition") -> None:
    with anyio.fail_after(timeout):
        while not await condition():
            await anyio.sleep(0.05)


# --- end to end ----------------------------------------------------------------------------------------


async def test_a_scheduled_task_runs_in_a_real_box_and_posts_through_the_gateway(
    fake: FakeOpenAI, backend: Any
) -> None:
    fake.script(
        envelope(answer="Daily summary: all quiet."),
        purpose="reply",
        usage={"prompt_tokens": 200, "completion_tokens": 20},
    )
    async with yard(fake, backend) as y:
        schedule = y.supervisor.schedules.add(
            ScheduleRequest("pip", "Post the daily summary", cron="0 9 * * *", channel_id=TRUSTED)
        )
        await y.supervisor.run(once=True)
        assert y.supervisor.tasks.latest() == [] and y.surface.sent == []  # 08:59:59: not yet
        y.clock.advance(seconds=1.2)
        await y.supervisor.run(once=True)
        [task] = y.supervisor.tasks.latest()
        assert (task.state, task.origin, task.schedule_id, task.attempts) == (
            "done",
            "schedule",
            schedule.id,
            1,
        )
        assert task.scheduled_for == datetime(2026, 5, 11, 9, 0, tzinfo=UTC)
        [sent] = y.surface.sent
        assert (sent.channel_id, sent.content) == (TRUSTED, "Daily summary: all quiet.")
        # The host attests what happened from its own records; the box's answer is only a report.
        assert (
            task.outcome is not None
            and task.outcome.startswith("done (")
            and "1 post delivered" in task.outcome
        )
        assert task.box_outcome == "done"
        rows = [r for r in y.gateway.audit.tail(50) if r.run_id == task.run_id]
        assert [(r.method, r.verdict) for r in rows] == [
            ("model.request", "allowed"),
            ("discord.send", "allowed"),
            ("history.commit", "allowed"),  # issue 22: the task's line in its channel, kept by the host
        ]
        assert [r.method for r in y.supervisor.tasks.audit_trail(task.id)] == [
            "model.request",
            "discord.send",
            "history.commit",
        ]
        [request] = fake.requests
        assert request.headers["authorization"] == f"Bearer {KEY}"
        assert "Post the daily summary" in "\n".join(str(m["content"]) for m in request.body["messages"])
        assert y.supervisor.schedules.get(schedule.id).next_run == datetime(2026, 5, 12, 9, 0, tzinfo=UTC)
        [run] = y.supervisor.tasks.runs(task.id)
        assert run.result == "done" and run.backend == backend.name
        # issue 34: the ledger knows the call was the task run's, so the Budget page counts it under tasks
        [charged] = [r.cost_micros for r in rows if r.method == "model.request"]
        spend = read_spend(y.db, last_day=y.clock.now().date(), days=1).of("pip")
        assert charged > 0 and spend.days[0].charged == {"tasks": charged}
        if isinstance(backend, DockerBackend):
            assert backend.labelled(run=task.run_id or "") == []  # the one-shot box is gone


async def test_the_concurrency_cap_holds_with_ten_due_tasks(fake: FakeOpenAI) -> None:
    fake.script(slow(envelope(answer="done"), 0.4), purpose="reply")
    counting = CountingBackend(InProcessBackend())
    async with yard(fake, counting, SupervisorSettings(concurrency=3, tick_s=0.05)) as y:
        tasks = [y.add(f"task {n}", channel_id=TRUSTED) for n in range(10)]
        await y.supervisor.run(once=True)
        assert counting.peak == 3  # never more boxes at once than the cap, and the cap is used
        assert counting.opened == 10
        assert [y.task(t.id).state for t in tasks] == ["done"] * 10
        assert len(y.surface.sent) == 10


@dataclass
class CountingBackend:
    """Wraps a backend and counts the boxes alive at once."""

    inner: BoxBackend
    alive: int = 0
    peak: int = 0
    opened: int = 0
    name: str = "process"

    @asynccontextmanager
    async def open(self, spec: BoxSpec, host: BoxHost) -> AsyncIterator[RunningBox]:
        self.alive += 1
        self.opened += 1
        self.peak = max(self.peak, self.alive)
        try:
            async with self.inner.open(spec, host) as box:
                yield box
        finally:
            self.alive -= 1


async def test_a_budget_exhausted_imps_task_is_deferred_and_runs_after_the_window_rolls_over(
    fake: FakeOpenAI,
) -> None:
    fake.script(envelope(answer="Good morning."), purpose="reply")
    counting = CountingBackend(InProcessBackend())
    async with yard(fake, counting) as y:
        y.clock.set(datetime(2026, 5, 11, 21, 30, tzinfo=UTC))
        ledger = Ledger(y.db, y.gateway.policy, y.clock)
        ledger.settle(
            ledger.reserve("pip", 2_000_000), 2_000_000
        )  # pip's whole day ($2, the default per imp)
        task = y.add(channel_id=TRUSTED)
        await y.supervisor.run(once=True)
        deferred = y.task(task.id)
        assert (deferred.state, deferred.deferrals, deferred.attempts) == ("queued", 1, 0)
        assert deferred.not_before == datetime(2026, 5, 12, 0, 0, tzinfo=UTC)  # the next budget window
        assert "daily budget" in (deferred.outcome or "")
        assert counting.opened == 0 and fake.requests == [] and y.surface.sent == []
        y.clock.set(datetime(2026, 5, 11, 23, 59, 59, tzinfo=UTC))
        await y.supervisor.run(once=True)
        assert y.task(task.id).state == "queued" and counting.opened == 0  # not before the window
        y.clock.set(datetime(2026, 5, 12, 0, 0, 1, tzinfo=UTC))
        await y.supervisor.run(once=True)
        assert y.task(task.id).state == "done" and [s.content for s in y.surface.sent] == ["Good morning."]


async def test_a_task_refused_for_budget_inside_its_box_is_deferred_not_failed(fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Good morning."), purpose="reply")
    async with yard(fake, InProcessBackend()) as y:
        y.clock.set(datetime(2026, 5, 11, 21, 30, tzinfo=UTC))
        ledger = Ledger(y.db, y.gateway.policy, y.clock)
        ledger.settle(
            ledger.reserve("pip", 1_999_950), 1_999_950
        )  # 50 micro-USD left: less than one call's estimate
        task = y.add(channel_id=TRUSTED)
        await y.supervisor.run(once=True)
        deferred = y.task(task.id)
        assert (deferred.state, deferred.attempts, deferred.deferrals) == ("queued", 1, 1)
        assert deferred.not_before == datetime(2026, 5, 12, 0, 0, tzinfo=UTC)
        assert "budget" in (deferred.outcome or "") and fake.requests == [] and y.surface.sent == []
        y.clock.set(datetime(2026, 5, 12, 0, 0, 1, tzinfo=UTC))
        await y.supervisor.run(once=True)
        done = y.task(task.id)
        assert (done.state, done.attempts) == ("done", 2)
        assert [run.result for run in y.supervisor.tasks.runs(task.id)] == ["deferred", "done"]


async def test_a_gate_approval_triggers_a_continuation_exactly_once(fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Weekly digest: three releases."), purpose="reply", times=1)
    fake.script(envelope(answer="Noted; nothing more to do.", answer_needed=False), purpose="reply")
    async with yard(fake, InProcessBackend()) as y:
        task = y.add("Post the weekly digest", channel_id=UNTRUSTED, wake_on_resolve=True)
        await y.supervisor.run(once=True)
        waiting = y.task(task.id)
        assert waiting.state == "needs_review" and "waiting for approval" in (waiting.outcome or "")
        assert y.surface.sent == []  # gated: nothing went out
        [gate] = y.supervisor.tasks.gates_of(task.id)
        assert gate.state == "pending" and gate.run_id == waiting.run_id
        # The operator approves on the CLI (another process): the supervisor executes it and follows up.
        GateStore(y.db, y.clock, y.gateway.audit).decide(
            gate.id, Approver("operator", "ann"), approve=True, note="ship it"
        )
        await y.supervisor.run(once=True)
        assert [s.content for s in y.surface.sent] == [
            "Weekly digest: three releases."
        ]  # sent once, on approval
        follow_ups = [t for t in y.supervisor.tasks.latest() if t.origin == "continuation"]
        assert len(follow_ups) == 1
        [follow] = follow_ups
        assert (follow.parent_task, follow.parent_gate, follow.channel_id, follow.state) == (
            task.id,
            gate.id,
            UNTRUSTED,
            "done",
        )
        assert y.task(task.id).state == "done"  # its gated act was approved and sent
        told = "\n".join(str(m["content"]) for m in fake.requests[-1].body["messages"])
        assert f"gate {gate.id}) was approved by operator:ann" in told and "ship it" in told
        for _ in range(2):  # more ticks, and a fresh supervisor: still exactly one follow-up
            await y.supervisor.run(once=True)
        await y.fresh_supervisor(InProcessBackend()).run(once=True)
        assert len([t for t in y.supervisor.tasks.latest() if t.origin == "continuation"]) == 1
        assert len(fake.requests) == 2


async def test_a_denied_gate_wakes_the_task_with_the_denial(fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Hot take!"), purpose="reply", times=1)
    fake.script(envelope(answer="Understood.", answer_needed=False), purpose="reply")
    async with yard(fake, InProcessBackend()) as y:
        task = y.add("Post something", channel_id=UNTRUSTED, wake_on_resolve=True)
        await y.supervisor.run(once=True)
        [gate] = y.supervisor.tasks.gates_of(task.id)
        GateStore(y.db, y.clock, y.gateway.audit).decide(
            gate.id, Approver("operator", "ann"), approve=False, note="too spicy"
        )
        await y.supervisor.run(once=True)
        assert y.surface.sent == [] and y.task(task.id).state == "failed"
        assert "was denied by operator:ann" in "\n".join(
            str(m["content"]) for m in fake.requests[-1].body["messages"]
        )


# --- bad input and failures ---------------------------------------------------------------------------


async def test_a_task_box_that_hangs_is_killed_at_its_ceiling(fake: FakeOpenAI) -> None:
    async with yard(fake, hanging_box(), SupervisorSettings(tick_s=0.05, max_ceiling_s=1.0)) as y:
        task = y.add(channel_id=TRUSTED)
        await y.supervisor.run(once=True)
        failed = y.task(task.id)
        assert failed.state == "failed" and "killed at its ceiling of 1s" in (failed.outcome or "")
        [run] = y.supervisor.tasks.runs(task.id)
        assert run.result == "ceiling" and run.box_pid is not None
        assert not alive(run.box_pid)  # the box is gone, not merely abandoned


async def test_a_box_dying_mid_task_fails_the_task_with_one_line(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11: a box killed mid-task ends its task cleanly, with the death in one line, no ExceptionGroup."""
    fake.script(slow(envelope(answer="never posted"), 30.0))
    async with yard(fake, ProcessBackend(warn=False)) as y:
        task = y.add(channel_id=TRUSTED)
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: y.supervisor.run(stop=stop))
            await anyio.to_thread.run_sync(
                lambda: fake.wait_for_requests(1, timeout_s=20)
            )  # task.run in flight
            os.kill(y.supervisor.tasks.runs(task.id)[0].box_pid or 0, signal.SIGKILL)

            async def failed() -> bool:
                return y.task(task.id).state == "failed"

            await wait_until(failed)
            stop.set()
    outcome = y.task(task.id).outcome or ""
    assert outcome.startswith("the box failed: task.run got no answer") and "exit code -9" in outcome
    assert (
        "ExceptionGroup" not in outcome
        and "ExceptionGroup" not in caplog.text
        and "Traceback" not in caplog.text
    )


async def test_the_operator_can_cancel_a_running_task(fake: FakeOpenAI) -> None:
    async with yard(fake, hanging_box()) as y:
        task = y.add(channel_id=TRUSTED)
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: y.supervisor.run(stop=stop))

            async def running() -> bool:
                return y.task(task.id).state == "running" and bool(y.supervisor.running)

            await wait_until(running)
            y.supervisor.tasks.request_cancel(
                task.id
            )  # what `impyard task cancel` does, from another process

            async def cancelled() -> bool:
                return y.task(task.id).state == "cancelled"

            await wait_until(cancelled)
            stop.set()
        [run] = y.supervisor.tasks.runs(task.id)
        assert run.result == "cancelled" and run.box_pid is not None and not alive(run.box_pid)


async def test_stopping_the_supervisor_requeues_what_is_still_running(fake: FakeOpenAI) -> None:
    async with yard(fake, hanging_box(), SupervisorSettings(tick_s=0.05, shutdown_grace_s=0.2)) as y:
        task = y.add(channel_id=TRUSTED)
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: y.supervisor.run(stop=stop))

            async def running() -> bool:
                return y.task(task.id).state == "running" and bool(y.supervisor.running)

            await wait_until(running)
            stop.set()
        again = y.task(task.id)
        assert again.state == "queued" and "interrupted" in (again.outcome or "")
        [run] = y.supervisor.tasks.runs(task.id)
        assert run.result == "interrupted" and not alive(run.box_pid or 0)


async def test_an_unknown_kind_is_the_boxes_business(fake: FakeOpenAI) -> None:
    async with yard(fake, InProcessBackend()) as y:
        task = y.supervisor.tasks.add(TaskRequest("pip", None, kind="dream", channel_id=TRUSTED))
        await y.supervisor.run(once=True)
        failed = y.task(task.id)
        assert failed.state == "failed" and "does not know task kind 'dream'" in (failed.outcome or "")
        assert fake.requests == []


async def test_a_task_whose_imp_was_removed_fails_visibly(fake: FakeOpenAI) -> None:
    async with yard(fake, InProcessBackend()) as y:
        task = y.add(channel_id=TRUSTED)
        y.imps.remove("pip")
        await y.supervisor.run(once=True)
        failed = y.task(task.id)
        assert (
            failed.state == "failed"
            and "no imp named 'pip'" in (failed.outcome or "")
            and failed.attempts == 0
        )


async def test_the_briefing_gives_the_box_its_own_imps_past_outcomes(fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Bob's secret result."), purpose="reply", times=1)
    fake.script(envelope(answer="Monday: shipped 1.2."), purpose="reply", times=1)
    fake.script(envelope(answer="Tuesday: quiet."), purpose="reply")
    async with yard(fake, InProcessBackend()) as y:
        y.imps.add("bob", box={"backend": "process"})
        y.supervisor.tasks.add(TaskRequest("bob", "Bob's private errand", channel_id=TRUSTED))
        await y.supervisor.run(once=True)
        y.add("Post Monday's summary", channel_id=TRUSTED)
        await y.supervisor.run(once=True)
        y.clock.advance(days=1)
        y.add("Post Tuesday's summary", channel_id=TRUSTED, briefing=True)
        await y.supervisor.run(once=True)
        assert [s.content for s in y.surface.sent] == [
            "Bob's secret result.",
            "Monday: shipped 1.2.",
            "Tuesday: quiet.",
        ]
        text = "\n".join(str(m["content"]) for m in fake.requests[-1].body["messages"])
        assert (
            "Your recent tasks" in text
            and "Monday: shipped 1.2." in text
            and "Post Tuesday's summary" in text
        )
        assert text.index("Your recent tasks") < text.index("Post Tuesday's summary")
        assert "Bob" not in text  # another imp's journal never reaches this box


# --- orphan reclaim ------------------------------------------------------------------------------------

SUPERVISOR_SCRIPT = """
import sys, anyio
from impyard.backends.process import ProcessBackend
from impyard.supervisor import SupervisorSettings, open_supervisor
from impyard.gateway.surfaces import RecordingSurface

async def main():
    backend = ProcessBackend(command=[sys.executable, sys.argv[1], "silent"], warn=False)
    async with open_supervisor(surface=RecordingSurface(), backend_for=lambda imp: backend,
                               settings=SupervisorSettings(tick_s=0.05)) as supervisor:
        print("supervising", flush=True)
        await supervisor.run()

anyio.run(main)
"""


def start_supervisor_process() -> subprocess.Popen[str]:
    env = {**os.environ, "OPENAI_API_KEY": KEY, "PYTHONPATH": str(Path(__file__).parent.parent)}
    process = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR_SCRIPT, str(BAD_BOX)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=env,
    )  # fmt: skip
    assert process.stdout is not None and process.stdout.readline().strip() == "supervising"
    return process


async def test_orphan_reclaim_after_a_killed_supervisor(fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Recovered and posted."), purpose="reply")
    async with yard(fake, ProcessBackend(warn=False)) as y:
        task = y.add(channel_id=TRUSTED)
        crashed = await anyio.to_thread.run_sync(start_supervisor_process)
        try:

            async def box_started() -> bool:
                runs = y.supervisor.tasks.runs(task.id)
                return bool(runs) and runs[0].box_pid is not None

            await wait_until(box_started)
        finally:
            crashed.send_signal(signal.SIGKILL)  # a crash mid-task: no cleanup at all
            await anyio.to_thread.run_sync(crashed.wait)
        [orphan_run] = y.supervisor.tasks.runs(task.id)
        assert y.task(task.id).state == "running" and orphan_run.box_pid is not None
        assert alive(orphan_run.box_pid)  # its box outlived it
        await y.supervisor.run(once=True)  # the restart reclaims, then runs the task again
        deadline = time.monotonic() + 5
        while alive(orphan_run.box_pid) and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        assert not alive(orphan_run.box_pid)
        done = y.task(task.id)
        assert (done.state, done.attempts) == ("done", 2)
        assert [run.result for run in y.supervisor.tasks.runs(task.id)] == ["reclaimed", "done"]
        assert [s.content for s in y.surface.sent] == ["Recovered and posted."]


async def test_a_task_that_acted_before_the_crash_is_not_run_twice(fake: FakeOpenAI) -> None:
    async with yard(fake, InProcessBackend()) as y:
        task = y.add(channel_id=TRUSTED)
        y.supervisor.tasks.claim(task.id, "run-lost", "process")
        y.gateway.audit.write(
            AuditRecord(imp="pip", method="discord.send", verdict="allowed", run_id="run-lost")
        )
        [reclaimed] = await y.supervisor.reclaim()
        assert reclaimed.state == "needs_review" and "not rerun" in (reclaimed.outcome or "")


async def test_orphan_reclaim_removes_a_labelled_container(
    fake: FakeOpenAI, box_image: str, docker_backend: DockerBackend, test_home_id: str, tmp_path: Path
) -> None:
    backend = DockerBackend(box_image, home_id=test_home_id, role="task")
    async with yard(fake, backend) as y:
        task = y.add(channel_id=TRUSTED)
        run_id = "orphan" + os.urandom(6).hex()
        y.supervisor.tasks.claim(task.id, run_id, "docker")
        spec = BoxSpec("pip", TRUSTED, y.imps.state_dir("pip"), run_id=run_id)
        backend.prepare_state_dir(
            spec.state_dir, "10001:10001" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"
        )
        argv = run_argv(spec, box_image, limits=backend.limits, home_id=test_home_id, role="task",
                        user="10001:10001" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}",
                        command=["python3", "-c", "import time; time.sleep(300)"])  # fmt: skip
        argv[argv.index("-i")] = "-d"  # left behind by a supervisor that died
        await anyio.run_process(argv)
        assert [c.name for c in backend.labelled(run=run_id)]
        [reclaimed] = await y.supervisor.reclaim()
        assert reclaimed.state == "queued" and reclaimed.attempts == 1
        assert backend.labelled(run=run_id) == []
