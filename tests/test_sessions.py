"""The session manager with real boxes: bursts, idle, races, crashes, ceilings, shutdown. The box program runs in
this process (``testing.inprocess``), but where a box is killed: a box process (the process backend)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import anyio
import pytest

from box.protocol.memory import PresenceEntry
from box.protocol.models import Author, BoxInitParams, DeliverResult, Framing, Message, TurnStageParams
from impyard.backends import BoxBackend
from impyard.backends.process import ProcessBackend
from impyard.conversation.sessions import (
    BUSY_NOTICE,
    CEILING_NOTICE,
    DIED_NOTICE,
    Delivery,
    SessionKey,
    SessionManager,
    SessionSettings,
    merge_batch,
)
from impyard.failure_words import WORDS
from testing.inprocess import InProcessBackend
from tests.scripted import NOW, ScriptedHost, init_params

pytestmark = pytest.mark.anyio

KEY = SessionKey("pip", "c1")


@dataclass
class Recorder:
    """The session manager's events: outcomes, notices, and each session's observer (stages, turn ends)."""

    outcomes: list[tuple[list[str], DeliverResult]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    turns_ended: int = 0
    stages: dict[SessionKey, list[tuple[str, str]]] = field(default_factory=dict)  # (message id, stage)
    observers: list[SessionKey] = field(default_factory=list)  # one per session, in the order they began
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def turn_finished(self, key: SessionKey, batch: Sequence[Delivery], result: DeliverResult) -> None:
        self.outcomes.append(([d.message.id for d in batch], result))
        self._bump()

    async def notice(self, key: SessionKey, text: str) -> None:
        self.notices.append(text)
        self._bump()

    def observer_for(self, key: SessionKey) -> Observer:
        self.observers.append(key)
        return Observer(self, key)

    def _bump(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    def answered(self) -> list[str]:
        return [message_id for ids, _ in self.outcomes for message_id in ids]

    async def until(self, predicate, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
        with anyio.fail_after(timeout):
            while not predicate():
                await self.changed.wait()


@dataclass
class Observer:
    """One session's observer: what its box said of its turns, and when each ended."""

    recorder: Recorder
    key: SessionKey

    async def stage(self, params: TurnStageParams) -> None:
        self.recorder.stages.setdefault(self.key, []).append((params.message_id, params.stage))

    async def turn_ended(self) -> None:
        self.recorder.turns_ended += 1


class ManualSleeper:
    """A movable clock for the idle window: sleeps end when the test says so."""

    def __init__(self) -> None:
        self.waiting: list[anyio.Event] = []
        self.arrived = anyio.Event()

    async def sleep(self, seconds: float) -> None:
        event = anyio.Event()
        self.waiting.append(event)
        self.arrived.set()
        await event.wait()

    async def wait_for_sleeper(self) -> None:
        with anyio.fail_after(20):
            while not self.waiting:
                self.arrived = anyio.Event()
                await self.arrived.wait()

    def fire(self) -> None:
        while self.waiting:
            self.waiting.pop().set()


def delivery(n: int, content: str = "hi", key: SessionKey = KEY) -> Delivery:
    message = Message(
        id=f"m{n}", author=Author(id="u1", name="ann"), content=content, created_at=NOW + timedelta(seconds=n)
    )
    return Delivery(key=key, message=message, framing=Framing(mode="respond", reason="one_to_one"))


@dataclass
class Plan:
    """The session plan of these tests: one backend for every imp, guild channels, state under tmp_path."""

    backend: BoxBackend
    root: Path
    settings: SessionSettings | None = None

    def backend_for(self, imp: str) -> BoxBackend:
        return self.backend

    async def presence_for(self, key: SessionKey, message: Message, now: datetime) -> list[PresenceEntry]:
        return []

    async def init_for(self, key: SessionKey, now: datetime) -> BoxInitParams:
        return init_params(key.imp, key.channel_id, "guild")

    def state_dir_for(self, key: SessionKey) -> Path:
        return self.root / key.imp / "state" / key.channel_id  # each box its own /state (issue 22)

    def settings_for(self, imp: str) -> SessionSettings:
        return self.settings or SessionSettings()


