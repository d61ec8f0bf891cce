"""The ``memory.*`` requests of a box, served by the host (issue 23; docs/memory.md).

``MemoryService`` answers the ``memory.*`` methods (``MEMORY_METHOD_NAMES``, models: ``box.protocol.memory``):
records, episodes and conversations, (issue 14) constructs, the slot and learned rules, and (issue 15) the
night's records, consolidation and forgetting (in the session's writes scope only), for one box at a time,
through the session's ``ScopedMemory``: the scopes are the host's decision (``scopes.resolve``), registered
when the box starts (``open``) and applied to every query; no request names one.

Only a box the host opened with memory is served (issue 32 #1): the host registers what ``box.init`` told
every box it starts (``open``: scopes, or None for a box given none), and a request of a box it did not
open with memory — a ``prompt`` task's box, a chat box of an imp whose memory is off, a box asking before
its ``box.init`` — is refused DENIED, rule ``memory-not-given``, and audited one row each (``ONE_BY_ONE``).
A box whose run lost its lease (``fence``, issue 32 #5) is refused the same way, rule ``lease``, and a write
already in flight when the lease is found lost is rolled back, never committed: the fence is asked again
inside the write's transaction, as its last step before the commit.

Bounds, besides the protocol models' own: at most ``max_requests_per_turn`` requests per turn (the next
is refused DENIED; a turn starts at the box's ``turn.stage`` "context" for a message the host handed that
box, once per message), a conversation's state at most
``MAX_CONVERSATION_STATE_BYTES`` (INVALID_PARAMS), a join naming a record outside the session refused
(DENIED). Every refusal counts against the box's conduct like any other (a flood ends the box).
The store unavailable answers INTERNAL_ERROR with a message saying so: the box answers without memory.

Issue 32 #4: a box's scopes follow its channel's audience. At the first request of each turn the host woke the
imp for (``stage`` with the message id), a chat, depart or reflect box has its channel's scopes read again
(``scopes.resolve``: one read a turn), so a public channel made private while its box is warm keeps its next
memories in its own scope. A sleep task's box keeps its one scope.

Audit in aggregate: one row per box turn, ``memory.*`` with the counts by method ("search 3, encode 1")
and the total latency, returned by ``stage`` / ``turn_ended`` / ``close`` for the gateway to write: the service
writes no row itself.

Wiring (``impyard.memory.act.MemoryAct``, the gateway's handler of ``memory.*``, registered by the host):

    service = memory_service(db, clock.now)                       # once, beside the gateway
    service.open(spec, await resolve(db, spec.imp, spec.channel_id))  # box start -> BoxInitParams.memory
    service.open(spec, None)                                      # a box given no memory (or never opened)
    return await service.serve(spec, method, params, fence=…)     # MemoryAct.handle
    row = service.stage(spec, "context", message_id)              # MemoryAct.turn_started: the core writes it
    row = service.close(spec)                                     # MemoryAct.closed: the core writes it
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar, cast

from pydantic import BaseModel
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from box.protocol import ErrorCode, RpcError
from box.protocol import memory as mem
from box.protocol.models import EmptyFromHost
from impyard.backends.base import BoxSpec
from impyard.backends.statedir import parse_size
from impyard.errors import ImpyardError
from impyard.gateway.audit import AuditRecord
from impyard.memory.cache import DEFAULT_CACHE_BYTES, VectorCache
from impyard.memory.errors import MemoryDenied, MemoryInvalid
from impyard.memory.scoped import ScopedMemory
from impyard.memory.scopes import SessionScopes, resolve
from impyard.memory.store import MemoryStore
from impyard.memory.vectors import VectorError
from impyard.storage.db import Database, DatabaseError

log = logging.getLogger("impyard.memory")

AUDIT_METHOD = "memory.*"
LIMIT_RULE = "memory-requests-per-turn"
LEARN_RULE = "memory-learning"
NIGHT_RULE = "memory-night"
NIGHT_METHODS = frozenset({"memory.consolidate", "memory.forget"})
SCOPE_RULE = MemoryDenied.rule  # "memory-scopes"
NOT_GIVEN_RULE = "memory-not-given"  # issue 32 #1: a box the host did not open with memory
LEASE_RULE = "lease"  # issue 32 #5: a run (or host) whose lease is lost acts no more, on memory neither
ONE_BY_ONE = frozenset(
    {NOT_GIVEN_RULE, LEASE_RULE}
)  # refusals the gateway audits one row each, with the rule
NOT_GIVEN_REASON = (
    "this box was not given memory (its box.init said memory: null): memory is off for this box"
)

Fence = Callable[[], str | None]  # None while the box may act, else why not (``LeaseGuard.check``)
_T = TypeVar("_T")
STORE_UNAVAILABLE = (
    "the memory store is unavailable right now (database error); answer without memory this turn"
)


@dataclass
class _Tally:
    """One box's memory requests since its audit row was last drained, and its count this turn."""

    imp: str
    channel_id: str
    scopes: SessionScopes | None = None
    opened: bool = False  # the host decided its scopes (None included: memory off)
    learns: int = 0  # rules this box may still learn (mechanism 90: a departure's box, one per departure)
    nights: bool = False  # whether it may fold and forget (mechanisms 107-113: a sleep task's box only)
    fence: Fence | None = None  # the lease of the box's run (a task run's), asked before and inside every act
    this_turn: int = 0
    methods: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # denied | invalid | error
    latency_ms: float = 0.0
    turns: set[str] = field(default_factory=set)  # the messages whose turn has started in this box
    rescope: bool = False  # a turn began: read the channel's scopes again at its first request (issue 32 #4)

    def drain(self, run_id: str) -> AuditRecord | None:
        if not self.methods:
            return None
        order = {name: i for i, name in enumerate(mem.MEMORY_METHOD_NAMES)}
        reason = ", ".join(
            f"{name.removeprefix('memory.')} {n}"
            for name, n in sorted(self.methods.items(), key=lambda x: order.get(x[0], 99))
        )
        verdict = "error" if self.refused["error"] else "denied" if self.refused else "allowed"
        detail = ", ".join(f"{kind} {n}" for kind, n in sorted(self.refused.items()))
        record = AuditRecord(
            imp=self.imp, method=AUDIT_METHOD, verdict=verdict, run_id=run_id, channel_id=self.channel_id,
            reason=reason, latency_ms=round(self.latency_ms, 3), detail=f"refused: {detail}" if detail else "",
        )  # fmt: skip
        self.methods.clear()
        self.refused.clear()
        self.latency_ms = 0.0
        return record


