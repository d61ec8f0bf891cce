"""Hosts: the hosts serving from this database, shards, terminal channels and task runs, with who holds each (issue
34; docs/console.md) — ``impyard hosts``'s rows (``impyard.storage.cluster``), the same states: a holder that stopped
renewing is ``expired``, one of this machine that is gone is ``dead``. The tables refresh every few seconds."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from impyard.console.context import context_of
from impyard.console.page import Page
from impyard.console.render import fragment, render
from impyard.durations import relative_time
from impyard.storage.cluster import Cluster, read_cluster

PAGE = Page("Hosts", "/hosts")
REFRESH_S = 5  # a record is renewed every 10 s: a stopped host shows within one renewal


async def _cluster(request: web.Request) -> Cluster:
    context = context_of(request)
    return await context.db.run(read_cluster, context.db, context.clock.now())


def _values(found: Cluster) -> dict[str, Any]:
    return {
        "cluster": found,
        "ago": lambda when: relative_time(when, found.now) if when is not None else "?",
        "refresh_s": REFRESH_S,
    }


@PAGE.routes.get(PAGE.path)
async def hosts_page(request: web.Request) -> web.Response:
    return render(request, "hosts.html", title="Hosts", **_values(await _cluster(request)))


@PAGE.routes.get(PAGE.path + "/fragment")
async def hosts_fragment(request: web.Request) -> web.Response:
    return fragment(request, "_hosts_tables.html", **_values(await _cluster(request)))
