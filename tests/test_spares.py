"""Spare boxes (issue 37): started ahead, claimed once by a conversation's first message, never shared, refused
every request before their claim, replaced when they die, drained when the imp is idle, closed at shutdown.

The session manager runs the real box program (in this process, ``testing.inprocess``) or real box processes
(the process backend) where a box must die or speak the protocol on its own; Docker in the tests marked docker."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner

from box.protocol import ErrorCode
from box.protocol.history import HistoryLoadParams
from box.protocol.memory import RecentParams
from box.protocol.models import DiscordSendParams, HttpFetchParams, ModelRequestParams
from impyard import metrics
from impyard.backends import BoxBackend, BoxHost, BoxSpec, RunningBox
from impyard.backends.docker import DockerBackend
from impyard.backends.plan import LABEL_CHANNEL
from impyard.backends.process import ProcessBackend
from impyard.backends.statedir import FOREIGN_WRITER_MARK
from impyard.cli import cli
from impyard.clock import FixedClock
from impyard.conversation import spares as spares_module
from impyard.conversation.sessions import SessionKey, SessionManager, SessionSettings
from impyard.conversation.spares import UNBOUND_REASON, SpareSettings
from impyard.storage.db import open_database
from impyard.storage.leases import LeaseStore
from impyard.storage.liveness import Holder
from testing.inprocess import InProcessBackend
from tests.scripted import ScriptedHost
from tests.test_sessions import KEY, ManualSleeper, Plan, Recorder, delivery

pytestmark = pytest.mark.anyio

SPARE = SessionSettings(spares=SpareSettings(count=1, idle_s=600))


@dataclass
class Counting:
    """A backend that notes each box it starts (its spec), around a real one."""

    inner: BoxBackend
    opened: list[BoxSpec] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @asynccontextmanager
    async def open(self, spec: BoxSpec, host: BoxHost) -> AsyncIterator[RunningBox]:
        self.opened.append(spec)
        async with self.inner.open(spec, host) as box:
            yield box

    def channels(self) -> list[str]:
        """The channels boxes were started for ("" for a spare: none)."""
        return [spec.channel_id for spec in self.opened]


@dataclass
class SparePlan(Plan):
    def spare_dir_for(self, imp: str) -> Path:
        return self.root / imp / "state" / "spares"


@asynccontextmanager
async def manager(
    tmp_path: Path, host: ScriptedHost, recorder: Recorder, backend: BoxBackend, **kwargs: object
) -> AsyncIterator[SessionManager]:
    plan = SparePlan(backend, tmp_path, SPARE)
    async with SessionManager(plan=plan, host=host, events=recorder, **kwargs) as sessions:  # type: ignore[arg-type]
        yield sessions


async def until(predicate, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


def leftovers(spares_dir: Path) -> list[str]:
    """What is left in an imp's spares dir (a root host's process boxes leave their owner mark, by design)."""
    return sorted(entry.name for entry in spares_dir.iterdir() if entry.name != FOREIGN_WRITER_MARK)


def ready(sessions: SessionManager) -> list[str]:
    """The run ids of the spares ready to be claimed."""
    return sorted(spare.spec.run_id for spare in sessions.spares.spares if spare.ready)


async def test_a_conversations_first_turn_is_served_by_a_spare_started_ahead(tmp_path: Path) -> None:
    metrics.fresh()
    backend, host, recorder = Counting(InProcessBackend()), ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, backend) as sessions:
        sessions.deliver(delivery(1, key=SessionKey("pip", "a")))  # no spare yet: a box is started for it
        await recorder.until(lambda: recorder.answered() == ["m1"])
        await until(lambda: len(ready(sessions)) == 1)
        assert sorted(backend.channels()) == ["", "a"]  # and a spare, started after it
        (spare,) = ready(sessions)
        assert metrics.sample("impyard_boxes", imp="pip", state="spare") == 1

        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        await recorder.until(lambda: len(recorder.answered()) == 2)
        box = sessions.sessions[SessionKey("pip", "b")].box
        assert box is not None and box.spec.run_id == spare and box.spec.channel_id == "b"
        # No box was started for b: its turn ran on the spare; the one started since is its replacement.
        await until(lambda: len(ready(sessions)) == 1)
        assert sorted(backend.channels()) == ["", "", "a"]
        assert ready(sessions) != [spare]
        assert sessions.spares.claimed == 1
        assert metrics.sample("impyard_box_starts_total", runtime="in-process", kind="spare") == 1
        assert metrics.sample("impyard_box_starts_total", runtime="in-process", kind="cold") == 1
    assert [result.outcome for _, result in recorder.outcomes] == ["sent", "sent"]


async def test_a_claimed_spares_replacement_starts_once_its_first_turn_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refill waits for the claimant's first turn (a box start would take the CPU its first reply needs)."""
    monkeypatch.setattr(spares_module, "REFILL_AFTER_S", 3600.0)  # only the turn's end starts it here
    backend, host, recorder = Counting(InProcessBackend()), ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, backend) as sessions:
        sessions.deliver(delivery(1, key=SessionKey("pip", "a")))
        await recorder.until(lambda: recorder.answered() == ["m1"])
        await until(lambda: len(ready(sessions)) == 1)
        host.hold = anyio.Event()  # b's first turn waits in its model call
        calls = host.model_calls
        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        await until(lambda: sessions.spares.claimed == 1 and host.model_calls > calls)
        for _ in range(20):  # the pool's keeper runs whenever anything changes: none of it starts a box
            sessions.spares.poke("pip")
            await anyio.sleep(0.01)
        assert sorted(backend.channels()) == ["", "a"] and sessions.spares.waiting() == 0
        host.hold.set()
        await recorder.until(lambda: len(recorder.answered()) == 2)
        await until(lambda: len(ready(sessions)) == 1)  # its replacement, once the turn was done
        assert sorted(backend.channels()) == ["", "", "a"]