class MemoryService:
    """Serves ``memory.*`` for every box of this host; holds per box only its scopes and its tallies."""

    def __init__(
        self, store: MemoryStore, *, max_requests_per_turn: int = mem.MAX_MEMORY_REQUESTS_PER_TURN
    ) -> None:
        self.store = store
        self.max_requests_per_turn = max_requests_per_turn
        self._boxes: dict[str, _Tally] = {}

    # ------------------------------------------------------------ the box's life

    def open(
        self,
        spec: BoxSpec,
        scopes: SessionScopes | None,
        *,
        learns: int = 0,
        nights: bool = False,
        fence: Fence | None = None,
    ) -> mem.SessionMemory | None:
        """A box starts with these scopes (None: memory off). Returns ``BoxInitParams.memory``.

        Issue 32 #1: the host calls this for every box it starts, with what that box's ``box.init`` says,
        before it is sent; a box never opened, or opened with None, is refused every ``memory.*`` request
        (rule ``memory-not-given``). ``fence``: the lease of the box's run (``LeaseGuard.check``): once it
        answers a reason, every request is refused (rule ``lease``) and no write commits.

        ``learns``: how many rules the box may learn (``memory.dispositions.learn``). Rules are the imp's
        character in every scope (mechanism 90 learns one when a person leaves), so only the box of a
        ``depart`` task gets one; a chat box that asks is refused, and cannot rewrite who the imp is
        everywhere from one channel.

        ``nights``: whether the box may fold and forget (``memory.consolidate``, ``memory.forget``): only a
        ``sleep`` task's box, whose one scope is the night's; a chat box that asks is refused, so it cannot
        merge or delete its scope's memories ahead of the imp's own night."""
        tally = self._tally(spec)
        tally.scopes, tally.opened, tally.learns, tally.nights = scopes, True, max(0, learns), nights
        tally.fence = fence
        return scopes.session_memory() if scopes is not None else None

    def is_open(self, spec: BoxSpec) -> bool:
        """Whether the box's scopes were decided (``open``) since it started."""
        tally = self._boxes.get(spec.run_id)
        return tally is not None and tally.opened

    def given(self, spec: BoxSpec) -> bool:
        """Whether the host opened this box with memory (scopes, not None): only such a box is served."""
        tally = self._boxes.get(spec.run_id)
        return tally is not None and tally.opened and tally.scopes is not None

    def stage(self, spec: BoxSpec, stage: str, message_id: str | None = None) -> AuditRecord | None:
        """The box's ``turn.stage``: "context" starts a turn, so the last turn's row is returned and the
        per-turn count starts over. Other stages change nothing (a turn's memory work goes on after "post").

        With ``message_id`` (the gateway passes it only for the message the host handed this box for its turn:
        ``Gateway.turn_stage``, issue 32 #2), a message starts at most one turn of a box: announcing "context"
        again gets no fresh count, so the per-turn bound cannot be lifted by the box that it bounds."""
        if stage != "context":
            return None
        if message_id is not None:
            tally = self._tally(spec)
            if message_id in tally.turns:
                return None
            tally.turns.add(message_id)
            # Issue 32 #4: a channel's audience may have changed since the box started (a public channel made
            # private): its scopes are read again at the turn's first request. Not a night's box: its one scope
            # is its task's, not its channel's.
            tally.rescope = tally.opened and tally.scopes is not None and not tally.nights
        return self.turn_ended(spec)

    def turn_ended(self, spec: BoxSpec) -> AuditRecord | None:
        """End the box's turn: the per-turn count starts over; returns the turn's audit row, if any."""
        tally = self._boxes.get(spec.run_id)
        if tally is None:
            return None
        tally.this_turn = 0
        return tally.drain(spec.run_id)

    def drain_audit(self, spec: BoxSpec) -> AuditRecord | None:
        """The aggregate row of the requests since the last drain (None when there were none)."""
        tally = self._boxes.get(spec.run_id)
        return tally.drain(spec.run_id) if tally is not None else None

    def close(self, spec: BoxSpec) -> AuditRecord | None:
        """The box ended: forget it; returns its last audit row, if any."""
        tally = self._boxes.pop(spec.run_id, None)
        return tally.drain(spec.run_id) if tally is not None else None

    def _tally(self, spec: BoxSpec) -> _Tally:
        tally = self._boxes.get(spec.run_id)
        if tally is None:
            tally = self._boxes[spec.run_id] = _Tally(spec.imp, spec.channel_id)
        return tally

    # ------------------------------------------------------------ serving

    async def serve(
        self,
        spec: BoxSpec,
        method: str,
        params: BaseModel,
        *,
        scopes: SessionScopes | None = None,
        fence: Fence | None = None,
    ) -> BaseModel:
        """Answer one ``memory.*`` request of the box ``spec`` (its session's scopes, or ``scopes``: a test's
        engine kit, which stands for a box the host opened). ``fence``: the host's own lease (``serve``,
        ``chat``), asked with the run's (``open``) before the request and inside its write, before the commit.

        A box the host did not open with memory, and a box whose lease is lost, are refused before anything
        is counted or read (rules ``memory-not-given`` and ``lease``, in ``ONE_BY_ONE``: the gateway writes
        their audit rows)."""
        if scopes is None and not self.given(spec):
            raise _refusal(NOT_GIVEN_RULE, NOT_GIVEN_REASON)
        tally = self._tally(spec)
        fences = [check for check in (tally.fence, fence) if check is not None]
        stale = _stale(fences)
        if stale is not None:
            raise _refusal(LEASE_RULE, f"no lease to act: {stale}")
        tally.methods[method if method in mem.MEMORY_METHOD_NAMES else "memory.other"] += 1
        tally.this_turn += 1
        started = time.perf_counter()
        try:
            if tally.this_turn > self.max_requests_per_turn:
                reason = f"at most {self.max_requests_per_turn} memory requests per turn"
                raise RpcError(
                    ErrorCode.DENIED,
                    f"denied by rule {LIMIT_RULE}: {reason}",
                    {"rule": LIMIT_RULE, "reason": reason},
                )
            if tally.rescope and scopes is None:
                tally.rescope = False
                tally.scopes = await resolve(self.store.db, spec.imp, spec.channel_id)
            session = scopes if scopes is not None else tally.scopes
            if session is None:  # the channel's record is gone since the box started: memory off from now on
                raise _refusal(NOT_GIVEN_RULE, NOT_GIVEN_REASON)
            if method in NIGHT_METHODS and not tally.nights:
                reason = "only a night's box (a sleep task) folds or forgets memories"
                raise RpcError(
                    ErrorCode.DENIED,
                    f"denied by rule {NIGHT_RULE}: {reason}",
                    {"rule": NIGHT_RULE, "reason": reason},
                )
            if method == "memory.dispositions.learn":
                if tally.learns <= 0:
                    reason = "rules are learned only when a person leaves (a depart task), one per departure"
                    raise RpcError(
                        ErrorCode.DENIED,
                        f"denied by rule {LEARN_RULE}: {reason}",
                        {"rule": LEARN_RULE, "reason": reason},
                    )
                tally.learns -= 1
            handler = _HANDLERS.get(method)
            if handler is None:
                raise RpcError(ErrorCode.METHOD_NOT_FOUND, f"method not found: {method[:80]}")
            store = self.store if not fences else self._fenced(fences)
            scoped = store.scoped(spec.imp, session, spec.channel_id)
            return await self.store.db.run(handler, scoped, params)
        except _LeaseLostInFlight as exc:  # found lost inside the write: rolled back, nothing committed
            tally.refused["denied"] += 1
            raise _refusal(LEASE_RULE, f"no lease to act: {exc}") from None
        except RpcError as exc:
            tally.refused[
                "error"
                if exc.code == ErrorCode.INTERNAL_ERROR
                else "denied"
                if exc.code == ErrorCode.DENIED
                else "invalid"
            ] += 1
            raise
        except MemoryDenied as exc:  # outside the session's scopes, or a message deleted meanwhile
            tally.refused["denied"] += 1
            raise RpcError(ErrorCode.DENIED, str(exc), {"rule": exc.rule, "reason": str(exc)}) from None
        except (MemoryInvalid, VectorError) as exc:
            tally.refused["invalid"] += 1
            raise RpcError(ErrorCode.INVALID_PARAMS, f"invalid params for {method}: {exc}") from None
        except (SQLAlchemyError, DatabaseError, OSError) as exc:
            tally.refused["error"] += 1
            log.warning(
                "memory store unavailable for %s/%s on %s: %s", spec.imp, spec.channel_id, method, exc
            )
            raise RpcError(ErrorCode.INTERNAL_ERROR, STORE_UNAVAILABLE) from None
        finally:
            tally.latency_ms += (time.perf_counter() - started) * 1000

    def _fenced(self, fences: list[Fence]) -> MemoryStore:
        """The store, its writes fenced: each write transaction asks ``fences`` as its last step and is rolled
        back when one answers (issue 32 #5). A shallow copy: the cache and the counts are the store's own."""
        store = copy.copy(self.store)
        store.db = cast(Database, _FencedWrites(self.store.db, fences))
        return store


