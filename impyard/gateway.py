"""The gateway (design.md §1, §5): the host's BoxHost. Every box request passes, in order:

schema validation (the protocol peer, before we are called) → the policy judge
→ trust, for acts (auto / gate / earned) → budget reserve (atomic, the hard
stop) → execution on the host with the real credential → settle the ledger
with the measured cost → one audit row.

Refusals are JSON-RPC errors the box's model can read: -32010 with
{rule, reason}, -32011 with {ledger, retry_after}, -32012 with {retry_after},
-32013 when the upstream cannot be reached (or no model key is configured:
that is the host's setup, not a policy decision, so it is -32013 with a
message that says how to set OPENAI_API_KEY / OPENAI_BASE_URL).

SQLite work runs in worker threads (``Database.run``): the event loop never
waits on a write lock.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import timedelta

import anyio
from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
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
from impyard.audit import AuditLog, AuditRecord, known_secrets, redact
from impyard.backends.base import BoxSpec
from impyard.backends.conduct import printable
from impyard.broker import NO_KEY_MESSAGE, ModelBroker, UpstreamConfig, UpstreamUnreachable, encode_body
from impyard.clock import Clock, SystemClock
from impyard.db import Database
from impyard.fetch import FetchFailed, FetchRefused, HttpFetcher
from impyard.gates import Approver, Gate, GateStore
from impyard.judge import (
    Verdict,
    decode_file,
    discord_send_facts,
    http_fetch_facts,
    judge,
    model_request_facts,
)
from impyard.ledger import BudgetExhausted, Ledger
from impyard.policy import Policy
from impyard.policy_models import Rule
from impyard.prices import PriceMissing, bound_output, estimate_micros, measured_micros, tier_multiplier
from impyard.surfaces import OutgoingFile, Surface, SurfaceError, surface_of
from impyard.trust import ChannelTrust, DbChannelTrust, EarnedTrust, decide_trust

log = logging.getLogger("impyard.gateway")

PRICES_RULE = "prices"  # the rule name a refusal for a missing price carries
UPSTREAM_RULE = "upstream-limits"
EGRESS_RULE = "egress"
RATE_WINDOW_S = 60.0
SEND_ACT = "discord.send"

StageCallback = Callable[[BoxSpec, TurnStageParams], Awaitable[None]]
GateCallback = Callable[[Gate], Awaitable[None]]  # a gate was opened (the Discord surface posts an approval card)


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


class Gateway:
    """Implements ``BoxHost.serve`` for every box of this host."""

    def __init__(
        self,
        *,
        policy: Policy,
        db: Database,
        surface: Surface,
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
    ) -> None:
        """``surfaces``: where this host's surface posts (``impyard.surfaces.surface_of`` names); None = everywhere."""
        self._policy = policy
        self.db = db
        self.surface = surface
        self.clock = clock or SystemClock()
        self.broker = broker or ModelBroker(upstream or UpstreamConfig.from_env(), policy.upstream)
        self.fetcher = fetcher or HttpFetcher(policy.http)
        self.channels = channels or DbChannelTrust(db, self.clock)
        self.owners = {imp: frozenset(ids) for imp, ids in (owners or {}).items()}
        self.staff_channels = {imp: tuple(ids) for imp, ids in (staff_channels or {}).items()}
        self.on_stage = on_stage
        self.on_gate = on_gate
        self.surfaces = frozenset(surfaces) if surfaces is not None else None
        # The model key and the base URL's userinfo and query (issue 11 #9), whoever configured them.
        self.secrets = sorted({*(secrets if secrets is not None else known_secrets()), *self.broker.config.secrets})
        self.audit = AuditLog(db, self.clock, self.secrets)
        self.ledger = Ledger(db, policy, self.clock)
        self.earned = EarnedTrust(db, self.clock)
        self.gates = GateStore(db, self.clock, self.audit, self.earned)
        self.rates = RateMeter(self.clock)
        self.ledger.settle_abandoned()  # a previous host that died mid-call still pays for it

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

    async def aclose(self) -> None:
        await self.broker.aclose()

    # ------------------------------------------------------------ BoxHost

    async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
        """A box request the protocol refused before judging (unknown method, invalid params): audited too."""
        record = AuditRecord(
            imp=spec.imp, method=method, verdict="invalid", run_id=spec.run_id, channel_id=spec.channel_id,
            reason=f"refused by the protocol ({code}): {reason}",
        )  # fmt: skip
        await self.db.run(self.audit.write, record)

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        if method == "turn.stage":
            assert isinstance(params, TurnStageParams)
            if self.on_stage is not None:
                await self.on_stage(spec, params)
            return None
        if method == "log":
            assert isinstance(params, LogParams)
            # Box text is made printable: it can never start a forged line of the host's log (issue 11 #8).
            fields = " ".join(f"{printable(key, 64)}={printable(repr(value), 200)}" for key, value in params.fields.items())
            logging.getLogger(f"impyard.box.{spec.imp}").log(
                logging.getLevelName(params.level.upper()),
                "box %s/%s: %s%s", spec.imp, spec.channel_id, printable(params.message), f" [{fields}]" if fields else "",
            )  # fmt: skip
            return None
        handlers = {
            "model.request": self._model_request,
            "discord.send": self._discord_send,
            "http.fetch": self._http_fetch,
        }
        handler = handlers.get(method)
        if handler is None:
            raise RpcError(ErrorCode.METHOD_NOT_FOUND, f"method not found: {method[:80]}")
        record = AuditRecord(imp=spec.imp, method=method, run_id=spec.run_id, channel_id=spec.channel_id)
        started = time.perf_counter()
        try:
            return await handler(spec, params, record)  # type: ignore[arg-type]
        except RpcError as exc:
            record.reason = record.reason or exc.message
            data = (
                {key: redact(value, self.secrets) if isinstance(value, str) else value for key, value in exc.data.items()}
                if isinstance(exc.data, dict)
                else exc.data
            )
            raise RpcError(exc.code, redact(exc.message, self.secrets), data) from None
        except Exception:
            log.exception("gateway failed on %s for %s", method, spec.imp)
            record.verdict, record.reason = "error", "internal error"
            raise RpcError(ErrorCode.INTERNAL_ERROR, "internal error in the host's gateway") from None
        finally:
            record.latency_ms = round((time.perf_counter() - started) * 1000, 3)
            with anyio.CancelScope(shield=True):
                await self.db.run(self.audit.write, record)

    # ------------------------------------------------------------ refusals

    @staticmethod
    def _denied(record: AuditRecord, rule: str, reason: str) -> RpcError:
        record.verdict, record.rule, record.reason = "denied", rule, reason
        return RpcError(ErrorCode.DENIED, f"denied by policy rule {rule}: {reason}", {"rule": rule, "reason": reason})

    def _judged(self, verdict: Verdict, record: AuditRecord) -> Rule:
        record.rule = verdict.rule
        if not verdict.allowed:
            raise self._denied(record, verdict.rule, verdict.reason)
        assert verdict.matched is not None
        return verdict.matched

    def _rate(self, rule: Rule, key: tuple[str, ...], record: AuditRecord) -> None:
        if rule.rate_per_minute is None:
            return
        wait = self.rates.take((rule.name, *key), rule.rate_per_minute)
        if wait is not None:
            retry_after = round(wait, 3)
            record.verdict, record.reason = "rate_limited", f"over {rule.rate_per_minute} per minute"
            raise RpcError(
                ErrorCode.RATE_LIMITED,
                f"rate limited by rule {rule.name}: at most {rule.rate_per_minute} per minute; retry in {retry_after} s",
                {"retry_after": retry_after, "rule": rule.name},
            )

    # ------------------------------------------------------------ model.request

    async def _model_request(
        self, spec: BoxSpec, params: ModelRequestParams, record: AuditRecord
    ) -> ModelRequestResult:
        raw = encode_body(params.body)
        facts = model_request_facts(spec.imp, spec.channel_id, params, len(raw))
        record.purpose = params.purpose
        record.detail = f"{params.path} model={facts.model}"
        rule = self._judged(judge(facts, self.policy), record)
        assert facts.model is not None
        price = self.policy.price(facts.model)
        if price is None:
            raise self._denied(
                record, PRICES_RULE,
                f'model {facts.model!r} has no price in the price table (add [prices."{facts.model}"] to a policy '
                "file); it is refused rather than assumed free",
            )  # fmt: skip
        # issue 11 #3: a text call without an output cap is sent one within the rule's limit, so the upstream
        # cannot write past the reservation; what is forwarded is what is priced.
        cap = min(limit for limit in (rule.max_tokens, self.policy.upstream.default_output_tokens) if limit is not None)
        body = bound_output(params.path, params.body, cap)
        if body is not params.body:
            raw = encode_body(body)
            record.detail += f" output_cap={cap} (set by the host)"
        try:
            multiplier = tier_multiplier(price, body.get("service_tier"), facts.model)
            estimate = estimate_micros(
                params.path, body, len(raw), price, default_output_tokens=cap, input_images=facts.input_images,
                inline_image_bytes=facts.inline_image_bytes,
                stored_context_tokens=(rule.stored_context_tokens or 0) if facts.stored_context else 0,
            )  # fmt: skip
        except PriceMissing as exc:
            raise self._denied(record, PRICES_RULE, str(exc)) from None
        if len(raw) > self.policy.upstream.max_request_bytes:
            raise self._denied(
                record, UPSTREAM_RULE, f"the body is {len(raw)} bytes, over {self.policy.upstream.max_request_bytes}"
            )
        if not self.broker.configured:
            record.verdict = "unreachable"
            raise RpcError(ErrorCode.UPSTREAM_UNREACHABLE, NO_KEY_MESSAGE, {"reason": "no model key configured"})
        self._rate(rule, (spec.imp,), record)
        try:
            reservation = await self.db.run(
                self.ledger.reserve, spec.imp, estimate, method="model.request", purpose=params.purpose, model=facts.model
            )
        except BudgetExhausted as exc:
            record.verdict, record.rule, record.reason = "budget_exhausted", "budget", str(exc)
            raise RpcError(
                ErrorCode.BUDGET_EXHAUSTED,
                f"budget exhausted: {exc}",
                {"ledger": exc.ledger, "retry_after": exc.retry_after_s},
            ) from None
        cost = estimate  # what is charged if we cannot tell better (cancelled mid-call, no usage reported)
        try:
            response = await self.broker.call(params.path, raw, params.purpose)
        except UpstreamUnreachable as exc:
            cost = estimate if exc.sent else 0
            record.verdict = "unreachable"
            raise RpcError(ErrorCode.UPSTREAM_UNREACHABLE, f"model API unreachable: {exc}", {"reason": str(exc)}) from None
        else:
            measured = measured_micros(params.path, response.body, price, multiplier=multiplier)
            if measured is not None:
                cost = measured
            elif not 200 <= response.status < 300:
                cost = 0  # an upstream error without usage: nothing was generated
            record.verdict = "allowed"
            record.detail += f" status={response.status}"
        finally:
            record.cost_micros = min(cost, estimate)  # the ledger never charges past the reservation (issue 11 #3)
            if cost > estimate:
                log.error(
                    "model.request by %s (%s %s): the upstream reported %d micro-USD, over the %d reserved; the "
                    "reservation was charged. Its worst case did not hold: check [prices] and the rule's limits",
                    spec.imp, params.path, facts.model, cost, estimate,
                )  # fmt: skip
                record.detail += f"; OVER RESERVATION: the upstream reported {cost} micro-USD, {estimate} reserved and charged"
            with anyio.CancelScope(shield=True):
                await self.db.run(self.ledger.settle, reservation, cost)
        return ModelRequestResult(status=response.status, body=response.body, headers=response.headers)

    # ------------------------------------------------------------ discord.send

    async def _discord_send(self, spec: BoxSpec, params: DiscordSendParams, record: AuditRecord) -> DiscordSendResult:
        facts = discord_send_facts(spec.imp, spec.channel_id, params, self.staff_channels.get(spec.imp, ()))
        record.purpose = params.kind
        record.detail = f"to {params.channel_id}, {len(params.content)} chars, {len(params.files)} files"
        rule = self._judged(judge(facts, self.policy), record)
        self._rate(rule, (spec.imp, params.channel_id), record)
        target_is_own = params.channel_id == spec.channel_id
        own_trusted = await self.db.run(self.channels.is_trusted, spec.channel_id)
        settings = self.policy.trust_for(SEND_ACT)
        clean = await self.db.run(self.earned.count, spec.imp, SEND_ACT, params.channel_id)
        decision = decide_trust(
            target_is_own=target_is_own,
            own_trusted=own_trusted,
            rule_trust=rule.trust,
            settings=settings,
            clean_approvals=clean,
        )
        record.detail += f"; trust: {decision.why}"
        if decision.mode == "gate":
            own = await self.db.run(self.channels.info, spec.channel_id)
            # Admins of the guild the post lands in decide it (issue 11 #5); a channel the host never saw has none.
            target = own if target_is_own else await self.db.run(self.channels.info, params.channel_id)
            gate = await self.db.run(
                lambda: self.gates.open(
                    imp=spec.imp,
                    run_id=spec.run_id,
                    session_channel=spec.channel_id,
                    origin_guild=own.guild_id if own else None,
                    target_guild=target.guild_id if target else None,
                    act=SEND_ACT,
                    target=params.channel_id,
                    payload=params.model_dump(mode="json"),
                    reason=decision.why,
                    deadline=timedelta(hours=self.policy.gates.deadline_hours),
                )
            )
            record.verdict, record.gate_id = "gated", gate.id
            await self._gate_opened(gate)
            return DiscordSendResult(status="pending", gate_id=gate.id)
        message_ids = await self._send(params, spec.imp, record)
        record.verdict = "allowed"
        return DiscordSendResult(status="delivered", message_ids=message_ids)

    async def reaches(self, channel_id: str) -> bool:
        """Whether this host's surface posts in ``channel_id`` (a supervisor without Discord does not)."""
        if self.surfaces is None:
            return True
        info = await self.db.run(self.channels.info, channel_id)
        return surface_of(channel_id, info.surface if info else None) in self.surfaces

    async def _send(self, params: DiscordSendParams, imp: str, record: AuditRecord | None = None) -> list[str]:
        if not await self.reaches(params.channel_id):
            where = surface_of(params.channel_id)
            if record is not None:
                record.verdict = "unreachable"
            reason = (
                f"channel {params.channel_id} is on {where}, which this host does not reach "
                f"(it posts on {', '.join(sorted(self.surfaces or ())) or 'nothing'})"
            )
            hint = "; run the task under `impyard serve --supervise`" if where == "discord" else ""
            raise RpcError(ErrorCode.UPSTREAM_UNREACHABLE, f"the message could not be delivered: {reason}{hint}", {"reason": reason})
        files = [OutgoingFile(item.filename, decode_file(item.data_b64)) for item in params.files]
        try:
            ids = await self.surface.send(
                params.channel_id, params.content, params.reply_to, files, params.kind, imp=imp
            )
        except SurfaceError as exc:
            if record is not None:
                record.verdict = "unreachable"
            raise RpcError(
                ErrorCode.UPSTREAM_UNREACHABLE, f"the message could not be delivered: {exc}", {"reason": str(exc)}
            ) from None
        if record is not None:
            record.detail += f"; message ids {ids}"
        return ids

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
        claimed = await self.db.run(self.gates.claim, gate_id)
        if claimed is None:
            return await self.db.run(self.gates.get, gate_id)
        params = DiscordSendParams.model_validate(claimed.payload)
        try:
            ids = await self._send(params, claimed.imp)
        except RpcError as exc:
            error = redact(exc.message, self.secrets)
            return await self.db.run(lambda: self.gates.finish(gate_id, error=error))
        return await self.db.run(lambda: self.gates.finish(gate_id, message_ids=ids))

    async def execute_approved(self) -> list[Gate]:
        """Execute gates approved elsewhere (the CLI) whose channel this host's surface reaches; leave the rest
        approved for a host that reaches them (issue 12: never "delivered" through the wrong surface)."""
        waiting = await self.db.run(self.gates.approved_waiting)
        return [await self.execute(gate.id) for gate in waiting if await self.reaches(gate.target)]

    async def expire_due(self) -> list[Gate]:
        return await self.db.run(self.gates.expire_due)

    # ------------------------------------------------------------ http.fetch

    async def _http_fetch(self, spec: BoxSpec, params: HttpFetchParams, record: AuditRecord) -> HttpFetchResult:
        facts = http_fetch_facts(spec.imp, spec.channel_id, params)
        record.detail = f"GET {facts.host}"
        rule = self._judged(judge(facts, self.policy), record)
        self._rate(rule, (spec.imp, facts.host or ""), record)
        caps = [params.max_bytes, self.policy.http.max_bytes, *([rule.max_fetch_bytes] if rule.max_fetch_bytes else [])]
        try:
            response = await self.fetcher.fetch(params.url, max_bytes=min(caps), allow_loopback=rule.allow_loopback)
        except FetchRefused as exc:  # the destination (egress), or the page's text (bounded extraction, issue 11 #7)
            raise self._denied(record, exc.rule or EGRESS_RULE, str(exc)) from None
        except FetchFailed as exc:
            record.verdict = "unreachable"
            raise RpcError(ErrorCode.UPSTREAM_UNREACHABLE, str(exc), {"reason": str(exc)}) from None
        record.verdict = "allowed"
        record.detail += f" status={response.status} truncated={response.truncated}"
        return HttpFetchResult(
            status=response.status, content_type=response.content_type, text=response.text, truncated=response.truncated
        )