async def test_a_claimed_spare_is_replaced_after_refill_after_s_whatever_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spares_module, "REFILL_AFTER_S", 0.05)
    backend, host, recorder = Counting(InProcessBackend()), ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, backend) as sessions:
        sessions.deliver(delivery(1, key=SessionKey("pip", "a")))
        await recorder.until(lambda: recorder.answered() == ["m1"])
        await until(lambda: len(ready(sessions)) == 1)
        host.hold = anyio.Event()
        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        await until(
            lambda: len(ready(sessions)) == 1 and sessions.spares.claimed == 1
        )  # b's turn still waits
        assert recorder.answered() == ["m1"]
        host.hold.set()
        await recorder.until(lambda: len(recorder.answered()) == 2)


async def test_a_spare_is_claimed_once_and_never_shared(tmp_path: Path) -> None:
    backend, host, recorder = Counting(InProcessBackend()), ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, backend, spares_max=1) as sessions:
        sessions.deliver(delivery(1, key=SessionKey("pip", "a")))
        await recorder.until(lambda: recorder.answered() == ["m1"])
        await until(lambda: len(ready(sessions)) == 1)
        (spare,) = ready(sessions)
        # Two conversations begin at once: one claims the spare, the other gets a box of its own.
        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        sessions.deliver(delivery(3, key=SessionKey("pip", "c")))
        await recorder.until(lambda: len(recorder.answered()) == 3)
        boxes = [sessions.sessions[SessionKey("pip", channel)].box for channel in ("b", "c")]
        assert all(box is not None for box in boxes)
        runs = [box.spec.run_id for box in boxes if box is not None]
        assert len(set(runs)) == 2 and runs.count(spare) == 1  # claimed by exactly one of them
        assert sorted(c for c in backend.channels() if c) == ["a", "b"] or sorted(
            c for c in backend.channels() if c
        ) == ["a", "c"]
        assert sessions.spares.claimed == 1


async def test_a_claimed_spare_gets_its_channels_state_and_hands_it_back(tmp_path: Path) -> None:
    """The channel's /state files move into the spare at its claim and back at its end: never two boxes' at once,
    and nothing of the channel lost between its boxes."""
    host, recorder, clock = ScriptedHost(), Recorder(), ManualSleeper()
    channel_dir = tmp_path / "pip" / "state" / "c1"
    spares_dir = tmp_path / "pip" / "state" / "spares"
    async with manager(tmp_path, host, recorder, InProcessBackend(), sleep=clock.sleep) as sessions:
        sessions.deliver(delivery(1, key=SessionKey("pip", "warmup")))  # starts the pool
        await recorder.until(lambda: len(recorder.answered()) == 1)
        for n in (2, 3):
            await until(lambda: len(ready(sessions)) == 1)
            (spare,) = ready(sessions)
            sessions.deliver(delivery(n))  # a conversation in c1 claims the spare
            await recorder.until(lambda n=n: len(recorder.answered()) == n)
            box = sessions.sessions[KEY].box
            assert box is not None and box.spec.run_id == spare
            assert not channel_dir.exists() or not any(channel_dir.iterdir())  # its files are the spare's now
            journal = spares_dir / spare / "journal.jsonl"
            assert len(journal.read_text().splitlines()) == n - 1  # this box's turn after the ones before it
            while KEY in sessions.sessions:  # the conversation idles out: its box closes
                await clock.wait_for_sleeper()
                clock.fire()
                await anyio.sleep(0.05)
            await until(lambda: (channel_dir / "journal.jsonl").exists())
            assert not (spares_dir / spare).exists() and not (spares_dir / f"{spare}.channel").exists()
            assert len((channel_dir / "journal.jsonl").read_text().splitlines()) == n - 1


