"""The real boxes ``impyard box check`` starts, asked from inside and looked at from outside: a box started for
the check (``probe``), and a spare box as the pool starts it, before and after its claim (``probe_spare``,
issue 37).

The spare is started by a ``SparePool`` itself, so the check sees what a host's pool starts: its own fresh
``/state`` (``impyard.backends.handover``), ``box.ready``, a ``SpareHost`` that refuses every request. It is
claimed as a conversation's first message or a task claims one (``impyard.conversation.spares.serving``): the
check channel's ``/state`` handed in, the host bound, ``box.init``; then the same ``probe`` task runs inside it,
and once it closes the pool hands its ``/state`` back to the channel.
"""

from __future__ import annotations

import itertools
import logging
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio
from pydantic import BaseModel

from box.protocol import HOST_METHODS, ErrorCode, RpcError
from box.protocol.models import (
    BoxInitParams,
    ImpSpec,
    ModelRequestParams,
    ReportValue,
    SessionInfo,
    TaskRunParams,
    TaskSpec,
)
from impyard.backends import BoxBackend, BoxError, BoxSpec, RefuseAllHost, RunningBox
from impyard.backends.docker import DockerBackend
from impyard.backends.handover import note_path
from impyard.backends.lockdown import (
    NOT_ASKED,
    NOT_LOOKED,
    NOT_REPORTED,
    LockdownCheck,
    evaluate,
    evaluate_outside,
)
from impyard.backends.outside import observe_outside
from impyard.backends.statedir import FOREIGN_WRITER_MARK
from impyard.conversation.spares import Spare, SpareFailed, SparePool, SpareSettings, serving
from impyard.conversation.spares import log as spares_log
from impyard.threads import in_thread

PROBE_TIMEOUT_S = 60.0
CHECK_IMP = "box-check"
CHECK_CHANNEL = "check"
MARKER = "box-check-marker"  # the check channel's own file: inside the claimed spare's /state, and back after
SPARE_UP_TIMEOUT_S = 300.0  # a spare's start and its ``box.ready`` (the pool gives ``box.ready`` 60 s of it)
STATE_NAMES_SHOWN = 8  # of a spare's /state before its claim (it should hold none)


@dataclass(frozen=True)
class Observation:
    """A real box seen from both sides: ``inside`` its own report (``box.probe``), ``outside`` what the host
    saw of it while it ran (``impyard.backends.outside``; None for the process backend), and the OCI runtime
    it ran under (None for the process backend)."""

    inside: dict[str, ReportValue]
    outside: dict[str, ReportValue] | None
    runtime: str | None


@dataclass(frozen=True)
class SpareObservation:
    """A spare box seen as the pool started it (``unclaimed_outside``, ``refusal``, ``fresh_state``) and once
    claimed (``claimed``), and its channel's /state after it closed (``handed_back``)."""

    unclaimed_outside: dict[str, ReportValue] | None  # the host's view before its claim (None: no engine)
    refusal: str  # what its host answered a request before its claim, in words
    refused: bool  # denied, as unbound
    gateway_heard: int  # requests the check's gateway heard before the claim (it must hear none)
    fresh_state: list[str]  # what its own /state held before its claim (its first names)
    claimed: Observation
    handed_back: bool  # the channel's /state holds its marker again, and the spare's own dir is gone
    handed_back_words: str


class SpareCheckError(Exception):
    """The spare did not get through its check: the message says at which step."""


class CountingGateway(RefuseAllHost):
    """The check's stand-in for the gateway: refuses every request, and counts those it heard."""

    def __init__(self) -> None:
        self.heard = 0

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        if not HOST_METHODS[method].is_notification:
            self.heard += 1
        return await super().serve(spec, method, params)


def _runtime(backend: BoxBackend) -> str | None:
    return backend.runtime if isinstance(backend, DockerBackend) else None


async def look_outside(backend: BoxBackend, spec: BoxSpec) -> dict[str, ReportValue] | None:
    """What the host sees of a running Docker box (its cgroup goes with it: while it runs); None elsewhere."""
    if not isinstance(backend, DockerBackend):
        return None
    attrs = await in_thread(backend.inspect_box, spec)
    return await in_thread(observe_outside, attrs)


