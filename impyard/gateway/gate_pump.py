"""The gate pump: one per host process, the one place where gates move without a request (issue 12).

Each pass (``run_once``): gates past their deadline expire; gates approved elsewhere (the CLI, another
host) are executed, exactly once, but only where this host's surface reaches their channel — a
supervisor without Discord leaves a Discord post approved for the host that has Discord; then the
followers run (the Discord host's approval cards show decisions taken elsewhere). ``run`` repeats the
pass every ``period_s``; tests call ``run_once`` instead of sleeping through a period.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from impyard.gateway.core import Gateway
from impyard.gateway.gates import Gate

log = logging.getLogger("impyard.gates")

GATE_PUMP_S = 2.0  # how soon a decision taken elsewhere (the CLI, the deadline) takes effect on this host

Follower = Callable[[], Awaitable[None]]


class GatePump:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._followers: list[Follower] = []

    def follow(self, follower: Follower) -> None:
        """Run ``follower`` after every pass (e.g. refresh approval cards of gates decided elsewhere)."""
        self._followers.append(follower)

    async def run_once(self) -> list[Gate]:
        """One pass; returns the gates it moved (expired or executed)."""
        moved = []
        for gate in await self.gateway.expire_due():
            log.info("gate %s expired (imp=%s run=%s)", gate.id, gate.imp, gate.run_id)
            moved.append(gate)
        for gate in await self.gateway.execute_approved():
            log.info("approved gate %s %s (imp=%s run=%s)", gate.id, gate.state, gate.imp, gate.run_id)
            moved.append(gate)
        for follower in self._followers:
            try:
                await follower()
            except Exception:  # noqa: BLE001 - a follower that fails never stops the gates moving
                log.exception("a gate follower failed")
        return moved

    async def run(self, period_s: float = GATE_PUMP_S) -> None:
        """``run_once`` every ``period_s`` until cancelled; one bad gate never stops the pump."""
        while True:
            try:
                await self.run_once()
            except Exception:  # noqa: BLE001 - the gate records its own failure; the pump goes on
                log.exception("moving gates failed")
            await anyio.sleep(period_s)
