"""What the gateway's core and its acts agree on (docs/architecture.md, "The gateway by act").

The core (``impyard.gateway.core``) decides, meters and audits; each act a box may ask for — ``model.request``,
``discord.send``, ``http.fetch``, ``history.*``, ``memory.*`` — is served by one handler, an ``Act``, that the host
registers (``impyard.host.build_gateway``). An act is handed a ``Request``: the box (its spec), the method and its
params, and the ``AuditRecord`` the core writes for it once the act returns or raises. The act fills that record
in (verdict, rule, reason, detail) and never writes it itself: the gateway alone writes the audit. Where a row
must commit with the act's own write (the history lines it speaks of, issue 18), the act asks the core to write it
inside that transaction (``Gateway.row_in``).

A refusal is a ``Decision`` (``denied``, ``Gateway.rate``…) turned into the ``RpcError`` the box is answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
from box.protocol.memory import SessionMemory
from impyard.backends.base import BoxSpec
from impyard.gateway.audit import AuditRecord
from impyard.gateway.trust import TrustDecision
from impyard.storage import faults as storage_faults

if TYPE_CHECKING:
    from impyard.gateway.core import Gateway
    from impyard.gateway.gates import Gate
    from impyard.gateway.policy import Policy

# Issue 19 #1: what a failed write of the host's own database is, and how a box is told (the box reads the kind).
STORAGE_FAILED = "the host's storage failed"
LEASE_RULE = "lease"  # issue 21: a host that lost its lease acts no more

Fence = Callable[[], str | None]  # None while the host may act, else why not (``LeaseGuard.check``)


def storage_failed(exc: BaseException | None = None, where: str = "") -> RpcError:
    """The box's error for a failure of the host's database: which kind, in words (impyard.storage.faults; a full
    disk when no error is given), never the driver's own text (it may quote a server's address or a query)."""
    fault = storage_faults.classify(exc, where) if exc is not None else storage_faults.Fault("full")
    return RpcError(
        ErrorCode.INTERNAL_ERROR, f"{STORAGE_FAILED}: {storage_faults.words(fault)}", {"kind": "store"}
    )


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


def denied(rule: str, reason: str) -> Decision:
    """A refusal by ``rule``: DENIED, with the rule and the reason the box's model can read."""
    error = RpcError(
        ErrorCode.DENIED, f"denied by policy rule {rule}: {reason}", {"rule": rule, "reason": reason}
    )
    return Decision("denied", rule, reason, error)


def refusal(decision: Decision, record: AuditRecord) -> RpcError:
    """Put a refusal on the audit row; returns what the box is answered."""
    assert decision.error is not None
    record.verdict, record.rule, record.reason = decision.verdict, decision.rule, decision.reason
    return decision.error


def enforce(decision: Decision, record: AuditRecord) -> None:
    """Put the decision's rule on the audit row; a refusal is raised for the box."""
    record.rule = decision.rule
    if decision.error is not None:
        raise refusal(decision, record)


@dataclass
class Request:
    """One box request as an act gets it. ``record`` is the row the core writes when the act is done (unless
    the act marks it ``deferred``: written already, in the act's own transaction, or not per request).
    ``fence``: the host's lease (None when it holds none), for an act that asks it itself (``Act.fenced``)."""

    spec: BoxSpec
    method: str
    params: BaseModel
    record: AuditRecord
    fence: Fence | None = None


class Act:
    """One handler of the gateway: the methods it serves and what it does with them. The hooks below do nothing
    unless an act overrides them; the core calls each registered act's hooks at the box's and the host's turns."""

    methods: ClassVar[frozenset[str]] = frozenset()
    # The core refuses the act (rule ``lease``) before the handler when its host's lease is lost (issue 21);
    # an act that is False asks ``Request.fence`` itself, in its own order.
    fenced: ClassVar[bool] = True
    # Gates this act opens (by their ``act``): the core executes an approved one through ``deliver_gate``.
    gated: ClassVar[frozenset[str]] = frozenset()

    _gateway: Gateway | None = None

    @property
    def gateway(self) -> Gateway:
        assert self._gateway is not None, f"{type(self).__name__} is not registered with a gateway"
        return self._gateway

    def bind(self, gateway: Gateway) -> None:
        """Registered with ``gateway`` (``Gateway.register``): the core it decides, meters and audits with."""
        self._gateway = gateway

    async def handle(self, request: Request) -> BaseModel:
        """Serve ``request``, filling in ``request.record``; a refusal is raised (an ``RpcError``)."""
        raise NotImplementedError

    async def dry_run(self, spec: BoxSpec, method: str, params: BaseModel) -> Decision | None:
        """The decision ``handle`` would take now, acting on nothing (issue 12); None: this act has none."""
        return None

    def given(self, spec: BoxSpec, memory: SessionMemory | None) -> None:
        """What ``box.init`` gives a session's box, told before it is sent (issue 32 #1)."""

    def turn_started(self, spec: BoxSpec, message_id: str) -> AuditRecord | None:
        """A box's turn began, for the message the host handed it; returns a row for the core to write."""
        return None

    def closed(self, spec: BoxSpec) -> AuditRecord | None:
        """A box ended: forget it; returns its last row for the core to write, if any."""
        return None

    def policy_changed(self, policy: Policy) -> None:
        """A reloaded policy (already validated) is swapped in."""

    def running(self, grace_s: float) -> AbstractAsyncContextManager[None]:
        """What the act keeps running while the host serves (the model calls in flight); on the way out, what
        still runs gets ``grace_s`` to finish."""
        return _nothing()

    async def aclose(self) -> None:
        """The host stops: release what the act holds (the model broker's connections)."""

    async def reaches(self, channel_id: str) -> bool:
        """Whether this host delivers this act's gates into ``channel_id``."""
        return True

    async def deliver_gate(self, gate: Gate) -> list[str]:
        """Execute an approved gate's frozen payload; returns what it produced (message ids)."""
        raise NotImplementedError


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield
