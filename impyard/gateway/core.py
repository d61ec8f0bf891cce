"""The gateway's core (docs/architecture.md, docs/security.md): the host's BoxHost. Every box request passes, in
order:

schema validation (the protocol peer, before we are called) → the host's lease → the act's handler: the policy
judge → trust, for sends (auto / gate / earned) → budget reserve (atomic, the hard stop) → execution on the host
with the real credential → settle the ledger with the measured cost → one audit row, written here.

The core decides, meters and audits: the judge's helpers, the rate meter, the ledger's reservations left by a
stopped host, the audit write, and the gates (approved, executed exactly once). Each act is one handler
(``impyard.gateway.act.Act``), registered by the host (``impyard.host.build_gateway``): ``model.request``
(``model_act``), ``discord.send`` (``send_act``), ``http.fetch`` (``fetch_act``), ``history.*``
(``impyard.conversation.history_act``) and ``memory.*`` (``impyard.memory.act``). The core knows none of them.

Refusals are JSON-RPC errors the box's model can read: -32010 with {rule, reason}, -32011 with {ledger,
retry_after}, -32012 with {retry_after}, -32013 when the upstream cannot be reached (or no model key is
configured: that is the host's setup, not a policy decision, so it is -32013 with a message that says how to set
OPENAI_API_KEY / OPENAI_BASE_URL).

``dry_run`` asks an act the same decision without taking a rate-meter event, reserving budget, opening a gate,
calling the upstream or writing an audit row (issue 12: ``impyard policy check`` explains what the gateway itself
would answer).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

import anyio
from pydantic import BaseModel
from sqlalchemy.engine import Connection

from box.protocol import ErrorCode, RpcError
from box.protocol.memory import SessionMemory
from box.protocol.models import DiscordSendParams, LogParams, TurnStageParams
from impyard import metrics
from impyard.backends.base import BoxSpec
from impyard.backends.conduct import printable
from impyard.channels.store import ChannelStore
from impyard.clock import Clock, SystemClock
from impyard.gateway.act import (
    LEASE_RULE,
    STORAGE_FAILED,
    Act,
    Decision,
    Request,
    denied,
    refusal,
    storage_failed,
)
from impyard.gateway.audit import AuditLog, AuditRecord, known_secrets, redact
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.gates import Approver, Gate, GateStore
from impyard.gateway.judge import Verdict, discord_send_facts, judge
from impyard.gateway.ledger import Ledger
from impyard.gateway.policy import Policy
from impyard.gateway.policy_models import Rule
from impyard.gateway.trust import ChannelTrust, EarnedTrust
from impyard.storage.db import STORAGE_ERRORS, Database

if TYPE_CHECKING:
    from impyard.storage.leases import LeaseGuard

__all__ = [
    "CALL_GRACE_S",
    "LEASE_RULE",
    "STORAGE_FAILED",
    "Decision",
    "GateCallback",
    "Gateway",
    "GatewayStores",
    "RateMeter",
    "StageCallback",
    "host_secrets",
    "storage_failed",
]

log = logging.getLogger("impyard.gateway")

# Issue 19 #4: at the host's stop, model calls still in flight get this long to finish before they are cut.
CALL_GRACE_S = 10.0
RATE_WINDOW_S = 60.0
REFUSED_VERDICTS = frozenset(
    {"denied", "rate_limited", "budget_exhausted"}
)  # impyard_refusals_total counts them

StageCallback = Callable[[BoxSpec, TurnStageParams], Awaitable[None]]
GateCallback = Callable[
    [Gate], Awaitable[None]
]  # a gate was opened (the Discord surface posts an approval card)
A = TypeVar("A", bound=Act)


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
    """Implements ``BoxHost`` for every box of this host: decides, meters and audits; the acts do the rest."""

    def __init__(
        self,
        *,
        policy: Policy,
        stores: GatewayStores,
        secrets: Collection[str],
        clock: Clock | None = None,
        owners: Mapping[str, Collection[str]] | None = None,
        staff_channels: Mapping[str, Collection[str]] | None = None,
        on_stage: StageCallback | None = None,
        acts: Iterable[Act] = (),
    ) -> None:
        """``stores``: what the gateway reads and writes, built by the host. ``secrets``: redacted from what a
        box is answered. ``owners``: who may approve an imp's gates besides the guild's admins.
        ``staff_channels``: each imp's staff channel (a post there is judged as one). ``on_stage``: hears every
        box's ``turn.stage`` (a window for tests). ``acts``: the handlers (``register``)."""
        self._policy = policy
        self.clock = clock or SystemClock()
        self.secrets = list(secrets)
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
        self.rates = RateMeter(self.clock)
        self.lease_guard: LeaseGuard | None = None  # issue 21: set by a host that holds leases (serve, chat)
        self._acts: list[Act] = []
        self._by_method: dict[str, Act] = {}
        self._by_gate: dict[str, Act] = {}
        for act in acts:
            self.register(act)

    def register(self, act: Act) -> None:
        """Serve ``act.methods`` with ``act`` (one act per method)."""
        taken = act.methods & self._by_method.keys()
        if taken:
            raise ValueError(f"{type(act).__name__}: already served: {', '.join(sorted(taken))}")
        act.bind(self)
        self._acts.append(act)
        self._by_method.update(dict.fromkeys(act.methods, act))
        self._by_gate.update(dict.fromkeys(act.gated, act))

    @property
    def acts(self) -> tuple[Act, ...]:
        """The registered acts, in the order the host registered them."""
        return tuple(self._acts)

    def act(self, kind: type[A]) -> A | None:
        """The registered act of this type (the memory act, for the service it serves), or None."""
        return next((act for act in self._acts if isinstance(act, kind)), None)

    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        """Swap in a reloaded policy (already validated: a broken file never gets this far)."""
        self._policy = policy
        self.ledger.policy = policy
        for act in self._acts:
            act.policy_changed(policy)

    def stale(self) -> str | None:
        """Why this host may act no more (its lease lost or past its deadline), or None. Local: no database hop."""
        return self.lease_guard.check() if self.lease_guard is not None else None

    def settle_orphans(self) -> int:
        """Model calls a stopped host left in flight are settled now, each with an audit row (issue 19 #4): at
        once where their process is gone, after an hour where this machine cannot tell (ledger.settle_orphans)."""
        orphans = self.ledger.settle_orphans()
        for orphan in orphans:
            metrics.spent(orphan.imp, orphan.reserved_micros)  # charged at its reservation
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
        """What the acts keep running while the host serves (the model calls in flight: a call outlives a box
        that dies while the model answers; on the way out, calls still running get ``grace_s`` to finish)."""
        async with AsyncExitStack() as stack:
            for act in self._acts:
                await stack.enter_async_context(act.running(grace_s))
            yield self

    async def aclose(self) -> None:
        for act in self._acts:
            await act.aclose()

    # ------------------------------------------------------------ the audit (written here alone)

    async def write_row(self, record: AuditRecord, *, quiet: bool = False) -> None:
        """Write ``record`` now, shielded (a row is never lost to a cancelled caller). ``quiet``: a storage
        failure is logged, not raised (the row of a refusal: the refusal stands)."""
        with anyio.CancelScope(shield=True):
            try:
                await self.db.quick(self.audit.write, record)
            except STORAGE_ERRORS as exc:
                if not quiet:
                    raise
                log.error("could not audit %s of %s: %s", record.method, record.imp, exc)

    def row_in(self, conn: Connection, record: AuditRecord) -> None:
        """Blocking, inside the transaction of the act's own write: the request's row commits with what it
        speaks of (issue 18). Once that transaction committed, the act marks the record ``deferred``, so that
        ``serve`` writes none after it (a transaction that failed leaves it to ``serve``: an error row). Its
        latency is measured up to here."""
        record.finish_latency()
        self.audit.write(record, conn)

    def row_now(self, record: AuditRecord) -> None:
        """Blocking, in the trip of the act's last write, as a transaction of its own (issue 18)."""
        record.finish_latency()
        self.audit.write(record)
        record.deferred = True

    async def refuse(self, spec: BoxSpec, method: str, rule: str, reason: str) -> RpcError:
        """A request refused before any act saw it (a task run's lost lease, ``impyard.supervisor.fence``): its
        audit row is written, and the error the box is answered returned."""
        record = AuditRecord(
            imp=spec.imp, method=method, verdict="denied", rule=rule, reason=reason, run_id=spec.run_id,
            channel_id=spec.channel_id,
        )  # fmt: skip
        metrics.refused(rule)
        await self.db.run(self.audit.write, record)
        error = denied(rule, reason).error
        assert error is not None
        return error

    # ------------------------------------------------------------ BoxHost

    async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
        """A box request the protocol refused before judging (unknown method, invalid params): audited too."""
        record = AuditRecord(
            imp=spec.imp, method=method, verdict="invalid", run_id=spec.run_id, channel_id=spec.channel_id,
            reason=f"refused by the protocol ({code}): {reason}",
        )  # fmt: skip
        await self.db.quick(self.audit.write, record)

    async def closed(self, spec: BoxSpec) -> None:
        """A box ended: each act forgets it, and the rows it still owed (its last turn's memory and history
        requests) are written."""
        for act in self._acts:
            row = act.closed(spec)
            if row is not None:
                await self.write_row(row)

    def given(self, spec: BoxSpec, memory: SessionMemory | None) -> None:
        """What ``box.init`` gives a session's box, told before it is sent (issue 32 #1): memory in these scopes,
        or none. The memory act serves ``memory.*`` to that box exactly as its ``box.init`` said. A task's box
        is opened by the supervisor (``_init_params``)."""
        for act in self._acts:
            act.given(spec, memory)

    async def turn_stage(self, spec: BoxSpec, params: TurnStageParams, *, woken: bool = False) -> None:
        """The box's ``turn.stage``, the one place it is handled. ``woken``: the message it names is the one the
        host handed this box for the turn now running (the session that delivered it says so:
        ``SessionBoxHost``); only then does "context" start a turn (the memory's per-turn bound), once per
        message and box. Anything else a box announces — an old message of its channel, one another box was
        handed, an id of its own — starts nothing (issue 32 #2: a box replaying old message ids would lift the
        bound it is held to)."""
        if params.stage == "context" and woken:
            for act in self._acts:
                row = act.turn_started(spec, params.message_id)
                if row is not None:
                    await self.write_row(row)
        if self.on_stage is not None:
            await self.on_stage(spec, params)

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        """A box's request: its act's handler, fenced by the host's lease, with one audit row."""
        if method == "log":
            assert isinstance(params, LogParams)
            self._log(spec, params)
            return None
        act = self._by_method.get(method)
        if act is None:
            raise RpcError(ErrorCode.METHOD_NOT_FOUND, f"method not found: {method[:80]}")
        started = time.perf_counter()
        record = AuditRecord(
            imp=spec.imp, method=method, run_id=spec.run_id, channel_id=spec.channel_id, started=started
        )
        request = Request(spec, method, params, record, self.stale if self.lease_guard is not None else None)
        try:
            if act.fenced:
                stale = self.stale()  # before the act: nothing reserved, gated, fetched or posted (issue 21)
                if stale is not None:
                    raise refusal(denied(LEASE_RULE, f"this host holds no lease to act: {stale}"), record)
            return await act.handle(request)
        except RpcError as exc:
            record.reason = record.reason or exc.message
            raise self.redacted(exc) from None
        except Exception as exc:
            log.exception("gateway failed on %s for %s", method, spec.imp)
            record.verdict, record.reason = "error", "internal error"
            if isinstance(exc, STORAGE_ERRORS):  # issue 19 #1: the box (and the person) learn it was the disk
                failure = storage_failed(exc, self.db.url.where())
                record.reason = failure.message
                raise failure from None
            raise RpcError(ErrorCode.INTERNAL_ERROR, "internal error in the host's gateway") from None
        finally:
            if record.verdict in REFUSED_VERDICTS:
                metrics.refused(record.rule or "")
            if not record.deferred:  # not written with the act's own write (issue 18): written now
                record.latency_ms = round((time.perf_counter() - started) * 1000, 3)
                try:
                    await self.write_row(record)
                except STORAGE_ERRORS as exc:  # a full disk: the request is refused, in so many words
                    log.error("could not audit %s for %s: %s", method, spec.imp, exc)
                    raise storage_failed(exc, self.db.url.where()) from None

    @staticmethod
    def _log(spec: BoxSpec, params: LogParams) -> None:
        # Box text is made printable: it can never start a forged line of the host's log (issue 11 #8).
        fields = " ".join(
            f"{printable(key, 64)}={printable(repr(value), 200)}" for key, value in params.fields.items()
        )
        logging.getLogger(f"impyard.box.{spec.imp}").log(
            logging.getLevelName(params.level.upper()),
            "box %s/%s: %s%s", spec.imp, spec.channel_id, printable(params.message), f" [{fields}]" if fields else "",
        )  # fmt: skip

    async def dry_run(self, spec: BoxSpec, method: str, params: BaseModel) -> Decision:
        """The decision ``serve`` would take on this request now, without acting on it (issue 12): every check
        in the same order, but no rate-meter event is taken, no budget reserved, no gate opened, nothing sent
        upstream or posted, and no audit row written. ``params`` are the method's protocol params."""
        act = self._by_method.get(method)
        decision = await act.dry_run(spec, method, params) if act is not None else None
        if decision is None:
            raise ValueError(
                f"no decision for {method!r} with {type(params).__name__}: dry_run takes the params of "
                "model.request, discord.send or http.fetch"
            )
        error = self.redacted(decision.error) if decision.error is not None else None
        return replace(decision, reason=redact(decision.reason, self.secrets), error=error)

    # ------------------------------------------------------------ deciding (the acts' shared checks)

    def redacted(self, exc: RpcError) -> RpcError:
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

    def rate(self, rule: Rule, key: tuple[str, ...], *, commit: bool) -> Decision | None:
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

    def judge_send(self, spec: BoxSpec, params: DiscordSendParams) -> Verdict:
        """The policy's verdict on a post by ``spec``'s box (its imp's staff channel known to the judge)."""
        facts = discord_send_facts(spec.imp, spec.channel_id, params, self.staff_channels.get(spec.imp, ()))
        return judge(facts, self.policy)

    # ------------------------------------------------------------ gates

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
        stale = self.stale()  # an approved gate waits for a host that holds its lease (issue 21)
        if stale is not None:
            log.warning("gate %s left approved: %s", gate.id, stale)
            return gate
        act = self._by_gate.get(gate.act)
        if act is None:  # no act of this host executes it: left approved for a host that does
            return gate
        # A gate whose channel this host's surface does not reach is left approved, unclaimed, for a host
        # that reaches it (issue 12: never "delivered" through the wrong surface).
        if not await act.reaches(gate.target):
            return gate
        claimed = await self.db.run(self.gates.claim, gate.id)
        if claimed is None:
            return await self.db.run(self.gates.get, gate.id)
        try:
            ids = await act.deliver_gate(claimed)
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
