"""The gateway as a task run's box sees it, fenced by the run's lease (issue 21).

A task run holds the lease ``task:<task>/<run>`` from its claim to its end (``impyard.supervisor.loop``). Once
that lease is lost — another host took it over to reclaim the task, or it could not be renewed before its local
deadline — the run may act no more: every act its box still asks for (``model.request``, ``discord.send``,
``http.fetch``, ``history.*``, ``memory.*``: the acts the gateway fences with a host's own lease) is refused with
``-32010``, rule ``lease``, and an audit row, before the gateway sees it: nothing is reserved, gated, fetched,
posted, remembered or forgotten. The check is the keeper's, from memory (``LeaseGuard.check``): no database hop
per act. A memory write already in flight when the lease is lost is not committed either (issue 32 #5): the
supervisor opens the box's memory with the same check, which the write asks inside its transaction, last
(``MemoryService.open(fence=…)``). Everything else is the gateway's, unchanged (its own host-wide ``lease_guard``
included).
"""

from __future__ import annotations

from pydantic import BaseModel

from box.protocol.memory import SessionMemory
from box.protocol.models import TurnStageParams
from impyard.backends import BoxSpec
from impyard.gateway.act import LEASE_RULE
from impyard.gateway.core import Gateway
from impyard.storage.leases import LeaseGuard

# What a box asks the host to do in the world (the gateway's own handlers, and the memory store: a memory kept or
# forgotten is an act as much as a post, issue 32 #5): each is fenced by the run's lease.
FENCED_METHODS = frozenset({"model.request", "discord.send", "http.fetch", "history.load", "history.commit"})


def fenced(method: str) -> bool:
    """Whether ``method`` is an act a run may ask only while it holds its lease."""
    return method in FENCED_METHODS or method.startswith(("history.", "memory."))


class RunFence:
    """The host of one task run's box: the gateway, with every act refused once the run's lease is lost."""

    def __init__(self, gateway: Gateway, guard: LeaseGuard) -> None:
        self.gateway = gateway
        self.guard = guard

    async def serve(self, spec: BoxSpec, method: str, params: BaseModel) -> BaseModel | None:
        if fenced(method):
            stale = self.guard.check()
            if stale is not None:
                # The gateway audits the refusal and says what the box is answered.
                raise await self.gateway.refuse(
                    spec, method, LEASE_RULE, f"this task run holds no lease to act: {stale}"
                )
        return await self.gateway.serve(spec, method, params)

    async def turn_stage(self, spec: BoxSpec, params: TurnStageParams, *, woken: bool = False) -> None:
        """A task's box starts no turn of a message the host handed it: its stage is just heard."""
        await self.gateway.turn_stage(spec, params)

    def given(self, spec: BoxSpec, memory: SessionMemory | None) -> None:
        """Nothing: a task's box is opened by the supervisor, with its run's fence (``Supervisor._init_params``)."""

    async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
        """A request the protocol refused before any host saw it: the gateway audits it."""
        await self.gateway.refused(spec, method, code, reason)

    async def closed(self, spec: BoxSpec) -> None:
        """The box ended: the gateway forgets what it kept for it."""
        await self.gateway.closed(spec)
