"""``model.request``: the gateway's act that calls the model API with the host's key (docs/security.md).

judge (facts, the body allow-list, caps, size) → price and estimate → request size → model key → the reply's
send outlook (``rate_precheck``) → rate limit → budget reserved (the ledger, atomic) → the broker's call, in the
act's own task group (a call outlives a box that dies while the model answers, issue 19 #4) → the reservation
settled at the measured cost, and the call's audit row written by the core in the trip after it (issue 18).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, get_args

import anyio
from anyio.abc import TaskGroup
from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
from box.protocol.models import MemoryPurpose, ModelRequestParams, ModelRequestResult
from impyard import metrics
from impyard.backends.base import BoxSpec
from impyard.gateway.act import Act, Decision, Request, denied, enforce, storage_failed
from impyard.gateway.audit import AuditRecord
from impyard.gateway.broker import (
    NO_KEY_MESSAGE,
    ModelBroker,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
    encode_body,
)
from impyard.gateway.judge import RequestFacts, judge, model_request_facts
from impyard.gateway.ledger import BudgetExhausted, Reservation
from impyard.gateway.local_embedder import LOCAL_EMBEDDER, LOCAL_MODEL, LocalEmbedder
from impyard.gateway.policy import Policy
from impyard.gateway.policy_models import Price, Rule
from impyard.gateway.prices import (
    PriceMissing,
    bound_output,
    estimate_micros,
    measured_micros,
    tier_multiplier,
    usage_from_response,
)
from impyard.gateway.rate_precheck import PRECHECKED_PURPOSES, SendOutlook, precheck, reply_probe
from impyard.gateway.send_act import SendAct
from impyard.gateway.surfaces import SURFACE_TERMINAL, Post, surface_of
from impyard.imps.store import EMBEDDING_LENGTH_BOUNDS, ImpStore
from impyard.metrics.labels import OTHER, clipped
from impyard.metrics.labels import known as known_label
from impyard.storage.db import STORAGE_ERRORS
from impyard.threads import in_thread

log = logging.getLogger("impyard.gateway")

PRICES_RULE = "prices"  # the rule name a refusal for a missing price carries
UPSTREAM_RULE = "upstream-limits"
# A call the box gave up within this much of its limit (counted from its arrival) was given up at the limit: the
# request's way to the host and the cancel's way back, on a busy host (issue 38: audited "timeout", not "interrupted").
GIVEN_UP_SLACK_S = 0.1
# The purposes the box's own code asks with (its memory's, the reply's, a task's); the policy's rules name more.
BOX_PURPOSES = frozenset({*get_args(MemoryPurpose), "reply", "embedding", "image", "task"})


def call_labels(policy: Policy, purpose: str, model: str | None) -> tuple[str, str]:
    """The metrics' ``purpose`` and ``model`` of a call (docs/metrics.md): a purpose the box's code or a rule of the
    policy names, a model the price table lists (or the host's local embedder); anything else a box made up is
    ``other``, so it cannot grow the series."""
    purposes = set(BOX_PURPOSES)
    for rule in policy.rules:
        purposes.update(name for name in (rule.purposes or {}) if name != "*")
    model_label = (
        clipped(model)
        if model is not None and (policy.price(model) is not None or model == LOCAL_MODEL)
        else OTHER
    )
    return known_label(purpose, purposes), model_label


class _EndedWithBox(Exception):
    """Issue 38: the call's box went away and the call asked to end with it."""


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
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # the upstream request's own
    ended_with_box: bool = (
        False  # issue 38: cut because its box went away (``ModelRequestParams.end_with_box``)
    )
    asked_at: float = field(default_factory=time.monotonic)  # when the box's request reached the act


class ModelAct(Act):
    """Serves ``model.request`` through ``broker`` (the one holder of the model key)."""

    methods: ClassVar[frozenset[str]] = frozenset({"model.request"})

    def __init__(self, broker: ModelBroker, local: LocalEmbedder = LOCAL_EMBEDDER) -> None:
        self.broker = broker
        self.local = local  # issue 33: the host's own embedder, for LOCAL_MODEL (never sent upstream)
        self._lengths_told: set[tuple[str, str, int]] = set()  # (imp, model, length) learned and said
        self._calls: TaskGroup | None = None  # set while ``running``
        self._detached: set[_UpstreamCall] = set()  # calls in flight in that task group

    def policy_changed(self, policy: Policy) -> None:
        self.broker.settings = policy.upstream

    @asynccontextmanager
    async def running(self, grace_s: float) -> AsyncIterator[None]:
        """The act's own task group for model calls in flight: a call outlives a box that dies while the model
        answers. On the way out, calls still running get ``grace_s`` to finish, then are cut (and charged their
        reservation, with an audit row saying so)."""
        async with anyio.create_task_group() as calls:
            self._calls = calls
            try:
                yield
            finally:
                self._calls = None  # calls from here on run inline, cut with their caller
                with anyio.CancelScope(shield=True), anyio.move_on_after(grace_s):
                    for call in list(self._detached):
                        await call.done.wait()
                calls.cancel_scope.cancel()

    async def aclose(self) -> None:
        await self.broker.aclose()

    async def dry_run(self, spec: BoxSpec, method: str, params: BaseModel) -> Decision | None:
        if not isinstance(params, ModelRequestParams):
            return None
        decision, _ = await self._decide_model(spec, params, commit=False)
        return decision

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
        verdict = judge(facts, self.gateway.policy)
        if not verdict.allowed:
            return denied(verdict.rule, verdict.reason), plan
        assert verdict.matched is not None and facts.model is not None
        rule = plan.rule = verdict.matched
        price = self.gateway.policy.price(facts.model)
        if price is None:
            reason = (
                f'model {facts.model!r} has no price in the price table (add [prices."{facts.model}"] to a policy '
                "file); it is refused rather than assumed free"
            )
            return denied(PRICES_RULE, reason), plan
        # issue 11 #3: a text call without an output cap is sent one within the rule's limit, so the upstream
        # cannot write past the reservation; what is forwarded is what is priced.
        cap = min(
            limit
            for limit in (rule.max_tokens, self.gateway.policy.upstream.default_output_tokens)
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
            return denied(PRICES_RULE, str(exc)), plan
        plan.price, plan.multiplier = price, multiplier
        if len(plan.raw) > self.gateway.policy.upstream.max_request_bytes:
            reason = (
                f"the body is {len(plan.raw)} bytes, over {self.gateway.policy.upstream.max_request_bytes}"
            )
            return replace(denied(UPSTREAM_RULE, reason), estimate_micros=estimate), plan
        if not self.broker.configured and not _local(
            params.path, facts.model
        ):  # the local embedder needs no key
            error = RpcError(
                ErrorCode.UPSTREAM_UNREACHABLE, NO_KEY_MESSAGE, {"reason": "no model key configured"}
            )
            return Decision("unreachable", rule.name, NO_KEY_MESSAGE, error, estimate_micros=estimate), plan
        refused = precheck(params.purpose, self._reply_outlook(spec, params.purpose))  # issue 19 #3
        if refused is not None:  # before the model's own meter counts a call that is not made
            decision = Decision("rate_limited", refused.rule, refused.reason, refused.error)
            return replace(decision, estimate_micros=estimate), plan
        limited = self.gateway.rate(rule, (spec.imp,), commit=commit)
        if limited is not None:
            return replace(limited, estimate_micros=estimate), plan
        try:
            if commit:
                plan.reservation = await self.gateway.db.quick(
                    self.gateway.ledger.reserve, spec.imp, estimate, method="model.request", purpose=params.purpose,
                    model=facts.model, run_id=spec.run_id,
                )  # fmt: skip
            else:
                await self.gateway.db.quick(self.gateway.ledger.check_headroom, spec.imp, estimate)
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
        verdict = self.gateway.judge_send(spec, probe)
        if not verdict.allowed or verdict.matched is None:
            return None
        rule = verdict.matched
        limited = self.gateway.rate(rule, (spec.imp, probe.channel_id), commit=False)
        retry_after = limited.error.data["retry_after"] if limited and limited.error else None
        return SendOutlook(rule.name, rule.rate_per_minute, retry_after)

    async def handle(self, request: Request) -> ModelRequestResult:
        asked_at = time.monotonic()  # the box's attempt timer runs from about now: judged and reserved since
        spec, params, record = request.spec, request.params, request.record
        assert isinstance(params, ModelRequestParams)
        decision, plan = await self._decide_model(spec, params, commit=True)
        record.purpose = params.purpose
        record.detail = f"{params.path} model={plan.facts.model}"
        if plan.output_cap is not None:
            record.detail += f" output_cap={plan.output_cap} (set by the host)"
        if _local(params.path, plan.facts.model):
            record.detail += " (computed on the host)"
        if decision.error is not None:  # refused before the upstream: counted with its verdict
            metrics.model_call(
                spec.imp,
                *call_labels(self.gateway.policy, params.purpose, plan.facts.model),
                decision.verdict,
            )
        enforce(decision, record)
        assert (
            plan.reservation is not None and plan.price is not None and decision.estimate_micros is not None
        )
        call = _UpstreamCall(
            spec, params, plan, plan.reservation, decision.estimate_micros, record, asked_at=asked_at
        )
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
                    if params.end_with_box:  # issue 38: a local server stops work no one waits for
                        call.ended_with_box = True
                        call.scope.cancel()
                raise
        if call.error is not None:
            raise call.error
        assert call.response is not None
        response = call.response
        if params.path == "/embeddings" and not _local(params.path, plan.facts.model):
            await self._learn_length(spec, plan.facts.model or "", params.body, response)
        return ModelRequestResult(status=response.status, body=response.body, headers=response.headers)

    def _limit(self, params: ModelRequestParams) -> float | None:
        """The call's time limit: the box may shorten the policy's ``[upstream] timeout_s``, never lengthen it —
        unless the call ends with the box (issue 38: a local server's), which the host's turn ceiling bounds."""
        wanted, policy = params.timeout_s, self.broker.settings.timeout_s
        if wanted is None or params.end_with_box:
            return wanted
        return min(wanted, policy)

    async def _learn_length(
        self, spec: BoxSpec, model: str, body: dict[str, Any], response: UpstreamResponse
    ) -> None:
        """Issue 33: an embedding model that answers another length than the ``dimensions`` asked (most local
        servers give their model's own) has every vector refused by the box, and recall by meaning goes off in
        silence. The host keeps the length it really gives, per imp and model (``ImpStore.box_memory``: the
        imp's next box asks for it), and says so once per host process, in words an operator can act on."""
        imp = spec.imp
        got = answered_length(body, response)
        asked = body.get("dimensions")
        if (
            got is None
            or not isinstance(asked, int)
            or got == asked
            or (imp, model, got) in self._lengths_told
        ):
            return
        self._lengths_told.add((imp, model, got))
        low, high = EMBEDDING_LENGTH_BOUNDS
        if not low <= got <= high:
            said = (
                f"{imp}'s embedding model {model} answers vectors of {got} dimensions, not the {asked} asked, and the "
                f"box takes {low} to {high}: recall by meaning is off for {imp}. Use another embedding model, or "
                f"the host's own: impyard imp set {imp} memory.embedder=local"
            )
        else:
            try:
                await in_thread(ImpStore().learn_embedding_length, imp, model, got)
            except OSError as exc:
                log.warning("could not keep %s's embedding length for %s: %s", imp, model, exc)
            said = (
                f"{imp}'s embedding model {model} ignores dimensions={asked} and answers {got}-dimension vectors: "
                f"this box cannot use them (recall by meaning is off until it ends); {imp}'s next box asks for {got} "
                f"(learned). Say so in imp.toml to make it explicit: impyard imp set {imp} memory.dimensions={got}"
            )
        log.warning("%s", said)
        await self._tell_operator(spec, said)

    async def _tell_operator(self, spec: BoxSpec, said: str) -> None:
        """Where the channel is the operator's own (``impyard chat``'s terminal), the first turn says it there too;
        a Discord channel's people never see the host's setup (the log and ``impyard doctor`` say it)."""
        sending = self.gateway.act(SendAct)
        if sending is None or surface_of(spec.channel_id) != SURFACE_TERMINAL:
            return
        try:
            await sending.surface.send(Post(spec.channel_id, f"(host) {said}", kind="notice", imp=spec.imp))
        except Exception as exc:  # noqa: BLE001 - a notice that cannot be shown is logged, never the turn's end
            log.warning("could not show the embedding notice in %s: %s", spec.channel_id, exc)

    async def _run_call(self, call: _UpstreamCall) -> None:
        """The upstream call, then its settlement: the measured cost; 0 where nothing can have been billed (it
        never left the host, or an error without usage came back); the reservation where the model API may have
        billed a request it received but the answer never came (a hang, or the host stopping mid-call)."""
        params, record, estimate = call.params, call.record, call.estimate
        model = call.plan.facts.model
        cost = estimate
        limit = self._limit(params)
        try:
            with call.scope:
                if _local(
                    params.path, model
                ):  # issue 33: computed here, priced 0 by the policy, audited the same
                    response = await self.local.answer(call.plan.body)
                else:
                    response = await self.broker.call(
                        params.path, call.plan.raw, params.purpose, timeout_s=limit
                    )
            if call.scope.cancelled_caught:
                if limit is not None and time.monotonic() - call.asked_at >= limit - GIVEN_UP_SLACK_S:
                    # The box gave the call up at its limit and ended at the same moment: the server was slow, as
                    # the host's own timer would have said a moment later (which of the two fires first is chance).
                    # Counted from the request's arrival, less the slack its way here and the cancel's way back
                    # may take on a busy host: the box's timer started as it sent it.
                    raise UpstreamTimeout(limit)
                raise _EndedWithBox  # the box went away: recorded as cut, below
        except UpstreamTimeout as exc:
            # Issue 38: the server took the request and was slow: said so, and audited as a timeout.
            record.verdict = "timeout"
            call.error = RpcError(
                ErrorCode.UPSTREAM_UNREACHABLE, str(exc), {"reason": str(exc), "kind": "timeout"}
            )
        except UpstreamUnreachable as exc:
            cost = estimate if exc.sent else 0
            record.verdict = "unreachable"
            call.error = RpcError(
                ErrorCode.UPSTREAM_UNREACHABLE, f"model API unreachable: {exc}", {"reason": str(exc)}
            )
        except _EndedWithBox:
            record.verdict = "interrupted"
            record.reason = (
                "interrupted: the box that asked ended before the model answered (a local server's call ends with "
                "it, issue 38), so the request was closed; charged the reservation, since the model API may bill a "
                "request it received"
            )
            call.error = RpcError(ErrorCode.UPSTREAM_UNREACHABLE, "model request ended with its box")
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
            usage = usage_from_response(params.path, response.body)
            if usage is not None:
                purpose, _ = call_labels(self.gateway.policy, params.purpose, model)
                metrics.model_tokens(
                    call.spec.imp, purpose, input=usage.input_tokens, output=usage.output_tokens,
                    cached=usage.cached_tokens,
                )  # fmt: skip
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
                    call.error = storage_failed(exc, self.gateway.db.url.where())
                finally:
                    labels = call_labels(self.gateway.policy, params.purpose, model)
                    metrics.model_call(call.spec.imp, *labels, record.verdict or "error")
                    call.done.set()
                    self._detached.discard(call)

    async def _settle_and_audit(self, call: _UpstreamCall, cost: int) -> None:
        """The reservation settled at the measured cost, then the call's audit row: two quick transactions
        (issue 18), so that a row that cannot be written never leaves the budget held."""
        db = self.gateway.db
        if db.dialect != "sqlite":  # issue 36: every quick call is a worker's trip there; both in one trip
            await db.run(self._settle_then_row, call, cost)
            return
        try:
            await db.quick(self.gateway.ledger.settle, call.reservation, cost)
        finally:
            self._note_orphaned(call)
            await db.quick(self.gateway.row_now, call.record)  # the gateway's row, in its own trip

    def _settle_then_row(self, call: _UpstreamCall, cost: int) -> None:
        """Blocking: ``_settle_and_audit``'s two transactions, one after the other, in one worker's trip."""
        try:
            self.gateway.ledger.settle(call.reservation, cost)
        finally:
            self._note_orphaned(call)
            self.gateway.row_now(call.record)

    @staticmethod
    def _note_orphaned(call: _UpstreamCall) -> None:
        """Whether its box is gone is read once settled: a box cut while it settled is said to be too."""
        if call.orphaned and call.record.verdict != "interrupted":
            call.record.detail += "; the box ended before the answer came: finished and settled for it"


def _local(path: str, model: str | None) -> bool:
    """A request the host's local embedder answers (issue 33): ``/embeddings`` of the reserved local model."""
    return path == "/embeddings" and model == LOCAL_MODEL


def answered_length(body: dict[str, Any], response: UpstreamResponse) -> int | None:
    """The length of the vector an embeddings answer holds (its ``data[0].embedding``), or None if it holds none."""
    if response.status != 200 or not isinstance(response.body, dict):
        return None
    data = response.body.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    vector = data[0].get("embedding")
    return len(vector) if isinstance(vector, list) else None
