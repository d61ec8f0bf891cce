"""The gateway (docs/architecture.md, docs/security.md): the host's BoxHost. Every box request passes, in order:

schema validation (the protocol peer, before we are called) → the policy judge
→ trust, for acts (auto / gate / earned) → budget reserve (atomic, the hard
stop) → execution on the host with the real credential → settle the ledger
with the measured cost → one audit row.

Refusals are JSON-RPC errors the box's model can read: -32010 with
{rule, reason}, -32011 with {ledger, retry_after}, -32012 with {retry_after},
-32013 when the upstream cannot be reached (or no model key is configured:
that is the host's setup, not a policy decision, so it is -32013 with a
message that says how to set OPENAI_API_KEY / OPENAI_BASE_URL).

The checks before execution are one decision per request kind (``_decide_model``,
``_decide_send``, ``_decide_fetch``), in one order; the handlers act on it, and
``dry_run`` asks the same decision without taking a rate-meter event, reserving
budget, opening a gate, calling the upstream or writing an audit row (issue 12:
``impyard policy check`` explains what the gateway itself would answer).

SQLite work runs in worker threads (``Database.run``): the event loop never
waits on a write lock.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel
from sqlalchemy.engine import Connection

from box.protocol import ErrorCode, RpcError
from box.protocol.history import (
    HistoryCommitParams,
    HistoryCommitResult,
    HistoryLoadParams,
    HistoryLoadResult,
)
from box.protocol.memory import SessionMemory
from box.protocol.models import (
    DiscordSendParams,
    DiscordSendResult,
    HttpFetchParams,
    HttpFetchResult,
    LogParams,
    ModelRequestParams,
    ModelRequestResult,
    TurnStageParams,
)
from impyard.backends.base import BoxSpec
from impyard.backends.conduct import printable
from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.clock import Clock, SystemClock
from impyard.conversation.history_surface import HistorySurface
from impyard.conversation.responder_history import ResponderHistory, line_views
from impyard.gateway.audit import AuditLog, AuditRecord, known_secrets, redact
from impyard.gateway.broker import (
    NO_KEY_MESSAGE,
    ModelBroker,
    UpstreamConfig,
    UpstreamResponse,
    UpstreamUnreachable,
    encode_body,
)
from impyard.gateway.fetch import FetchFailed, FetchRefused, HttpFetcher
from impyard.gateway.gates import Approver, Gate, GateStore
from impyard.gateway.judge import (
    RequestFacts,
    decode_file,
    discord_send_facts,
    http_fetch_facts,
    judge,
    model_request_facts,
)
from impyard.gateway.ledger import BudgetExhausted, Ledger, Reservation
from impyard.gateway.policy import Policy
from impyard.gateway.policy_models import Price, Rule
from impyard.gateway.prices import (
    PriceMissing,
    bound_output,
    estimate_micros,
    measured_micros,
    tier_multiplier,
)
from impyard.gateway.rate_precheck import PRECHECKED_PURPOSES, SendOutlook, precheck, reply_probe
from impyard.gateway.surfaces import OutgoingFile, Surface, SurfaceError, surface_of
from impyard.gateway.trust import ChannelTrust, EarnedTrust, TrustDecision, decide_trust
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import ONE_BY_ONE as MEMORY_ONE_BY_ONE
from impyard.memory.service import MemoryService
from impyard.storage import faults as storage_faults
from impyard.storage.db import STORAGE_ERRORS, Database

if TYPE_CHECKING:
    from impyard.storage.leases import LeaseGuard

log = logging.getLogger("impyard.gateway")

# Issue 19 #4: at the host's stop, model calls still in flight get this long to finish before they are cut.
CALL_GRACE_S = 10.0

# Issue 19 #1: what a failed write of the host's own database is, and how a box is told (the box reads the kind).
STORAGE_FAILED = "the host's storage failed"


def storage_failed(exc: BaseException | None = None, where: str = "") -> RpcError:
    """The box's error for a failure of the host's database: which kind, in words (impyard.storage.faults; a full
    disk when no error is given), never the driver's own text (it may quote a server's address or a query)."""
    fault = storage_faults.classify(exc, where) if exc is not None else storage_faults.Fault("full")
    return RpcError(
        ErrorCode.INTERNAL_ERROR, f"{STORAGE_FAILED}: {storage_faults.words(fault)}", {"kind": "store"}
    )


PRICES_RULE = "prices"  # the rule name a refusal for a missing price carries
UPSTREAM_RULE = "upstream-limits"
EGRESS_RULE = "egress"
HISTORY_RULE = "history-own-channel"  # issue 22: a box reads and writes only its own channel's lines
HISTORY_RATE_RULE = "history-requests"
HISTORY_REQUESTS_PER_MINUTE = 120  # per box: a turn makes two (one load, one commit), an event one
RATE_WINDOW_S = 60.0
SEND_ACT = "discord.send"
LEASE_RULE = "lease"  # issue 21: a host that lost its lease acts no more

StageCallback = Callable[[BoxSpec, TurnStageParams], Awaitable[None]]
GateCallback = Callable[
    [Gate], Awaitable[None]
]  # a gate was opened (the Discord surface posts an approval card)


class RateMeter:
    """Sliding one-minute windows per key, on the gateway's clock (in memory: a restart forgives)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._events: dict[tuple[str, ...], deque[float]] = defaultdict(deque)

    def take(self, key: tuple[str, ...], per_minute: int) -> float | None:
        """Count one event; None when within the limit, else the seconds until one is free (not counted)."""
        now = self.clock.now().timestamp()
        events = self._events[key]
        while events and events[0] <= now - RATE_WINDOW_S:
            events.popleft()
        if len(events) >= per_minute:
            return max(0.001, events[0] + RATE_WINDOW_S - now)
        events.append(now)
        return None

    def peek(self, key: tuple[str, ...], per_minute: int) -> float | None:
        """What ``take`` would answer now, without counting the event (a dry run)."""
        now = self.clock.now().timestamp()
        recent = [at for at in self._events.get(key, ()) if at > now - RATE_WINDOW_S]
        if len(recent) >= per_minute:
            return max(0.001, recent[0] + RATE_WINDOW_S - now)
        return None


Outcome = Literal["allowed", "gated", "denied", "rate_limited", "budget_exhausted", "unreachable"]


@dataclass(frozen=True)
class Decision:
    """What the gateway decides on one box request before it acts; ``Gateway.dry_run`` returns it.

    ``rule`` and ``verdict`` are what the request's audit row would say; ``error`` is what the box would be
    answered instead of the act (None: it goes ahead now, or waits at a gate when ``verdict`` is "gated").
    """

    verdict: Outcome
    rule: str
    reason: str
    error: RpcError | None = field(default=None, compare=False)
    trust: TrustDecision | None = (
        None  # discord.send past the judge and the rate limit: auto or gate, and why
    )
    estimate_micros: int | None = (
        None  # model.request past the price table: what is reserved (its worst case)
    )

    @property
    def allowed(self) -> bool:
        """Nothing refuses it: it is executed now, or (gated) once someone approves it."""
        return self.error is None


@dataclass
class _Plan:
    """What a decision found on its way, for the handler that acts on it."""

    facts: RequestFacts
    rule: Rule | None = None
    raw: bytes = b""  # model.request: the body as it is sent upstream
    body: dict[str, Any] = field(default_factory=dict)
    output_cap: int | None = None  # model.request: the cap the host added to a body that set none
    price: Price | None = None
    multiplier: float = 1.0
    reservation: Reservation | None = None  # model.request, committed: the budget held for the call


@dataclass(frozen=True)
class _SendFacts:
    """What a ``discord.send`` decision reads of the database (one read transaction): the session channel's trust,
    the clean approvals of this imp for the target, and the target channel as known (None: unknown, or not
    needed)."""

    own_trusted: bool
    clean_approvals: int
    target: ChannelInfo | None


@dataclass(eq=False)
class _UpstreamCall:
    """One model call in flight: the handler waits on ``done``; ``orphaned`` once its box went away."""

    spec: BoxSpec
    params: ModelRequestParams
    plan: _Plan
    reservation: Reservation
    estimate: int
    record: AuditRecord
    done: anyio.Event = field(default_factory=anyio.Event)
    response: UpstreamResponse | None = None
    error: RpcError | None = None
    orphaned: bool = False
    detached: bool = False  # runs in the gateway's task group


@dataclass(frozen=True)
class GatewayStores:
    """What the gateway reads and writes (issue 12: the gateway is handed its stores). The host builds them once
    and shares them with its adapters, so a gate, a ledger row or a channel is asked of the same store
    everywhere and nobody reaches through the gateway's database."""

    db: Database
    channels: ChannelTrust
    audit: AuditLog
    ledger: Ledger
    earned: EarnedTrust
    gates: GateStore

    @classmethod
    def over(
        cls,
        db: Database,
        *,
        policy: Policy,
        clock: Clock,
        secrets: Collection[str],
        channels: ChannelTrust | None = None,
    ) -> GatewayStores:
        """Every store of the gateway over one database; ``secrets`` are redacted from every audit row."""
        audit = AuditLog(db, clock, list(secrets))
        earned = EarnedTrust(db, clock)
        return cls(
            db=db, channels=channels or ChannelStore(db, clock), audit=audit, ledger=Ledger(db, policy, clock),
            earned=earned, gates=GateStore(db, clock, audit, earned),
        )  # fmt: skip


def host_secrets(upstream: UpstreamConfig, secrets: Collection[str] | None = None) -> list[str]:
    """What must never be shown: the credentials this host holds (or ``secrets``), the model key and the base
    URL's userinfo and query (issue 11 #9), whoever configured them."""
    return sorted({*(secrets if secrets is not None else known_secrets()), *upstream.secrets})


class Gateway:
    """Implements ``BoxHost.serve`` for every box of this host."""

    def __init__(
        self,
        *,
        policy: Policy,
        surface: Surface,
        stores: GatewayStores | None = None,
        db: Database | None = None,
        clock: Clock | None = None,
        upstream: UpstreamConfig | None = None,
        broker: ModelBroker | None = None,
        fetcher: HttpFetcher | None = None,
        channels: ChannelTrust | None = None,
        owners: Mapping[str, Collection[str]] | None = None,
        staff_channels: Mapping[str, Collection[str]] | None = None,
        on_stage: StageCallback | None = None,
        on_gate: GateCallback | None = None,
        secrets: Collection[str] | None = None,
        surfaces: Collection[str] | None = None,
        settle_abandoned: bool = True,
        memory: MemoryService | None = None,
        responder_history: ResponderHistory | None = None,
    ) -> None:
        """``stores``: what the gateway reads and writes, built by the host (``impyard.host``); a gateway given
        only ``db`` (and ``channels``) builds its own over it (tests, ``policy check``).
        ``surfaces``: where this host's surface posts (``impyard.gateway.surfaces.surface_of`` names); None = everywhere.
        ``on_stage``: hears every box's ``turn.stage`` (a window for tests; a session's typing indicator is its
        own observer, handed the stage by the session manager before it gets here). ``settle_abandoned=False``
        writes nothing at start: a gateway that only answers ``dry_run``. ``memory``: serves the boxes'
        ``memory.*`` requests (issue 23); None: a box asking for memory is refused. ``responder_history``: keeps
        the boxes' own lines (``history.*``, issue 22); None: one over ``db`` with the default limits."""
        if stores is None and db is None:
            raise TypeError("Gateway needs its stores (or a database to build them over)")
        self._policy = policy
        self.surface = surface
        self.clock = clock or SystemClock()
        self.broker = broker or ModelBroker(upstream or UpstreamConfig.from_env(), policy.upstream)
        self.fetcher = fetcher or HttpFetcher(policy.http)
        self.secrets = host_secrets(self.broker.config, secrets)
        if stores is None:
            assert db is not None
            stores = GatewayStores.over(
                db, policy=policy, clock=self.clock, secrets=self.secrets, channels=channels
            )
        self.stores = stores
        self.db = stores.db
        self.channels = stores.channels
        self.audit = stores.audit
        self.ledger = stores.ledger
        self.earned = stores.earned
        self.gates = stores.gates
        self.owners = {imp: frozenset(ids) for imp, ids in (owners or {}).items()}
        self.staff_channels = {imp: tuple(ids) for imp, ids in (staff_channels or {}).items()}
        self.on_stage = on_stage
        self.on_gate = on_gate
        self.surfaces = frozenset(surfaces) if surfaces is not None else None
        self.rates = RateMeter(self.clock)
        self.memory = memory
        self.responder_history = responder_history or ResponderHistory(self.db, self.clock)
        self._history_loads: dict[str, int] = {}  # per box (run id): loads not yet audited with a commit
        self.lease_guard: LeaseGuard | None = None  # issue 21: set by a host that holds leases (serve, chat)
        self._calls: TaskGroup | None = None  # set while ``running``
        self._detached: set[_UpstreamCall] = set()  # calls in flight in that task group
        self._handlers: dict[str, Callable[[BoxSpec, Any, AuditRecord], Awaitable[BaseModel]]] = {
            "model.request": self._model_request,
            "discord.send": self._discord_send,
            "http.fetch": self._http_fetch,
            "history.load": self._history_load,
            "history.commit": self._history_commit,
        }
        if settle_abandoned:
            self.settle_orphans()

    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        """Swap in a reloaded policy (already validated: a broken file never gets this far)."""
        self._policy = policy
        self.ledger.policy = policy
        self.broker.settings = policy.upstream
        self.fetcher.settings = policy.http

    def _stale(self) -> str | None:
        """Why this host may act no more (its lease lost or past its deadline), or None. Local: no database hop."""
        return self.lease_guard.check() if self.lease_guard is not None else None

    def settle_orphans(self) -> int:
        """Model calls a stopped host left in flight are settled now, each with an audit row (issue 19 #4): at
        once where their process is gone, after an hour where this machine cannot tell (ledger.settle_orphans)."""
        orphans = self.ledger.settle_orphans()
        for orphan in orphans:
            log.warning(
                "settled model call %d of %s at its reservation: %s", orphan.id, orphan.imp, orphan.reason
            )
            record = AuditRecord(
                imp=orphan.imp, method=orphan.method or "model.request", verdict="interrupted",
                purpose=orphan.purpose, reason=orphan.reason, cost_micros=orphan.reserved_micros,
                detail=f"ledger row {orphan.id} model={orphan.model}",
            )  # fmt: skip
            try:
                self.audit.write(record)
            except STORAGE_ERRORS as exc:
                log.error("could not audit the settled model call %d: %s", orphan.id, exc)
        return len(orphans)

    @asynccontextmanager
    async def running(self, grace_s: float = CALL_GRACE_S) -> AsyncIterator[Gateway]:
        """The gateway's own task group for model calls in flight: a call outlives a box that dies while the
        model answers. On the way out, calls still running get ``grace_s`` to finish, then are cut (and charged
        their reservation, with an audit row saying so)."""
        async with anyio.create_task_group() as calls:
            self._calls = calls
            try:
                yield self
            finally:
                self._calls = None  # calls from here on run inline, cut with their caller
                with anyio.CancelScope(shield=True), anyio.move_on_after(grace_s):
                    for call in list(self._detached):
                        await call.done.wait()
                calls.cancel_scope.cancel()

    async def aclose(self) -> None:
        await self.broker.aclose()

    # ------------------------------------------------------------ BoxHost

    async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
        """A box request the protocol refused before judging (unknown method, invalid params): audited too."""
        record = AuditRecord(
            imp=spec.imp, method=method, verdict="invalid", run_id=spec.run_id, channel_id=spec.channel_id,
            reason=f"refused by the protocol ({code}): {reason}",
        )  # fmt: skip
        await self.db.quick(self.audit.write, record)

    async def closed(self, spec: BoxSpec) -> None:
        """A box ended: its memory scopes are forgotten and its last turn's memory and history requests audited."""
        if self.memory is not None:
            await self._write_memory_row(self.memory.close(spec))
        await self._write_memory_row(self._history_closed(spec))

    async def _write_memory_row(self, row: AuditRecord | None) -> None:
        if row is not None:
            with anyio.CancelScope(shield=True):
                await self.db.quick(self.audit.write, row)

    def given(self, spec: BoxSpec, memory: SessionMemory | None) -> None:
        """What ``box.init`` gives a session's box, told before it is sent (issue 32 #1): memory in these scopes,
        or none. The gateway serves ``memory.*`` to that box exactly as its ``box.init`` said, and refuses every
        other box (rule ``memory-not-given``). A task's box is opened by the supervisor (``_init_params``)."""
        if self.memory is not None:
            scopes = SessionScopes(memory.writes, tuple(memory.reads)) if memory is not None else None
            self.memory.open(spec, scopes)

    async def _memory(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel:
        """``memory.*`` (issue 23): served only to a box the host opened with memory (``given``, or the
        supervisor for a task's box), in the scopes its ``box.init`` told it, never worked out on the box's
        first request (issue 32 #1). Fenced by this host's lease as every act is (issue 32 #5). Audited in
        aggregate, one row per turn (the service's tallies), not one per request; a box refused memory or a
        lease gets one row per refusal, with its rule (the box's refusal budget ends a flood of them)."""
        if self.memory is None:
            raise RpcError(
                ErrorCode.DENIED,
                "denied: this host keeps no memory",
                {"rule": "memory-off", "reason": "no store"},
            )
        try:
            return await self.memory.serve(
                spec, method, params, fence=self._stale if self.lease_guard is not None else None
            )
        except RpcError as exc:
            rule = exc.data.get("rule") if isinstance(exc.data, dict) else None
            if rule in MEMORY_ONE_BY_ONE:
                record = AuditRecord(
                    imp=spec.imp, method=method, verdict="denied", rule=str(rule), run_id=spec.run_id,
                    channel_id=spec.channel_id, reason=str(exc.data.get("reason", exc.message)),
                )  # fmt: skip
                with anyio.CancelScope(shield=True):
                    try:
                        await self.db.quick(self.audit.write, record)
                    except STORAGE_ERRORS as failure:  # the refusal stands; the disk is the log's to report
                        log.error("could not audit %s refused to %s: %s", method, spec.imp, failure)
            raise

    async def turn_stage(self, spec: BoxSpec, params: TurnStageParams, *, woken: bool = False) -> None:
        """The box's ``turn.stage``. ``woken``: the message it names is the one the host handed this box for the
        turn now running (the session that delivered it says so: ``SessionBoxHost``); only then does "context"
        start a turn of the memory's per-turn bound, once per message and box. Anything else a box announces —
        an old message of its channel, one another box was handed, an id of its own — starts nothing (issue 32
        #2: a box replaying old message ids would lift the bound it is held to)."""
        if self.memory is not None and params.stage == "context" and woken:
            await self._write_memory_row(self.memory.stage(spec, params.stage, params.message_id))
        if self.on_stage is not None:
            await self.on_stage(spec, params)

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        if method == "turn.stage":
            assert isinstance(params, TurnStageParams)
            await self.turn_stage(spec, params)
            return None
        if method.startswith("memory."):
            return await self._memory(spec, method, params)
        if method == "log":
            assert isinstance(params, LogParams)
            # Box text is made printable: it can never start a forged line of the host's log (issue 11 #8).
            fields = " ".join(
                f"{printable(key, 64)}={printable(repr(value), 200)}" for key, value in params.fields.items()
            )
            logging.getLogger(f"impyard.box.{spec.imp}").log(
                logging.getLevelName(params.level.upper()),
                "box %s/%s: %s%s", spec.imp, spec.channel_id, printable(params.message), f" [{fields}]" if fields else "",
            )  # fmt: skip
            return None
        handler = self._handlers.get(method)
        if handler is None:
            raise RpcError(ErrorCode.METHOD_NOT_FOUND, f"method not found: {method[:80]}")
        started = time.perf_counter()
        record = AuditRecord(
            imp=spec.imp, method=method, run_id=spec.run_id, channel_id=spec.channel_id, started=started
        )
        try:
            stale = self._stale()  # before the handler: nothing reserved, gated, fetched or posted (issue 21)
            if stale is not None:
                raise self._refusal(
                    self._denied(LEASE_RULE, f"this host holds no lease to act: {stale}"), record
                )
            return await handler(spec, params, record)
        except RpcError as exc:
            record.reason = record.reason or exc.message
            raise self._redacted(exc) from None
        except Exception as exc:
            log.exception("gateway failed on %s for %s", method, spec.imp)
            record.verdict, record.reason = "error", "internal error"
            if isinstance(exc, STORAGE_ERRORS):  # issue 19 #1: the box (and the person) learn it was the disk
                failure = storage_failed(exc, self.db.url.where())
                record.reason = failure.message
                raise failure from None
            raise RpcError(ErrorCode.INTERNAL_ERROR, "internal error in the host's gateway") from None
        finally:
            if not record.deferred:  # not written yet with the request's last write (issue 18): written now
                record.latency_ms = round((time.perf_counter() - started) * 1000, 3)
                with anyio.CancelScope(shield=True):
                    try:
                        await self.db.quick(self.audit.write, record)
                    except STORAGE_ERRORS as exc:  # a full disk: the request is refused, in so many words
                        log.error("could not audit %s for %s: %s", method, spec.imp, exc)
                        raise storage_failed(exc, self.db.url.where()) from None

    async def dry_run(self, spec: BoxSpec, method: str, params: BaseModel) -> Decision:
        """The decision ``serve`` would take on this request now, without acting on it (issue 12): every check
        in the same order, but no rate-meter event is taken, no budget reserved, no gate opened, nothing sent
        upstream or posted, and no audit row written. ``params`` are the method's protocol params."""
        if method == "model.request" and isinstance(params, ModelRequestParams):
            decision, _ = await self._decide_model(spec, params, commit=False)
        elif method == "discord.send" and isinstance(params, DiscordSendParams):
            decision = await self._decide_send(spec, params, commit=False)
        elif method == "http.fetch" and isinstance(params, HttpFetchParams):
            decision, _ = await self._decide_fetch(spec, params, commit=False)
        else:
            raise ValueError(
                f"no decision for {method!r} with {type(params).__name__}: dry_run takes the params of "
                "model.request, discord.send or http.fetch"
            )
        error = self._redacted(decision.error) if decision.error is not None else None
        return replace(decision, reason=redact(decision.reason, self.secrets), error=error)

    # ------------------------------------------------------------ refusals

    def _redacted(self, exc: RpcError) -> RpcError:
        """The refusal as the box may see it: no secret of the host in its message or data."""
        data = (
            {
                key: redact(value, self.secrets) if isinstance(value, str) else value
                for key, value in exc.data.items()
            }
            if isinstance(exc.data, dict)
            else exc.data
        )
        return RpcError(exc.code, redact(exc.message, self.secrets), data)

    @staticmethod
    def _denied(rule: str, reason: str) -> Decision:
        error = RpcError(
            ErrorCode.DENIED, f"denied by policy rule {rule}: {reason}", {"rule": rule, "reason": reason}
        )
        return Decision("denied", rule, reason, error)

    @staticmethod
    def _refusal(decision: Decision, record: AuditRecord) -> RpcError:
        """Put a refusal on the audit row; returns what the box is answered."""
        assert decision.error is not None
        record.verdict, record.rule, record.reason = decision.verdict, decision.rule, decision.reason
        return decision.error

    def _enforce(self, decision: Decision, record: AuditRecord) -> None:
        """Put the decision's rule on the audit row; a refusal is raised for the box."""
        record.rule = decision.rule
        if decision.error is not None:
            raise self._refusal(decision, record)

    def _rate(self, rule: Rule, key: tuple[str, ...], *, commit: bool) -> Decision | None:
        """The rule's rate limit: None within it; ``commit`` counts this request (a dry run only looks)."""
        if rule.rate_per_minute is None:
            return None
        meter = self.rates.take if commit else self.rates.peek
        wait = meter((rule.name, *key), rule.rate_per_minute)
        if wait is None:
            return None
        retry_after = round(wait, 3)
        error = RpcError(
            ErrorCode.RATE_LIMITED,
            f"rate limited by rule {rule.name}: at most {rule.rate_per_minute} per minute; retry in {retry_after} s",
            {"retry_after": retry_after, "rule": rule.name},
        )
        return Decision("rate_limited", rule.name, f"over {rule.rate_per_minute} per minute", error)

    # ------------------------------------------------------------ model.request

    async def _decide_model(
        self, spec: BoxSpec, params: ModelRequestParams, *, commit: bool
    ) -> tuple[Decision, _Plan]:
        """judge (facts, the body allow-list, caps, size) → price and estimate → request size → model key →
        rate limit → budget. ``commit`` takes the rate-meter event and reserves the estimate (the live call)."""
        raw = encode_body(params.body)
        plan = _Plan(
            model_request_facts(spec.imp, spec.channel_id, params, len(raw)), raw=raw, body=params.body
        )
        facts = plan.facts
        verdict = judge(facts, self.policy)
        if not verdict.allowed:
            return self._denied(verdict.rule, verdict.reason), plan
        assert verdict.matched is not None and facts.model is not None
        rule = plan.rule = verdict.matched
        price = self.policy.price(facts.model)
        if price is None:
            reason = (
                f'model {facts.model!r} has no price in the price table (add [prices."{facts.model}"] to a policy '
                "file); it is refused rather than assumed free"
            )
            return self._denied(PRICES_RULE, reason), plan
        # issue 11 #3: a text call without an output cap is sent one within the rule's limit, so the upstream
        # cannot write past the reservation; what is forwarded is what is priced.
        cap = min(
            limit
            for limit in (rule.max_tokens, self.policy.upstream.default_output_tokens)
            if limit is not None
        )
        body = bound_output(params.path, params.body, cap)
        if body is not params.body:
            plan.raw, plan.body, plan.output_cap = encode_body(body), body, cap
        try:
            multiplier = tier_multiplier(price, body.get("service_tier"), facts.model)
            estimate = estimate_micros(
                params.path, body, len(plan.raw), price, default_output_tokens=cap, input_images=facts.input_images,
                inline_image_bytes=facts.inline_image_bytes,
                stored_context_tokens=(rule.stored_context_tokens or 0) if facts.stored_context else 0,
            )  # fmt: skip
        except PriceMissing as exc:
            return self._denied(PRICES_RULE, str(exc)), plan
        plan.price, plan.multiplier = price, multiplier
        if len(plan.raw) > self.policy.upstream.max_request_bytes:
            reason = f"the body is {len(plan.raw)} bytes, over {self.policy.upstream.max_request_bytes}"
            return replace(self._denied(UPSTREAM_RULE, reason), estimate_micros=estimate), plan
        if not self.broker.configured:
            error = RpcError(
                ErrorCode.UPSTREAM_UNREACHABLE, NO_KEY_MESSAGE, {"reason": "no model key configured"}
            )
            return Decision("unreachable", rule.name, NO_KEY_MESSAGE, error, estimate_micros=estimate), plan
        refused = precheck(params.purpose, self._reply_outlook(spec, params.purpose))  # issue 19 #3
        if refused is not None:  # before the model's own meter counts a call that is not made
            decision = Decision("rate_limited", refused.rule, refused.reason, refused.error)
            return replace(decision, estimate_micros=estimate), plan
        limited = self._rate(rule, (spec.imp,), commit=commit)
        if limited is not None:
            return replace(limited, estimate_micros=estimate), plan
        try:
            if commit:
                plan.reservation = await self.db.quick(
                    self.ledger.reserve, spec.imp, estimate, method="model.request", purpose=params.purpose,
                    model=facts.model,
                )  # fmt: skip
            else:
                await self.db.quick(self.ledger.check_headroom, spec.imp, estimate)
        except BudgetExhausted as exc:
            error = RpcError(
                ErrorCode.BUDGET_EXHAUSTED,
                f"budget exhausted: {exc}",
                {"ledger": exc.ledger, "retry_after": exc.retry_after_s},
            )
            return Decision("budget_exhausted", "budget", str(exc), error, estimate_micros=estimate), plan
        return Decision("allowed", rule.name, "allowed", estimate_micros=estimate), plan

    def _reply_outlook(self, spec: BoxSpec, purpose: str) -> SendOutlook | None:
        """What the send rule of a reply in the turn's own channel says now (nothing counted); None for a call
        whose answer is not such a reply, or a send no rule allows (refused for that, not checked here)."""
        if purpose not in PRECHECKED_PURPOSES:
            return None
        probe = reply_probe(spec.channel_id)
        facts = discord_send_facts(spec.imp, spec.channel_id, probe, self.staff_channels.get(spec.imp, ()))
        verdict = judge(facts, self.policy)
        if not verdict.allowed or verdict.matched is None:
            return None
        rule = verdict.matched
        limited = self._rate(rule, (spec.imp, probe.channel_id), commit=False)
        retry_after = limited.error.data["retry_after"] if limited and limited.error else None
        return SendOutlook(rule.name, rule.rate_per_minute, retry_after)

    async def _model_request(
        self, spec: BoxSpec, params: ModelRequestParams, record: AuditRecord
    ) -> ModelRequestResult:
        decision, plan = await self._decide_model(spec, params, commit=True)
        record.purpose = params.purpose
        record.detail = f"{params.path} model={plan.facts.model}"
        if plan.output_cap is not None:
            record.detail += f" output_cap={plan.output_cap} (set by the host)"
        self._enforce(decision, record)
        assert (
            plan.reservation is not None and plan.price is not None and decision.estimate_micros is not None
        )
        call = _UpstreamCall(spec, params, plan, plan.reservation, decision.estimate_micros, record)
        # The call writes its row in the trip that settles it (issue 18), whatever becomes of its caller.
        record.deferred = True
        if self._calls is None:  # no task group (a gateway used without ``running``): cut with its caller
            await self._run_call(call)
        else:
            # Issue 19 #4: the call runs in the gateway's own task group, so a box that dies (or is killed) while
            # the model answers does not cut it: the call ends and is charged what the upstream says it cost.
            call.detached = True
            self._detached.add(call)
            self._calls.start_soon(self._run_call, call)
            try:
                await call.done.wait()
            except anyio.get_cancelled_exc_class():
                if not call.done.is_set():
                    call.orphaned = True  # the box is gone: the row says so
                raise
        if call.error is not None:
            raise call.error
        assert call.response is not None
        response = call.response
        return ModelRequestResult(status=response.status, body=response.body, headers=response.headers)

    async def _run_call(self, call: _UpstreamCall) -> None:
        """The upstream call, then its settlement: the measured cost; 0 where nothing can have been billed (it
        never left the host, or an error without usage came back); the reservation where the model API may have
        billed a request it received but the answer never came (a hang, or the host stopping mid-call)."""
        params, record, estimate = call.params, call.record, call.estimate
        model = call.plan.facts.model
        cost = estimate
        try:
            response = await self.broker.call(params.path, call.plan.raw, params.purpose)
        except UpstreamUnreachable as exc:
            cost = estimate if exc.sent else 0
            record.verdict = "unreachable"
            call.error = RpcError(
                ErrorCode.UPSTREAM_UNREACHABLE, f"model API unreachable: {exc}", {"reason": str(exc)}
            )
        except BaseException:  # cancelled: the host is stopping (a detached call), or the caller was cut
            record.verdict = "interrupted"
            cut = "the host stopped" if call.detached else "the request was cut"
            record.reason = (
                f"interrupted: {cut} before the model answered; charged the reservation, since the model API may "
                "bill a request it received"
            )
            call.error = RpcError(
                ErrorCode.UPSTREAM_UNREACHABLE, "model request interrupted: the host is stopping"
            )
            raise
        else:
            assert call.plan.price is not None
            measured = measured_micros(
                params.path, response.body, call.plan.price, multiplier=call.plan.multiplier
            )
            if measured is not None:
                cost = measured
            elif not 200 <= response.status < 300:
                cost = 0  # an upstream error without usage: nothing was generated
            record.verdict = "allowed"
            record.detail += f" status={response.status}"
            call.response = response
        finally:
            record.cost_micros = min(
                cost, estimate
            )  # the ledger never charges past the reservation (issue 11 #3)
            if cost > estimate:
                log.error(
                    "model.request by %s (%s %s): the upstream reported %d micro-USD, over the %d reserved; the "
                    "reservation was charged. Its worst case did not hold: check [prices] and the rule's limits",
                    call.spec.imp, params.path, model, cost, estimate,
                )  # fmt: skip
                record.detail += f"; OVER RESERVATION: the upstream reported {cost} micro-USD, {estimate} reserved and charged"
            if call.error is not None:
                record.reason = record.reason or call.error.message
            with anyio.CancelScope(shield=True):
                try:
                    await self._settle_and_audit(call, cost)
                except STORAGE_ERRORS as exc:
                    # A full disk: the box is told so, in so many words (issue 19 #1).
                    log.error("could not settle or audit %s for %s: %s", record.method, record.imp, exc)
                    call.error = storage_failed(exc, self.db.url.where())
                finally:
                    call.done.set()
                    self._detached.discard(call)

    async def _settle_and_audit(self, call: _UpstreamCall, cost: int) -> None:
        """The reservation settled at the measured cost, then the call's audit row: two quick transactions
        (issue 18), so that a row that cannot be written never leaves the budget held."""
        record = call.record
        try:
            await self.db.quick(self.ledger.settle, call.reservation, cost)
        finally:
            # Whether its box is gone is read here, once settled: a box cut while it settled is said to be too.
            if call.orphaned and record.verdict != "interrupted":
                record.detail += "; the box ended before the answer came: finished and settled for it"
            record.finish_latency()
            await self.db.quick(self.audit.write, record)

    # ------------------------------------------------------------ history.* (issue 22)

    def _history_allowed(self, spec: BoxSpec, record: AuditRecord) -> None:
        """The box's own channel only (the pipe is the identity: no request names one), and a bounded rate."""
        record.rule = HISTORY_RULE
        if self.rates.take(("history", spec.run_id), HISTORY_REQUESTS_PER_MINUTE) is not None:
            reason = f"at most {HISTORY_REQUESTS_PER_MINUTE} history requests a minute"
            raise self._refusal(self._denied(HISTORY_RATE_RULE, reason), record)

    async def _history_load(
        self, spec: BoxSpec, params: HistoryLoadParams, record: AuditRecord
    ) -> HistoryLoadResult:
        """A read of the box's own lines. Audited with the write that ends its turn (one row a turn, like
        ``memory.*``); a load no commit followed is audited when the box ends (``closed``)."""
        self._history_allowed(spec, record)
        lines = await self.db.quick(self.responder_history.load, spec.imp, spec.channel_id)
        self._history_loads[spec.run_id] = self._history_loads.get(spec.run_id, 0) + 1
        record.verdict, record.deferred = "allowed", True
        return HistoryLoadResult(lines=line_views(lines))

    async def _history_commit(
        self, spec: BoxSpec, params: HistoryCommitParams, record: AuditRecord
    ) -> HistoryCommitResult:
        self._history_allowed(spec, record)
        loads = self._history_loads.get(spec.run_id, 0)
        started = time.perf_counter()

        def audited(conn: Connection, stored: int) -> None:  # the row joins the commit's transaction
            record.verdict, record.purpose = "allowed", params.outcome or ""
            record.reason = f"{stored} of {len(params.lines)} lines new, in its own channel"
            record.detail = f"loads since the last commit: {loads}"
            record.latency_ms = round((time.perf_counter() - started) * 1000, 3)
            self.audit.write(record, conn)

        stored = await self.db.quick(
            partial(self.responder_history.commit, also=audited),
            spec.imp, spec.channel_id, params.lines, params.outcome,
        )  # fmt: skip
        record.deferred = True  # written above, with the lines it speaks of
        self._history_loads.pop(spec.run_id, None)
        return HistoryCommitResult(stored=stored)

    def _history_closed(self, spec: BoxSpec) -> AuditRecord | None:
        """The box ended: its loads that no commit followed (a failed turn reads, never writes), as one row."""
        loads = self._history_loads.pop(spec.run_id, 0)
        if not loads:
            return None
        return AuditRecord(
            imp=spec.imp, method="history.load", verdict="allowed", run_id=spec.run_id, channel_id=spec.channel_id,
            rule=HISTORY_RULE, reason=f"{loads} loads of its own channel, no commit after them",
        )  # fmt: skip

    # ------------------------------------------------------------ discord.send

    async def _decide_send(self, spec: BoxSpec, params: DiscordSendParams, *, commit: bool) -> Decision:
        """judge → rate limit → trust (auto, or a gate) → whether this host reaches the channel.
        ``commit`` takes the rate-meter event (the live send)."""
        facts = discord_send_facts(spec.imp, spec.channel_id, params, self.staff_channels.get(spec.imp, ()))
        verdict = judge(facts, self.policy)
        if not verdict.allowed:
            return self._denied(verdict.rule, verdict.reason)
        assert verdict.matched is not None
        rule = verdict.matched
        limited = self._rate(rule, (spec.imp, params.channel_id), commit=commit)
        if limited is not None:
            return limited
        seen = await self.db.quick(self._send_facts, spec, params.channel_id)  # one read (issue 18)
        trust = decide_trust(
            target_is_own=params.channel_id == spec.channel_id,
            own_trusted=seen.own_trusted,
            rule_trust=rule.trust,
            settings=self.policy.trust_for(SEND_ACT),
            clean_approvals=seen.clean_approvals,
        )
        if trust.mode == "gate":
            return Decision("gated", rule.name, "allowed", trust=trust)
        unreachable = self._unreachable_refusal(params.channel_id, seen.target)
        if unreachable is not None:
            return Decision("unreachable", rule.name, unreachable.message, unreachable, trust=trust)
        return Decision("allowed", rule.name, "allowed", trust=trust)

    def _send_facts(self, spec: BoxSpec, target: str) -> _SendFacts:
        """Blocking: what a send's decision reads of the database, in one read transaction (issue 18)."""

        def read(conn: Connection) -> _SendFacts:
            return _SendFacts(
                own_trusted=self.channels.is_trusted(spec.channel_id, conn=conn),
                clean_approvals=self.earned.count(spec.imp, SEND_ACT, target, conn=conn),
                target=self.channels.info(target, conn=conn) if self.surfaces is not None else None,
            )

        return self.db.read(read)

    async def _discord_send(
        self, spec: BoxSpec, params: DiscordSendParams, record: AuditRecord
    ) -> DiscordSendResult:
        record.purpose = params.kind
        record.detail = f"to {params.channel_id}, {len(params.content)} chars, {len(params.files)} files"
        decision = await self._decide_send(spec, params, commit=True)
        if decision.trust is not None:
            record.detail += f"; trust: {decision.trust.why}"
        self._enforce(decision, record)
        if decision.verdict == "gated":
            assert decision.trust is not None
            reason = decision.trust.why
            payload = params.model_dump(mode="json")
            deadline = timedelta(hours=self.policy.gates.deadline_hours)

            def open_gate() -> Gate:  # one trip (issue 18): both channels read, the gate opened
                own = self.channels.info(spec.channel_id)
                # Admins of the guild the post lands in decide it (issue 11 #5); a channel the host never saw has none.
                target = (
                    own if params.channel_id == spec.channel_id else self.channels.info(params.channel_id)
                )
                return self.gates.open(
                    imp=spec.imp,
                    run_id=spec.run_id,
                    session_channel=spec.channel_id,
                    origin_guild=own.guild_id if own else None,
                    target_guild=target.guild_id if target else None,
                    act=SEND_ACT,
                    target=params.channel_id,
                    payload=payload,
                    reason=reason,
                    deadline=deadline,
                )

            gate = await self.db.run(open_gate)
            record.verdict, record.gate_id = "gated", gate.id
            await self._gate_opened(gate)
            return DiscordSendResult(status="pending", gate_id=gate.id)
        message_ids = await self._deliver(params, spec.imp, record)
        record.verdict = "allowed"
        return DiscordSendResult(status="delivered", message_ids=message_ids)

    async def reaches(self, channel_id: str) -> bool:
        """Whether this host's surface posts in ``channel_id`` (a supervisor without Discord does not)."""
        if self.surfaces is None:
            return True
        return self._reaches(channel_id, await self.db.run(self.channels.info, channel_id))

    def _reaches(self, channel_id: str, info: ChannelInfo | None) -> bool:
        """``reaches``, given what the host knows of the channel (``info``)."""
        return (
            self.surfaces is None or surface_of(channel_id, info.surface if info else None) in self.surfaces
        )

    def _unreachable_refusal(self, channel_id: str, info: ChannelInfo | None) -> RpcError | None:
        """The refusal of a post into a channel this host's surface does not reach; None when it does."""
        if self._reaches(channel_id, info):
            return None
        where = surface_of(channel_id)
        reason = (
            f"channel {channel_id} is on {where}, which this host does not reach "
            f"(it posts on {', '.join(sorted(self.surfaces or ())) or 'nothing'})"
        )
        hint = "; run the task under `impyard serve --supervise`" if where == "discord" else ""
        return RpcError(
            ErrorCode.UPSTREAM_UNREACHABLE,
            f"the message could not be delivered: {reason}{hint}",
            {"reason": reason},
        )

    async def _deliver(
        self, params: DiscordSendParams, imp: str, record: AuditRecord | None = None
    ) -> list[str]:
        """Post through the surface. With ``record`` (a box's send), the request's audit row is written in the
        trip that keeps the post in the history, where the surface keeps one (issue 18); else ``serve`` writes it."""
        files = [OutgoingFile(item.filename, decode_file(item.data_b64)) for item in params.files]
        surface = self.surface

        def audited(ids: list[str]) -> None:  # blocking, on the history's trip
            assert record is not None
            record.detail += f"; message ids {ids}"
            record.verdict = "allowed"
            self._write_now(record)

        try:
            if record is not None and isinstance(surface, HistorySurface):
                ids = await surface.send(
                    params.channel_id,
                    params.content,
                    params.reply_to,
                    files,
                    params.kind,
                    imp=imp,
                    then=audited,
                )
            else:
                ids = await surface.send(
                    params.channel_id, params.content, params.reply_to, files, params.kind, imp=imp
                )
        except SurfaceError as exc:
            if record is not None:
                record.verdict = "unreachable"
            raise RpcError(
                ErrorCode.UPSTREAM_UNREACHABLE,
                f"the message could not be delivered: {exc}",
                {"reason": str(exc)},
            ) from None
        if record is not None and not record.deferred:
            record.detail += f"; message ids {ids}"
        return ids

    def _write_now(self, record: AuditRecord) -> None:
        """Blocking, inside the trip of the request's last write: its audit row joins that trip (issue 18), so
        ``serve`` writes none after it. Its latency is measured up to here."""
        record.finish_latency()
        self.audit.write(record)
        record.deferred = True

    # ------------------------------------------------------------ gates

    async def _gate_opened(self, gate: Gate) -> None:
        """Tell the surface (an approval card); the gate stands in the database whatever happens here."""
        if self.on_gate is None:
            return
        try:
            await self.on_gate(gate)
        except Exception:  # noqa: BLE001 - a card that cannot be posted never fails the box's request
            log.exception("announcing gate %s failed; it waits in `impyard approvals ls`", gate.id)

    async def decide(
        self, gate_id: str, approver: Approver, *, approve: bool, note: str = "", execute: bool = True
    ) -> Gate:
        """Approve or deny a gate (raises GateError); an approved gate is executed here, exactly once."""
        gate = await self.db.run(self.gates.get, gate_id)
        owners = self.owners.get(gate.imp, frozenset())
        decided = await self.db.run(
            lambda: self.gates.decide(gate_id, approver, approve=approve, owners=owners, note=note)
        )
        if approve and execute:
            return await self.execute(gate_id)
        return decided

    async def execute(self, gate_id: str) -> Gate:
        """Run an approved gate's frozen payload once; a gate someone else claimed is left to them."""
        return await self._execute(await self.db.run(self.gates.get, gate_id))

    async def _execute(self, gate: Gate) -> Gate:
        stale = self._stale()  # an approved gate waits for a host that holds its lease (issue 21)
        if stale is not None:
            log.warning("gate %s left approved: %s", gate.id, stale)
            return gate
        # A gate whose channel this host's surface does not reach is left approved, unclaimed, for a host
        # that reaches it (issue 12: never "delivered" through the wrong surface).
        if not await self.reaches(gate.target):
            return gate
        claimed = await self.db.run(self.gates.claim, gate.id)
        if claimed is None:
            return await self.db.run(self.gates.get, gate.id)
        try:
            ids = await self._deliver(claimed.send, claimed.imp)
        except RpcError as exc:
            error = redact(exc.message, self.secrets)
            return await self.db.run(lambda: self.gates.finish(gate.id, error=error))
        return await self.db.run(lambda: self.gates.finish(gate.id, message_ids=ids))

    async def execute_approved(self) -> list[Gate]:
        """Execute gates approved elsewhere (the CLI) that this host reaches; returns those it moved."""
        moved = []
        for gate in await self.db.run(self.gates.approved_waiting):
            after = await self._execute(gate)
            if after is not gate:
                moved.append(after)
        return moved

    async def expire_due(self) -> list[Gate]:
        return await self.db.run(self.gates.expire_due)

    # ------------------------------------------------------------ http.fetch

    async def _decide_fetch(
        self, spec: BoxSpec, params: HttpFetchParams, *, commit: bool
    ) -> tuple[Decision, _Plan]:
        """judge → rate limit; the destination's addresses are checked when it is fetched (rule egress).
        ``commit`` takes the rate-meter event (the live fetch)."""
        plan = _Plan(http_fetch_facts(spec.imp, spec.channel_id, params))
        verdict = judge(plan.facts, self.policy)
        if not verdict.allowed:
            return self._denied(verdict.rule, verdict.reason), plan
        assert verdict.matched is not None
        rule = plan.rule = verdict.matched
        limited = self._rate(rule, (spec.imp, plan.facts.host or ""), commit=commit)
        if limited is not None:
            return limited, plan
        return Decision("allowed", rule.name, "allowed"), plan

    async def _http_fetch(
        self, spec: BoxSpec, params: HttpFetchParams, record: AuditRecord
    ) -> HttpFetchResult:
        decision, plan = await self._decide_fetch(spec, params, commit=True)
        record.detail = f"GET {plan.facts.host}"
        self._enforce(decision, record)
        rule = plan.rule
        assert rule is not None
        caps = [
            params.max_bytes,
            self.policy.http.max_bytes,
            *([rule.max_fetch_bytes] if rule.max_fetch_bytes else []),
        ]
        try:
            response = await self.fetcher.fetch(
                params.url, max_bytes=min(caps), allow_loopback=rule.allow_loopback
            )
        except (
            FetchRefused
        ) as exc:  # the destination (egress), or the page's text (bounded extraction, issue 11 #7)
            raise self._refusal(self._denied(exc.rule or EGRESS_RULE, str(exc)), record) from None
        except FetchFailed as exc:
            record.verdict = "unreachable"
            raise RpcError(ErrorCode.UPSTREAM_UNREACHABLE, str(exc), {"reason": str(exc)}) from None
        record.verdict = "allowed"
        record.detail += f" status={response.status} truncated={response.truncated}"
        return HttpFetchResult(
            status=response.status,
            content_type=response.content_type,
            text=response.text,
            truncated=response.truncated,
        )