def check_init(channel_id: str) -> BoxInitParams:
    """What the check tells a box in ``box.init``: the check's imp, a task channel, nothing else."""
    return BoxInitParams(
        protocol=1,
        imp=ImpSpec(name=CHECK_IMP),
        session=SessionInfo(id=f"check-{uuid.uuid4().hex[:8]}", channel_id=channel_id, channel_kind="task"),
        now=datetime.now(UTC),
    )


async def ask_inside(running: RunningBox, channel_id: str) -> dict[str, ReportValue]:
    """``box.init`` as the check's channel, then the ``probe`` task: what the box observes of itself."""
    await running.init(check_init(channel_id), timeout=PROBE_TIMEOUT_S)
    return await run_probe(running)


async def run_probe(running: RunningBox) -> dict[str, ReportValue]:
    """The ``probe`` task of an initialised box: what it observes of itself."""
    result = await running.run_task(
        TaskRunParams(task=TaskSpec(id="probe", kind="probe"), now=datetime.now(UTC)), timeout=PROBE_TIMEOUT_S
    )
    return result.report


async def probe(backend: BoxBackend, state_dir: Path) -> Observation:
    """Start a real box, ask it what it observes from inside, look at it from outside, shut it down."""
    spec = BoxSpec(imp=CHECK_IMP, channel_id=CHECK_CHANNEL, state_dir=state_dir)
    async with backend.open(spec, RefuseAllHost()) as running:
        inside = await ask_inside(running, CHECK_CHANNEL)
        outside = await look_outside(backend, spec)
    return Observation(inside, outside, _runtime(backend))


# ------------------------------------------------------------------ a spare (issue 37)


def check_pool(backend: BoxBackend, spares_dir: Path) -> SparePool:
    """A pool that starts one spare of the check's imp on ``backend``, exactly as a host's pool starts each, and
    never another (it does not replace the one the check claims): started whatever the host's memory and
    ``IMPYARD_SPARES_MAX`` say, never idle until the check stops it."""
    pool: SparePool

    def settings(imp: str) -> SpareSettings:
        return SpareSettings(count=1 if pool.started == 0 else 0)

    pool = SparePool(
        settings_for=settings,
        backend_for=lambda imp: backend,
        spare_dir_for=lambda imp: spares_dir,
        live_sessions=lambda imp: 1,
        sleep=anyio.sleep,
        host_max=1,
        free_memory=lambda: None,
    )
    return pool


async def _spare_up(pool: SparePool) -> Spare:
    """The pool's spare once it is up (``box.ready`` answered); SpareCheckError when it ended before."""
    with anyio.move_on_after(SPARE_UP_TIMEOUT_S):
        while True:
            ready = [spare for spare in pool.spares if spare.ready]
            if ready:
                return ready[0]
            if pool.started and not pool.spares:
                why = pool.failures.get(CHECK_IMP, "it ended")
                raise SpareCheckError(f"the spare box did not start: {why}")
            await pool.changed()
    raise SpareCheckError(f"the spare box was not up within {SPARE_UP_TIMEOUT_S:g} s")


async def _refusal(spare: Spare) -> tuple[bool, str]:
    """Ask the unclaimed spare's host for a model call, as its box would: whether it was denied as unbound, and
    its answer in words."""
    params = ModelRequestParams(path="/chat/completions", body={"messages": []}, purpose="reply")
    quiet = _NotTheCheckAsking()  # the host's warning would say the box asked: the check did, on purpose
    spares_log.addFilter(quiet)
    try:
        await spare.host.serve(spare.spec, "model.request", params)
    except RpcError as exc:
        reason = exc.data.get("reason") if isinstance(exc.data, dict) else None
        if exc.code == ErrorCode.DENIED and reason == "unbound":
            return True, "model.request denied (unbound)"
        return False, f"model.request: {exc.message[:120]} ({exc.code})"
    finally:
        spares_log.removeFilter(quiet)
    return False, "model.request: answered"


class _NotTheCheckAsking(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.args and CHECK_IMP in record.args and "before its claim" in record.msg)


def _names(directory: Path) -> list[str]:
    with os.scandir(directory) as entries:
        return sorted(entry.name for entry in itertools.islice(entries, STATE_NAMES_SHOWN))


@dataclass
class _Seen:
    unclaimed_outside: dict[str, ReportValue] | None = None
    refusal: str = ""
    refused: bool = False
    gateway_heard: int = 0
    fresh_state: list[str] | None = None
    inside: dict[str, ReportValue] | None = None
    claimed_outside: dict[str, ReportValue] | None = None


async def _through(
    pool: SparePool, backend: BoxBackend, channel_dir: Path, gateway: CountingGateway, seen: _Seen
) -> None:
    """The spare's life the check drives: up, looked at unclaimed, claimed, probed, released."""
    pool.wanted(CHECK_IMP)  # as a conversation of the imp does
    spare = await _spare_up(pool)
    box = spare.box
    assert box is not None  # ready: it runs
    seen.unclaimed_outside = await look_outside(backend, spare.spec)
    seen.refused, seen.refusal = await _refusal(spare)
    seen.gateway_heard = gateway.heard
    seen.fresh_state = _names(spare.spec.state_dir) + (
        [note_path(spare.spec.state_dir).name] if note_path(spare.spec.state_dir).exists() else []
    )
    # The claim, exactly as a session or a task makes it (``spares.serving``): the channel's files handed in,
    # the box's spec the channel's, the host bound, box.init; then the probe the started box ran. On every path
    # the spare is released, closed, and its /state handed back to the channel before this goes on.
    if pool.claim(CHECK_IMP, backend) is not spare:
        raise SpareCheckError("the spare box could not be claimed: it ended before its claim")

    async def init(_spec: BoxSpec) -> BoxInitParams:
        return check_init(CHECK_CHANNEL)

    try:
        async with serving(
            spare, state_dir=channel_dir, channel_id=CHECK_CHANNEL, host=gateway, init=init,
            init_timeout=PROBE_TIMEOUT_S,
        ) as claimed:  # fmt: skip
            seen.inside = await run_probe(claimed)
            seen.claimed_outside = await look_outside(backend, spare.spec)  # named as the pool started it
    except (SpareFailed, BoxError, RpcError) as exc:
        raise SpareCheckError(f"the claimed spare box did not run its probe: {exc}") from exc


def _handed_back(channel_dir: Path, marker: str, spares_dir: Path) -> tuple[bool, str]:
    """Whether the channel's /state is its own again once the spare closed: its marker back, no spare dir left."""
    try:
        back = (channel_dir / MARKER).read_text() == marker
        left = (
            [name for name in _names(spares_dir) if name != FOREIGN_WRITER_MARK]
            if spares_dir.is_dir()
            else []
        )
    except OSError as exc:
        return False, f"cannot read it: {exc.strerror or exc}"
    if not back:
        return False, "the channel's marker is not back in its /state"
    if left:
        return False, f"the spare's dir is left behind: {', '.join(left)}"
    return True, "the channel's again (its marker back, no spare dir left)"


async def probe_spare(backend: BoxBackend, root: Path) -> SpareObservation:
    """Start a spare as the pool does (in ``root``), look at it unclaimed, claim it for a check channel whose
    /state holds a marker file, probe it, let it close; SpareCheckError where it did not get through."""
    channel_dir, spares_dir = root / "channel", root / "spares"
    channel_dir.mkdir(parents=True, mode=0o700)
    marker = uuid.uuid4().hex
    (channel_dir / MARKER).write_text(marker)
    pool, gateway, seen = check_pool(backend, spares_dir), CountingGateway(), _Seen()
    failure: SpareCheckError | None = None
    async with anyio.create_task_group() as tg:
        pool.start(tg)
        try:
            await _through(pool, backend, channel_dir, gateway, seen)
        except (SpareCheckError, BoxError, OSError) as exc:
            failure = exc if isinstance(exc, SpareCheckError) else SpareCheckError(f"the spare box: {exc}")
            tg.cancel_scope.cancel()  # whatever it was doing: its box is removed, its /state handed back
        finally:
            pool.stop()  # no other spare; an unclaimed one closes
    if failure is not None:
        raise failure
    assert seen.inside is not None and seen.fresh_state is not None  # _through got through
    back, words = await in_thread(_handed_back, channel_dir, marker, spares_dir)
    return SpareObservation(
        unclaimed_outside=seen.unclaimed_outside,
        refusal=seen.refusal,
        refused=seen.refused,
        gateway_heard=seen.gateway_heard,
        fresh_state=seen.fresh_state,
        claimed=Observation(seen.inside, seen.claimed_outside, _runtime(backend)),
        handed_back=back,
        handed_back_words=words,
    )


