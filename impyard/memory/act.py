"""``memory.*``: the gateway's act that serves what an imp remembers (issue 23; docs/memory.md).

Served only to a box the host opened with memory (``given``, or the supervisor for a task's box), in the scopes
its ``box.init`` told it, never worked out on the box's first request (issue 32 #1). Fenced by this host's lease
as every act is (issue 32 #5), in the service's own order (a box given no memory is told so first), and a write
in flight when the lease is found lost is rolled back. Audited in aggregate, one row per turn (the service's
tallies, handed to the gateway's core at the turn's start and the box's end), not one per request; a box refused
memory or a lease gets one row per refusal, with its rule (the box's refusal budget ends a flood of them).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
from box.protocol import memory as mem
from box.protocol.memory import SessionMemory
from impyard.backends.base import BoxSpec
from impyard.gateway.act import Act, Request
from impyard.gateway.audit import AuditRecord
from impyard.gateway.core import Gateway
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import ONE_BY_ONE, MemoryService

MEMORY_OFF_RULE = "memory-off"


class MemoryAct(Act):
    """Serves ``memory.*`` from ``service`` (None: a host that keeps no memory refuses every request)."""

    methods: ClassVar[frozenset[str]] = frozenset(mem.MEMORY_METHOD_NAMES)
    fenced: ClassVar[bool] = (
        False  # the service asks the lease itself, after whether the box was given memory
    )

    def __init__(self, service: MemoryService | None) -> None:
        self.service = service

    async def handle(self, request: Request) -> BaseModel:
        record = request.record
        record.deferred = True  # no row per request: the turn's row comes from the service's tallies
        if self.service is None:
            raise RpcError(
                ErrorCode.DENIED,
                "denied: this host keeps no memory",
                {"rule": MEMORY_OFF_RULE, "reason": "no store"},
            )
        try:
            return await self.service.serve(request.spec, request.method, request.params, fence=request.fence)
        except RpcError as exc:
            rule = exc.data.get("rule") if isinstance(exc.data, dict) else None
            if rule in ONE_BY_ONE:
                assert isinstance(exc.data, dict)
                record.verdict, record.rule = "denied", str(rule)
                record.reason = str(exc.data.get("reason", exc.message))
                record.started = record.latency_ms = None
                await self.gateway.write_row(record, quiet=True)  # the refusal stands; the disk is the log's
            raise

    def given(self, spec: BoxSpec, memory: SessionMemory | None) -> None:
        if self.service is not None:
            scopes = SessionScopes(memory.writes, tuple(memory.reads)) if memory is not None else None
            self.service.open(spec, scopes)

    def turn_started(self, spec: BoxSpec, message_id: str) -> AuditRecord | None:
        return self.service.stage(spec, "context", message_id) if self.service is not None else None

    def closed(self, spec: BoxSpec) -> AuditRecord | None:
        return self.service.close(spec) if self.service is not None else None


def memory_service_of(gateway: Gateway) -> MemoryService | None:
    """The memory service ``gateway`` serves boxes from (its memory act's), or None: no memory kept."""
    act = gateway.act(MemoryAct)
    return act.service if act is not None else None
