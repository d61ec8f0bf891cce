"""Issue 18: what one warm turn costs in database calls, per phase of the turn.

Each ``Database.run`` is one trip: a job handed to a worker thread and its answer woken back onto the event
loop. Each ``Database.quick`` is bounded work (reads, then at most one write): on SQLite it runs right on the event
loop, since a short transaction costs less than a trip. A warm turn's storage is all quick, in a fixed number of
calls per phase, so the host's CPU per turn does not grow with how many store methods a phase calls, and on SQLite
a warm turn makes no trip at all. The counts are asserted, never the time they take (a timing target belongs in
the benchmark).

Real parts: the process backend's box (the real box program), the gateway with the loopback fake OpenAI, the
host's surface wrapper that keeps the imp's posts in the history, SQLite under a temporary IMPYARD_HOME.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from box.protocol.models import Author, Message
from impyard import runtime as runtime_module
from impyard.backends import BoxSpec
from impyard.backends.process import ProcessBackend
from impyard.clock import FixedClock
from impyard.conversation.activity import ActivityPublisher
from impyard.conversation.pipeline import Inbound
from impyard.gateway.core import Gateway
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.store import ImpStore
from impyard.runtime import Runtime, open_runtime
from impyard.storage.db import Database
from testing.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(env=True, answer="hello there")]

CHANNEL = "4242"
HOST = "host"  # calls made outside any box request: routing, and recording the turn's outcome
TRIP = "trip"  # the key of ``run`` calls (worker trips), whatever the phase

# The ceilings of quick calls, per phase of one warm turn. Before issue 18's batching there were 16 worker trips
# (routing 4, model.request 3, discord.send 5, history.load 1, history.commit 1, turn.stage 1, the outcome 1); then
# 8 trips; now 11 quick calls, each one transaction, and no trip.
ROUTING = 2  # the channel seen and the message kept; the wake row and the recent history
PER_REQUEST = {
    "model.request": 3,  # reserve (check-and-debit, atomic); settle; the call's audit row
    "discord.send": 3,  # the decision's reads (trust, earned count, target); the post kept; its audit row
    "history.load": 1,
    "history.commit": 1,  # the lines, the counter and the audit row: one transaction
}
NONE = ("turn.stage",)  # the session knows which messages it handed its box: nothing to look up
OUTSIDE_REQUESTS = 3  # routing's two, and the turn's outcome
PER_TURN = 11

_PHASE: ContextVar[str] = ContextVar("phase", default=HOST)


class TripCounter:
    """Counts ``Database.quick`` calls, each under the box request being served when it was made (a task the
    gateway spawns for a request, such as a model call in flight, inherits it), else under ``HOST``; and every
    ``Database.run`` (a worker trip, a quick call's included) under ``TRIP``."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def wrap_run(self, run: Callable[..., Any]) -> Callable[..., Any]:
        async def counted(db: Database, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            self.counts[TRIP] += 1
            return await run(db, fn, *args, **kwargs)

        return counted

    def wrap_quick(self, quick: Callable[..., Any]) -> Callable[..., Any]:
        async def counted(db: Database, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            self.counts[_PHASE.get()] += 1
            return await quick(db, fn, *args, **kwargs)

        return counted

    @staticmethod
    def wrap_serve(serve: Callable[..., Any]) -> Callable[..., Any]:
        async def serving(gateway: Gateway, spec: BoxSpec, method: str, params: BaseModel) -> Any:
            token = _PHASE.set(method)
            try:
                return await serve(gateway, spec, method, params)
            finally:
                _PHASE.reset(token)

        return serving

    def take(self) -> Counter[str]:
        taken, self.counts = self.counts, Counter()
        return taken


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
async def runtime(
    fake: FakeOpenAI, clock: FixedClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Runtime]:
    # The Now page's publisher writes the host's activity once at start, then at most once a day here: its own
    # writes are not a turn's (and a write of it beside a turn's quick call sends that call to a worker).
    monkeypatch.setattr(
        runtime_module, "ActivityPublisher", partial(ActivityPublisher, every=timedelta(days=1))
    )
    ImpStore().add("pip", "You are Pip.")
    async with open_runtime(
        ["pip"],
        RecordingSurface(),
        clock=clock,
        backends={"pip": ProcessBackend(warn=False)},
        surfaces=("discord", "terminal"),
        pump_period_s=None,  # no gate pump: its own trips are not a turn's
    ) as rt:
        yield rt


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> TripCounter:
    counter = TripCounter()
    monkeypatch.setattr(Database, "run", counter.wrap_run(Database.run))
    monkeypatch.setattr(Database, "quick", counter.wrap_quick(Database.quick))
    monkeypatch.setattr(Gateway, "serve", counter.wrap_serve(Gateway.serve))
    return counter


def dm(n: int, clock: FixedClock) -> Inbound:
    """A direct message: it always wakes the imp, and the DM is trusted, so the reply goes out at once."""
    message = Message(
        id=f"m{n}", author=Author(id="ann", name="ann"), content=f"hi, message {n}",
        created_at=clock.now() + timedelta(seconds=n),
    )  # fmt: skip
    return Inbound(
        surface="discord", channel_id=CHANNEL, channel_kind="dm", message=message, channel_name="ann"
    )


async def turn(rt: Runtime, n: int, clock: FixedClock, trips: TripCounter) -> tuple[int, Counter[str]]:
    """One turn through the whole host: (calls while routing, every call of the turn by phase)."""
    trips.take()
    assert await rt.conversations.receive("pip", dm(n, clock)) in ("started", "queued")
    routing = sum(trips.counts.values())  # receive returns once the message is handed to its session
    with anyio.fail_after(30):
        await rt.conversations.wait_finished(f"m{n}")
    counts = trips.take()
    assert rt.history.outcome("pip", CHANNEL, f"m{n}") == "sent"  # answered: a turn that ran to its end
    return routing, counts


async def test_a_warm_turn_makes_a_few_quick_calls_per_phase_and_no_trip(
    runtime: Runtime, clock: FixedClock, trips: TripCounter
) -> None:
    rt = runtime
    await turn(rt, 1, clock, trips)  # the box starts: its init reads are not a warm turn's
    routing, counts = await turn(rt, 2, clock, trips)
    assert counts[TRIP] == 0, counts  # SQLite, no other writer: every call ran on the event loop
    del counts[TRIP]
    assert rt.db.quick_counts.on_worker == 0
    assert set(counts) >= {HOST, *PER_REQUEST}, counts  # every phase of a turn ran, and was counted
    assert routing == ROUTING, counts
    for method, ceiling in PER_REQUEST.items():
        assert counts[method] <= ceiling, (method, counts)
    assert not [method for method in NONE if counts[method]], counts
    assert counts[HOST] <= OUTSIDE_REQUESTS, counts
    assert sum(counts.values()) <= PER_TURN, counts


async def test_every_warm_turn_costs_the_same(
    runtime: Runtime, clock: FixedClock, trips: TripCounter
) -> None:
    """Trips do not grow with the history, the ledger or the audit log: turn 2 and turn 6 cost the same."""
    rt = runtime
    await turn(rt, 1, clock, trips)
    seen = [await turn(rt, n, clock, trips) for n in range(2, 7)]
    assert all(seen_one == seen[0] for seen_one in seen), seen


async def test_a_message_that_wakes_nobody_costs_one_quick_call(
    runtime: Runtime, clock: FixedClock, trips: TripCounter
) -> None:
    """Kept in the history, not answered (a guild channel in mention mode, no mention): one call, no turn."""
    rt = runtime
    rt.channels.set_mode("77", "mention")
    message = Message(
        id="quiet", author=Author(id="ann", name="ann"), content="just talking", created_at=clock.now()
    )
    ambient = Inbound(
        surface="discord", channel_id="77", channel_kind="guild", message=message, channel_name="g"
    )
    assert await rt.conversations.receive("pip", ambient) == "ambient"
    assert trips.take() == Counter({HOST: 1})
    assert [m.id for m in rt.history.recent("77")] == ["quiet"]  # kept all the same


async def test_a_warm_turn_compiles_no_statement(
    runtime: Runtime, clock: FixedClock, trips: TripCounter
) -> None:
    """Issue 18: every statement of a warm turn comes out of SQLAlchemy's compiled cache. A statement without a
    cache key (a multi-row VALUES, a construct that opts out) is compiled anew each time it runs: milliseconds
    of host CPU a turn, paid by every turn. Each statement's cache outcome is counted, never its time."""
    rt = runtime
    await turn(rt, 1, clock, trips)
    clock.advance(timedelta(seconds=10))
    await turn(rt, 2, clock, trips)  # the first warm turn may compile what only a warm turn runs
    outcomes: Counter[str] = Counter()

    def seen(_conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool) -> None:
        outcome = getattr(getattr(context, "cache_hit", None), "name", "NOT_COMPILED")  # engine.CacheStats
        outcomes[outcome] += 1
        if outcome != "CACHE_HIT":
            outcomes[f"{outcome}: {statement[:120]}"] += 1

    engine = rt.db.engine
    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        for n in (3, 4):
            clock.advance(timedelta(seconds=10))
            await turn(rt, n, clock, trips)
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    assert outcomes["CACHE_HIT"] > 0, outcomes
    assert set(outcomes) == {"CACHE_HIT"}, outcomes


_SEEN_BY_HOOK: list[str] = []  # what the audit hook saw while a test listened (``listening``)
_LISTENING: list[bool] = [False]
_EVENTS = ("open", "os.listdir", "os.scandir", "subprocess.Popen", "os.exec", "os.posix_spawn")


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    """The host's turn path only: the event loop's thread and the database's workers (a thread another test
    left behind is not this turn's)."""
    if _LISTENING[0] and event in _EVENTS:
        thread = threading.current_thread()
        if thread is threading.main_thread() or thread.name.startswith("impyard-db-"):
            _SEEN_BY_HOOK.append(f"{event} on {thread.name}: {str(args[0] if args else '')[:120]}")


sys.addaudithook(_audit_hook)  # once per process: an audit hook cannot be removed


async def test_a_warm_turn_reads_no_file_and_starts_no_process(
    runtime: Runtime, clock: FixedClock, trips: TripCounter
) -> None:
    """Issue 18: nothing is read from disk on a warm turn's path — no policy, no imp.toml, no persona — and no
    process is started: what a turn needs was read when the box started. Python's audit hooks see every
    ``open`` (a file, the policy's TOML, a directory listing) and every process start in the host's process."""
    rt = runtime
    await turn(rt, 1, clock, trips)
    clock.advance(timedelta(seconds=10))
    await turn(rt, 2, clock, trips)
    _SEEN_BY_HOOK.clear()
    _LISTENING[0] = True
    try:
        for n in (3, 4):
            clock.advance(timedelta(seconds=10))
            await turn(rt, n, clock, trips)
    finally:
        _LISTENING[0] = False
    assert _SEEN_BY_HOOK == []