def _refusal(rule: str, reason: str) -> RpcError:
    return RpcError(ErrorCode.DENIED, f"denied by rule {rule}: {reason}", {"rule": rule, "reason": reason})


def _stale(fences: list[Fence]) -> str | None:
    for check in fences:
        stale = check()
        if stale is not None:
            return stale
    return None


class _LeaseLostInFlight(Exception):
    """Raised inside a memory write whose box's lease was found lost: the transaction is rolled back."""


class _FencedWrites:
    """The host database as a fenced request's store sees it: every ``write`` runs its work, then asks the
    fences inside the same transaction, so a write never commits once its lease is known lost. Everything
    else is the database's own."""

    def __init__(self, db: Database, fences: list[Fence]) -> None:
        self._db = db
        self._fences = fences

    def write(self, fn: Callable[[Connection], _T], **options: Any) -> _T:
        def fenced(conn: Connection) -> _T:
            result = fn(conn)
            stale = _stale(self._fences)
            if stale is not None:
                raise _LeaseLostInFlight(stale)
            return result

        return self._db.write(fenced, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


# ------------------------------------------------------------------ the handlers (run on a worker thread)


def _records(scoped: ScopedMemory, records: list[mem.RecordView]) -> mem.RecordsResult:
    return mem.RecordsResult(records=records, total=scoped.count())


def _search(scoped: ScopedMemory, p: mem.SearchParams) -> mem.RecordsResult:
    return _records(scoped, scoped.search(p.vector, p.names, p.k, p.kinds, p.episodes, p.with_vectors))


def _recent(scoped: ScopedMemory, p: mem.RecentParams) -> mem.RecordsResult:
    return _records(scoped, scoped.recent(p.k, p.kinds, p.episodes, p.with_vectors))


def _about(scoped: ScopedMemory, p: mem.AboutParams) -> mem.RecordsResult:
    return _records(scoped, scoped.about(p.person, p.k, p.exclude, p.kinds, p.episodes, p.with_vectors))


def _constructs(scoped: ScopedMemory, p: mem.ConstructsParams) -> mem.RecordsResult:
    return _records(scoped, scoped.constructs(p.construct_kind, p.k, p.episodes))


def _episodes(scoped: ScopedMemory, p: mem.EpisodesParams) -> mem.EpisodesResult:
    return mem.EpisodesResult(episodes=scoped.episodes(p.record_ids, p.per_record))


def _encode(scoped: ScopedMemory, p: mem.EncodeParams) -> mem.EncodeResult:
    record_id, episode_id = scoped.encode(p)
    return mem.EncodeResult(record_id=record_id, episode_id=episode_id)


def _restore(scoped: ScopedMemory, p: mem.RestoreParams) -> mem.RestoreResult:
    return mem.RestoreResult(restored=scoped.restore(p.items))


def _conversation_get(scoped: ScopedMemory, p: mem.ConversationGetParams) -> mem.ConversationState:
    state, updated_at = scoped.conversation_get(p.person)
    return mem.ConversationState(state=state, updated_at=updated_at)


def _conversation_put(scoped: ScopedMemory, p: mem.ConversationPutParams) -> EmptyFromHost:
    scoped.conversation_put(p.person, p.state)
    return EmptyFromHost()


def _construct(scoped: ScopedMemory, p: mem.ConstructParams) -> mem.ConstructResult:
    record_id, created, previous, slot = scoped.construct(p)
    return mem.ConstructResult(record_id=record_id, created=created, previous=previous, slot=slot)


def _slot(scoped: ScopedMemory, p: mem.SlotParams) -> mem.SlotResult:
    return mem.SlotResult(entries=scoped.slot())


def _slot_refresh(scoped: ScopedMemory, p: mem.SlotRefreshParams) -> mem.SlotResult:
    return mem.SlotResult(entries=scoped.slot_refresh(p.record_ids))


def _dispositions(scoped: ScopedMemory, p: mem.DispositionsParams) -> mem.DispositionsResult:
    return mem.DispositionsResult(rules=scoped.dispositions(p.k, p.active_only))


def _learn(scoped: ScopedMemory, p: mem.LearnParams) -> mem.LearnResult:
    return scoped.learn(p)


def _night(scoped: ScopedMemory, p: mem.NightParams) -> mem.RecordsResult:
    return _records(scoped, scoped.night(p.since, p.k, p.episodes))


def _consolidate(scoped: ScopedMemory, p: mem.ConsolidateParams) -> mem.ConsolidateResult:
    return scoped.consolidate([(group.anchor, group.members) for group in p.groups])


def _forget(scoped: ScopedMemory, p: mem.ForgetParams) -> mem.ForgetResult:
    records, episodes = scoped.forget()
    return mem.ForgetResult(forgotten=records, episodes=episodes)


_HANDLERS: dict[str, Callable[[ScopedMemory, Any], BaseModel]] = {
    "memory.search": _search,
    "memory.recent": _recent,
    "memory.about": _about,
    "memory.constructs": _constructs,
    "memory.episodes": _episodes,
    "memory.encode": _encode,
    "memory.restore": _restore,
    "memory.conversation.get": _conversation_get,
    "memory.conversation.put": _conversation_put,
    "memory.construct": _construct,
    "memory.slot": _slot,
    "memory.slot.refresh": _slot_refresh,
    "memory.dispositions": _dispositions,
    "memory.dispositions.learn": _learn,
    "memory.night": _night,
    "memory.consolidate": _consolidate,
    "memory.forget": _forget,
}


class CacheSettingError(ImpyardError, ValueError):
    """IMPYARD_MEMORY_CACHE is not a size."""


def cache_bytes_from_env(environ: dict[str, str] | None = None) -> int:
    """``IMPYARD_MEMORY_CACHE``: the most the host's vector cache holds (e.g. ``512m``, ``2g``; default 512m).
    Past it, the least recently used (imp, scope) matrix is evicted and reloaded when next asked for."""
    raw = (environ if environ is not None else dict(os.environ)).get("IMPYARD_MEMORY_CACHE", "").strip()
    if not raw:
        return DEFAULT_CACHE_BYTES
    try:
        value = parse_size(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise CacheSettingError(f"IMPYARD_MEMORY_CACHE must be a size such as 512m or 2g (got {raw!r})")
    return value


def memory_service(
    db: Database,
    clock: Callable[[], datetime],
    *,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    max_requests_per_turn: int = mem.MAX_MEMORY_REQUESTS_PER_TURN,
) -> MemoryService:
    """The service over the host database with a vector cache of ``cache_bytes`` (one per host process)."""
    store = MemoryStore(db, clock, VectorCache(cache_bytes))
    return MemoryService(store, max_requests_per_turn=max_requests_per_turn)
