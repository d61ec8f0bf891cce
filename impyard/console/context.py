"""What every console page works with: the home's database and imps, the clock, and who the operator is."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from impyard.clock import Clock, SystemClock
from impyard.gateway.gates import operator_name
from impyard.imps.store import ImpStore
from impyard.storage.db import Database


@dataclass(eq=False)
class ConsoleContext:
    """One console's view of a home: pages read and change the stores through ``db`` (``await db.run(fn, ...)``)."""

    db: Database
    imps: ImpStore = field(default_factory=ImpStore)
    clock: Clock = field(default_factory=SystemClock)
    operator: str = field(
        default_factory=operator_name
    )  # decisions are ``operator:<account>``, as on the CLI


CONTEXT = web.AppKey("impyard.console.context", ConsoleContext)


def context_of(request: web.Request) -> ConsoleContext:
    """The console's context, from any request handler."""
    return request.app[CONTEXT]