# ------------------------------------------------------------------ judging it


STARTED = "started"  # the box each row is about (issue 37)
UNCLAIMED = "spare (unclaimed)"
CLAIMED = "spare (claimed)"
SPARE = "spare"

# A spare's own checks, beside the lockdown's properties
REFUSED = "refused before its claim"
FRESH_STATE = "a fresh /state of its own"
CHANNEL_STATE = "the channel's /state inside"
HANDED_BACK = "/state handed back"
GOT_THROUGH = "started, claimed and closed"
SPARE_CHECKS = frozenset({REFUSED, FRESH_STATE, CHANNEL_STATE, HANDED_BACK, GOT_THROUGH})


@dataclass(frozen=True)
class BoxCheck:
    """One check of one box: ``box`` says which (``STARTED``, ``UNCLAIMED``, ``CLAIMED``, ``SPARE``)."""

    box: str
    check: LockdownCheck


def _host_side(name: str, ok: bool, expected: str, outside: str, inside: str = NOT_LOOKED) -> LockdownCheck:
    """A check the host makes itself, seen from outside (it asks the box nothing)."""
    return LockdownCheck(name, ok, inside, expected, outside, "outside" if ok else "")


def judge_spare(
    seen: SpareObservation,
    *,
    memory: str,
    pids_limit: int,
    state_quota_bytes: int | None,
    host_kernel: str,
) -> list[BoxCheck]:
    """A spare's checks: unclaimed, its lockdown from outside (``evaluate_outside``), its refusal before the
    gateway and its fresh /state; claimed, the started box's lockdown (``evaluate``), the channel's files in
    its /state, and back in the channel's once it closed."""
    runtime = seen.claimed.runtime
    unclaimed = evaluate_outside(
        seen.unclaimed_outside, memory=memory, pids_limit=pids_limit, state_quota_bytes=state_quota_bytes,
        runtime=runtime, host_kernel=host_kernel,
    )  # fmt: skip
    heard = f"the gateway heard {seen.gateway_heard or 'nothing'}"
    unclaimed.append(
        _host_side(
            REFUSED, seen.refused and seen.gateway_heard == 0,
            "denied; the gateway hears nothing", f"{seen.refusal}; {heard}", NOT_ASKED,
        )
    )  # fmt: skip
    unclaimed.append(
        _host_side(
            FRESH_STATE, not seen.fresh_state, "empty: no channel's files",
            f"holds {', '.join(seen.fresh_state)}" if seen.fresh_state else "empty", NOT_ASKED,
        )
    )  # fmt: skip
    inside = seen.claimed.inside
    claimed = evaluate(
        inside, memory=memory, pids_limit=pids_limit, state_quota_bytes=state_quota_bytes,
        outside=seen.claimed.outside, runtime=runtime, host_kernel=host_kernel,
    )  # fmt: skip
    entries = inside.get("state_entries")
    names = entries.split(",") if isinstance(entries, str) and entries else []
    shown = NOT_REPORTED if entries is None else f"/state: {', '.join(names) or 'empty'}"
    ok = MARKER in names
    expected = f"the channel's file {MARKER} in /state"
    claimed.append(LockdownCheck(CHANNEL_STATE, ok, shown, expected, NOT_LOOKED, "inside" if ok else ""))
    claimed.append(
        _host_side(
            HANDED_BACK,
            seen.handed_back,
            "the channel's once it closed",
            seen.handed_back_words,
        )
    )
    return [BoxCheck(UNCLAIMED, check) for check in unclaimed] + [
        BoxCheck(CLAIMED, check) for check in claimed
    ]


def spare_failed(error: str) -> list[BoxCheck]:
    """The one check of a spare that did not get through: ``error`` says where."""
    return [
        BoxCheck(
            SPARE,
            LockdownCheck(
                GOT_THROUGH, False, NOT_LOOKED,
                "as a host's pool and a session do", error,
            ),
        )
    ]  # fmt: skip