# A box program that asks for what needs a channel and scopes before anyone has given it one, and says what it
# got on its stderr; then waits, as a spare does.
_ASKS = [
    ("model.request", ModelRequestParams(path="/chat/completions", body={"messages": []}, purpose="reply")),
    ("discord.send", DiscordSendParams(channel_id="c1", content="hello")),
    ("http.fetch", HttpFetchParams(url="https://example.com/")),
    ("memory.recent", RecentParams()),
    ("history.load", HistoryLoadParams()),
]
_ASKING_BOX = """
import json, sys
asks = json.loads(sys.argv[1])
for n, (method, params) in enumerate(asks, 1):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}) + "\\n")
sys.stdout.flush()
for line in sys.stdin:
    frame = json.loads(line)
    if frame.get("method") == "box.ready":  # up: as the box program answers it
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": frame["id"], "result": {}}) + "\\n")
        sys.stdout.flush()
    elif "method" not in frame:  # the answer to one of its asks
        sys.stderr.write(line)
        sys.stderr.flush()
"""


async def test_an_unbound_spare_is_refused_every_request_that_needs_a_channel(tmp_path: Path) -> None:
    asks = json.dumps([[method, params.model_dump(mode="json")] for method, params in _ASKS])
    backend = ProcessBackend(warn=False, command=[sys.executable, "-c", _ASKING_BOX, asks])
    host, recorder = ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, backend) as sessions:
        sessions.spares.wanted("pip")  # as a conversation of pip would
        await until(
            lambda: any(
                s.box is not None and len(s.box.stderr_tail) >= len(_ASKS) for s in sessions.spares.spares
            )
        )
        (spare,) = sessions.spares.spares
        assert spare.box is not None
        answers = [json.loads(line) for line in spare.box.stderr_tail]
        assert sorted(a["id"] for a in answers) == list(range(1, len(_ASKS) + 1))
        for answer in answers:
            assert answer["error"]["code"] == ErrorCode.DENIED
            assert UNBOUND_REASON in answer["error"]["message"]
        assert host.calls == []  # the gateway never heard of them
        assert not spare.box.exited.is_set()  # refused, not killed: a handful is within its budget


async def test_a_spare_that_dies_while_waiting_is_replaced_and_costs_no_turn(tmp_path: Path) -> None:
    backend, host, recorder = Counting(ProcessBackend(warn=False)), ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, backend) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: recorder.answered() == ["m1"])
        await until(lambda: len(ready(sessions)) == 1)
        (spare,) = [s for s in sessions.spares.spares if s.ready]
        assert spare.box is not None
        spare.box.process.kill()
        await until(lambda: len(ready(sessions)) == 1 and ready(sessions) != [spare.spec.run_id])
        assert backend.channels().count("") == 2  # it was replaced
        assert not (tmp_path / "pip" / "state" / "spares" / spare.spec.run_id).exists()
        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        await recorder.until(lambda: len(recorder.answered()) == 2)
    assert recorder.notices == []  # no turn was lost, none announced
    assert [result.outcome for _, result in recorder.outcomes] == ["sent", "sent"]


async def test_the_pool_drains_when_the_imp_has_been_idle_for_the_idle_period(tmp_path: Path) -> None:
    host, recorder, clock = ScriptedHost(), Recorder(), ManualSleeper()
    async with manager(tmp_path, host, recorder, InProcessBackend(), sleep=clock.sleep) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: recorder.answered() == ["m1"])
        await until(lambda: len(ready(sessions)) == 1)
        (spare,) = [s for s in sessions.spares.spares if s.ready]
        with anyio.fail_after(30):
            while sessions.spares.spares or KEY in sessions.sessions:
                await clock.wait_for_sleeper()  # the session's idle window, then the spares'
                clock.fire()
                await anyio.sleep(0.05)
        assert spare.box is not None and spare.box.exited.is_set()
        assert sessions.spares.waiting() == 0 and sessions.box_states() == []
        assert leftovers(tmp_path / "pip" / "state" / "spares") == []
        # The next conversation starts a box as ever, and the imp has a spare again after it.
        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        await recorder.until(lambda: len(recorder.answered()) == 2)
        await until(lambda: len(ready(sessions)) == 1)


async def test_shutdown_closes_the_spares(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, ProcessBackend(warn=False)) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: recorder.answered() == ["m1"])
        await until(lambda: len(ready(sessions)) == 1)
        boxes = [s.box for s in sessions.spares.spares]
    assert all(box is not None and box.exited.is_set() for box in boxes)
    assert not sessions.spares.spares
    assert leftovers(tmp_path / "pip" / "state" / "spares") == []