@asynccontextmanager
async def manager(
    tmp_path: Path,
    host: ScriptedHost,
    recorder: Recorder,
    settings: SessionSettings | None = None,
    *,
    backend: BoxBackend | None = None,
    **kwargs: object,
) -> AsyncIterator[SessionManager]:
    """``backend``: the in-process box unless given (a test that kills boxes gives the process backend)."""
    plan = Plan(backend or InProcessBackend(), tmp_path, settings)
    async with SessionManager(plan=plan, host=host, events=recorder, **kwargs) as sessions:  # type: ignore[arg-type]
        yield sessions


async def test_a_burst_of_20_messages_uses_exactly_one_box(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(hold=anyio.Event()), Recorder()
    async with manager(tmp_path, host, recorder) as sessions:
        assert sessions.deliver(delivery(0)).outcome == "started"
        with anyio.fail_after(20):
            while host.model_calls == 0:  # the first turn is in flight ...
                await anyio.sleep(0.01)
        outcomes = [sessions.deliver(delivery(n)).outcome for n in range(1, 20)]  # ... while 19 more arrive
        assert outcomes == ["queued"] * 19
        host.hold.set()  # type: ignore[union-attr]
        await recorder.until(lambda: len(recorder.answered()) == 20)
        assert sessions.boxes_started == 1
    assert sorted(recorder.answered()) == sorted(f"m{n}" for n in range(20))  # each once, none lost
    # The first message was a turn of its own; the 19 collected during it became the next turn.
    assert [len(ids) for ids, _ in recorder.outcomes] == [1, 19]
    assert host.model_calls == 2


async def test_messages_in_different_channels_get_their_own_boxes(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder) as sessions:
        sessions.deliver(delivery(1, key=SessionKey("pip", "a")))
        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        sessions.deliver(delivery(3, key=SessionKey("pix", "a")))  # same channel, other imp: keyed by both
        await recorder.until(lambda: len(recorder.answered()) == 3)
        assert sessions.boxes_started == 3


async def test_the_idle_window_closes_the_box_only_between_turns(tmp_path: Path) -> None:
    host, recorder, clock = ScriptedHost(), Recorder(), ManualSleeper()
    async with manager(tmp_path, host, recorder, sleep=clock.sleep) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: len(recorder.answered()) == 1)
        await clock.wait_for_sleeper()  # the idle timer starts only after the turn
        box = sessions.sessions[KEY].box
        assert box is not None and not box.exited.is_set()
        clock.fire()
        with anyio.fail_after(20):
            await box.exited.wait()
        assert KEY not in sessions.sessions
        sessions.deliver(delivery(2))
        await recorder.until(lambda: len(recorder.answered()) == 2)
        assert sessions.boxes_started == 2


@pytest.mark.parametrize("checkpoint", [False, True])
async def test_a_message_arriving_as_the_idle_window_ends_is_delivered_once(
    tmp_path: Path, checkpoint: bool
) -> None:
    host, recorder, clock = ScriptedHost(), Recorder(), ManualSleeper()
    async with manager(tmp_path, host, recorder, sleep=clock.sleep) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: len(recorder.answered()) == 1)
        await clock.wait_for_sleeper()
        clock.fire()
        if checkpoint:
            await anyio.lowlevel.checkpoint()  # let the closing session run first
        sessions.deliver(delivery(2))
        await recorder.until(lambda: len(recorder.answered()) == 2)
    # Leaving the manager waits for every session to end: a second delivery of m2 would be recorded by now.
    assert recorder.answered() == ["m1", "m2"]


