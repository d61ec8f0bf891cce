"""Audit: the gateway's audit log, newest first, filtered by imp, method, rule and verdict (``impyard audit
tail``'s filters, the same ``AuditLog.search``). Secrets were redacted when each row was written."""

from __future__ import annotations

from aiohttp import web

from impyard.console.context import context_of
from impyard.console.page import Page
from impyard.console.render import render
from impyard.gateway.audit import MAX_FILTER_CHARS, AuditFilter, AuditLog

PAGE = Page("Audit", "/audit")
ROWS = 100
FILTERS = ("imp", "method", "rule", "verdict")


def _filter(request: web.Request) -> AuditFilter:
    values = {name: request.query.get(name, "").strip()[:MAX_FILTER_CHARS] or None for name in FILTERS}
    before = request.query.get("before", "").strip()
    if before and not before.isdigit():
        raise web.HTTPBadRequest(text=f"before must be a row id (a whole number), not {before[:40]!r}\n")
    return AuditFilter(**values, before=int(before) if before else None)


@PAGE.routes.get(PAGE.path)
async def audit_page(request: web.Request) -> web.Response:
    context = context_of(request)
    log = AuditLog(context.db, context.clock, secrets=())
    where = _filter(request)
    rows = await context.db.run(log.search, ROWS + 1, where)
    facets = await context.db.run(log.facets)
    return render(
        request, "audit.html", title="Audit", rows=rows[:ROWS], facets=facets, where=where, filters=FILTERS,
        older=rows[ROWS - 1].id if len(rows) > ROWS else None,
    )  # fmt: skip