@dataclass
class SlowSpares(Counting):
    """Spares whose program never gets loaded (they never answer ``box.ready``); a session's box is the real one."""

    def open(self, spec: BoxSpec, host: BoxHost):  # type: ignore[no-untyped-def]
        if spec.channel_id:
            return super().open(spec, host)
        self.opened.append(spec)
        return ProcessBackend(
            warn=False, command=[sys.executable, "-c", "import time; time.sleep(300)"]
        ).open(spec, host)


async def test_a_spare_drained_while_it_still_loads_is_closed_at_once(tmp_path: Path) -> None:
    """Drained (short of memory, idle, a stop) before it answered ``box.ready`` — which may take seconds under
    gVisor — a spare is killed then, not waited for up to READY_TIMEOUT_S (60 s)."""
    backend, host, recorder = SlowSpares(InProcessBackend()), ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, backend) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: recorder.answered() == ["m1"])
        await until(lambda: sessions.spares.waiting() == 1 and len(backend.opened) == 2)
        await anyio.sleep(0.2)  # its process is up, and will never answer box.ready
        (loading,) = sessions.spares.spares
        assert not loading.ready
        sessions.spares.drain("pip")
        with anyio.fail_after(30):
            await loading.closed.wait()
        assert loading.spec.run_id not in leftovers(tmp_path / "pip" / "state" / "spares")


async def test_no_spare_is_started_when_the_host_is_short_of_memory(tmp_path: Path) -> None:
    backend, host, recorder = Counting(InProcessBackend()), ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, backend, free_memory=lambda: 64 * 1024**2) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: recorder.answered() == ["m1"])
        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        await recorder.until(lambda: len(recorder.answered()) == 2)
        assert sorted(backend.channels()) == ["b", "c1"] and sessions.spares.started == 0


async def test_spares_are_off_for_an_imp_whose_setting_is_0(tmp_path: Path) -> None:
    backend, host, recorder = Counting(InProcessBackend()), ScriptedHost(), Recorder()
    plan = SparePlan(backend, tmp_path, SessionSettings(spares=SpareSettings(count=0)))
    async with SessionManager(plan=plan, host=host, events=recorder) as sessions:  # type: ignore[arg-type]
        sessions.deliver(delivery(1))
        await recorder.until(lambda: recorder.answered() == ["m1"])
        assert backend.channels() == ["c1"] and sessions.spares.started == 0


def test_hosts_counts_a_hosts_spares_beside_its_warm_boxes(impyard_home: Path) -> None:
    db = open_database()
    LeaseStore(db, FixedClock(datetime.now(UTC)), me=Holder("far-away", "b00t", 4242, "9")).acquire(
        "host:far-away/4242", {"command": "serve", "home": "/srv/yard", "warm_boxes": 3, "spare_boxes": 2}
    )
    db.close()
    listed = CliRunner().invoke(cli, ["hosts"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[1].split("\t")[4] == "3 (+2 spares)"
    as_json = CliRunner().invoke(cli, ["hosts", "--json"])
    (host,) = json.loads(as_json.output)["hosts"]
    assert (host["warm_boxes"], host["spare_boxes"]) == (3, 2)


async def test_under_docker_a_spare_is_locked_down_as_any_box_and_serves_a_first_turn(
    tmp_path: Path, docker_backend: DockerBackend
) -> None:
    backend, host, recorder = Counting(docker_backend), ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, backend) as sessions:
        sessions.deliver(delivery(1, key=SessionKey("pip", "a")))
        await recorder.until(lambda: recorder.answered() == ["m1"], timeout=120)
        await until(lambda: len(ready(sessions)) == 1, timeout=120)
        (spare,) = ready(sessions)
        by_channel = {c.labels[LABEL_CHANNEL]: c for c in docker_backend.labelled()}
        assert sorted(by_channel) == ["", "a"]
        spare_config, cold_config = (by_channel[c].attrs["HostConfig"] for c in ("", "a"))
        for key in ("ReadonlyRootfs", "NetworkMode", "CapDrop", "SecurityOpt", "Memory", "MemorySwap",
                    "NanoCpus", "PidsLimit", "Ulimits", "Runtime", "Tmpfs", "Init"):  # fmt: skip
            assert spare_config[key] == cold_config[key], key  # the same lockdown, flag for flag
        (mount,) = by_channel[""].attrs["Mounts"]
        assert mount["Destination"] == "/state" and mount["Source"].endswith(f"spares/{spare}")

        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        await recorder.until(lambda: len(recorder.answered()) == 2, timeout=120)
        box = sessions.sessions[SessionKey("pip", "b")].box
        assert box is not None and box.spec.run_id == spare
        assert "b" not in backend.channels()  # no box was started for b
    assert [result.outcome for _, result in recorder.outcomes] == ["sent", "sent"]