async def test_a_box_that_dies_mid_turn_is_reported_and_replaced(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(hold=anyio.Event()), Recorder()
    async with manager(tmp_path, host, recorder, backend=ProcessBackend(warn=False)) as sessions:
        sessions.deliver(delivery(1))
        with anyio.fail_after(20):
            while host.model_calls == 0:
                await anyio.sleep(0.01)
        box = sessions.sessions[KEY].box
        assert box is not None
        box.process.kill()  # the box dies in the middle of the turn
        await recorder.until(lambda: len(recorder.outcomes) == 1 and recorder.notices)
        assert recorder.outcomes[0][1].outcome == "failed"
        assert recorder.notices == [DIED_NOTICE]
        host.hold.set()  # type: ignore[union-attr]
        sessions.deliver(delivery(2))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        assert recorder.outcomes[1][1].outcome == "sent"
        assert sessions.boxes_started == 2
    assert recorder.turns_ended == 2  # the typing indicator was stopped on both paths


async def test_the_turn_ceiling_stops_the_turn_and_kills_the_box(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(hold=anyio.Event()), Recorder()
    async with manager(
        tmp_path, host, recorder, SessionSettings(turn_ceiling_s=0.5), backend=ProcessBackend(warn=False)
    ) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: len(recorder.outcomes) == 1 and recorder.notices)
        assert recorder.outcomes[0][1].outcome == "failed"
        assert recorder.notices == [CEILING_NOTICE]
        host.hold.set()  # type: ignore[union-attr]
        sessions.deliver(delivery(2))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        assert sessions.boxes_started == 2


async def test_a_message_to_a_warm_box_waiting_for_work_starts_its_turn(tmp_path: Path) -> None:
    """Issue 38: "queued" only behind a turn; a warm box between turns takes the message at once."""
    host, recorder = ScriptedHost(hold=anyio.Event()), Recorder()
    async with manager(tmp_path, host, recorder) as sessions:
        assert sessions.deliver(delivery(0)).outcome == "started"
        host.hold.set()  # type: ignore[union-attr]
        await recorder.until(lambda: len(recorder.answered()) == 1)
        with anyio.fail_after(20):
            while not sessions.sessions[delivery(0).key].idle:  # the box waits for work
                await anyio.sleep(0.01)
        host.hold = anyio.Event()
        outcomes = [sessions.deliver(delivery(n)).outcome for n in (1, 2)]
        assert outcomes == ["started", "queued"]  # the second waits behind the turn the first started
        assert sessions.boxes_started == 1
        host.hold.set()
        await recorder.until(lambda: len(recorder.answered()) == 3)


async def test_the_session_ceiling_closes_after_the_current_turn(tmp_path: Path) -> None:
    ticks = iter(range(0, 10_000, 1000))  # every reading of the clock is 1000 s later
    host, recorder = ScriptedHost(), Recorder()
    settings = SessionSettings(session_ceiling_s=500)
    async with manager(tmp_path, host, recorder, settings, monotonic=lambda: float(next(ticks))) as sessions:
        for n in range(3):
            sessions.deliver(delivery(n))
            await recorder.until(lambda n=n: len(recorder.answered()) == n + 1)
        assert sessions.boxes_started == 3


async def test_a_flood_is_bounded_and_announced_never_silently_dropped(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(hold=anyio.Event()), Recorder()
    async with manager(tmp_path, host, recorder, SessionSettings(queue_limit=50)) as sessions:
        outcomes = [sessions.deliver(delivery(n)).outcome for n in range(200)]
        assert outcomes.count("started") == 1
        assert outcomes.count("queued") == 49
        assert outcomes.count("busy") == 150  # the caller records these as missed
        await recorder.until(lambda: recorder.notices == [BUSY_NOTICE])  # said once, not 150 times
        host.hold.set()  # type: ignore[union-attr]
        await recorder.until(lambda: len(recorder.answered()) == 50)
        assert sessions.boxes_started == 1


async def test_cold_mode_starts_one_box_per_message(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(), Recorder()
    async with manager(tmp_path, host, recorder, SessionSettings(mode="cold")) as sessions:
        for n in range(3):
            sessions.deliver(delivery(n))
        await recorder.until(lambda: len(recorder.answered()) == 3)
        assert sessions.boxes_started == 3


async def test_a_failed_turn_in_respond_framing_gets_a_notice(tmp_path: Path) -> None:
    from tests.scripted import chat_result

    host, recorder = ScriptedHost(answers=[chat_result("not an envelope")]), Recorder()
    async with manager(tmp_path, host, recorder, SessionSettings(failure_notice="sorry!")) as sessions:
        sessions.deliver(delivery(1))
        await recorder.until(lambda: recorder.notices)
    # issue 19 #5: an unusable answer has its own words; "sorry!" is for a failure of no known kind
    assert recorder.notices == [WORDS["bad_answer"]] and recorder.outcomes[0][1].outcome == "failed"


async def test_shutdown_kills_every_box(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(hold=anyio.Event()), Recorder()
    async with manager(tmp_path, host, recorder, backend=ProcessBackend(warn=False)) as sessions:
        sessions.deliver(delivery(1, key=SessionKey("pip", "a")))
        sessions.deliver(delivery(2, key=SessionKey("pip", "b")))
        with anyio.fail_after(20):
            while host.model_calls < 2:
                await anyio.sleep(0.01)
        boxes = [session.box for session in sessions.sessions.values()]
        await sessions.shutdown(grace_s=0.2)  # the turns never finish: killed after the grace
        assert sessions.deliver(delivery(3)).outcome == "refused"
    assert all(box is not None and box.exited.is_set() for box in boxes)


async def test_deliver_hands_back_a_handle_that_hears_its_own_turn(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(hold=anyio.Event()), Recorder()
    async with manager(tmp_path, host, recorder, SessionSettings(queue_limit=1)) as sessions:
        first = sessions.deliver(delivery(1))
        with anyio.fail_after(20):
            while host.model_calls == 0:  # the first turn is in flight
                await anyio.sleep(0.01)
        second = sessions.deliver(delivery(2))  # waits in the mailbox (its buffer: one)
        busy = sessions.deliver(delivery(3))  # the buffer is full
        assert (first.outcome, second.outcome, busy.outcome) == ("started", "queued", "busy")
        assert await busy.finished() is None  # at once: no turn will answer it
        assert not first.done and not second.done
        host.hold.set()  # type: ignore[union-attr]
        with anyio.fail_after(20):
            answered = await first.finished()
            assert recorder.answered() == ["m1"]  # recorded before the handle hears it
            assert answered is recorder.outcomes[0][1] and answered.outcome == "sent"
            later = await second.finished()
        assert later is recorder.outcomes[1][1] and recorder.answered() == ["m1", "m2"]


async def test_each_boxs_stages_reach_its_own_sessions_observer(tmp_path: Path) -> None:
    host, recorder = ScriptedHost(), Recorder()
    a, b = SessionKey("pip", "a"), SessionKey("pip", "b")
    async with manager(tmp_path, host, recorder) as sessions:
        sessions.deliver(delivery(1, key=a))
        sessions.deliver(delivery(2, key=b))
        await recorder.until(lambda: len(recorder.answered()) == 2)
    assert sorted(recorder.observers, key=str) == [a, b]  # one observer per session
    assert recorder.stages[a] and {message_id for message_id, _ in recorder.stages[a]} == {"m1"}
    assert recorder.stages[b] and {message_id for message_id, _ in recorder.stages[b]} == {"m2"}
    assert "render" in {stage for _, stage in recorder.stages[a]}
    assert host.model_calls == 2 and len(host.stages) == sum(
        map(len, recorder.stages.values())
    )  # and the gateway
    assert recorder.turns_ended == 2


def test_merge_batch_keeps_the_newest_message_and_remembers_being_addressed() -> None:
    first = delivery(1, "hey @pip")
    first = Delivery(first.key, first.message, Framing(mode="judge", reason="mention"))
    second = delivery(2, "anyone?")
    second = Delivery(second.key, second.message, Framing(mode="judge", reason="group"))
    params = merge_batch([first, second], NOW)
    assert params.message.id == "m2"
    assert params.framing.reason == "mention"
    assert [entry.id for entry in params.recent] == ["m1"]
    assert isinstance(params.now, datetime)
