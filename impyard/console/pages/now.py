"""Now: what every host on this database is doing now — turns in flight with their stage, messages queued, warm
boxes, task runs under way — and the newest turn outcomes (``impyard now``'s, the same ``read_now``).

The page's content is one fragment (``/now/fragment``) that the console's script polls every few seconds
(``data-refresh-url``): live without a script of its own. Hosts publish about once a second (docs/hosts.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aiohttp import web

from impyard.console.context import context_of
from impyard.console.page import Page
from impyard.console.render import fragment, render
from impyard.conversation.activity import Now, read_now
from impyard.durations import format_duration

PAGE = Page("Now", "/now")
FRAGMENT = PAGE.path + "/fragment"
REFRESH_S = 2  # how often the page asks again; hosts publish at most once a second
RECENT = 20


async def _now(request: web.Request) -> Now:
    context = context_of(request)
    return await context.db.run(read_now, context.db, context.clock.now(), recent=RECENT)


def _values(now: Now) -> dict[str, Any]:
    def since(when: datetime | None) -> str:
        """How long ago, as ``impyard now`` says it (``3s``, ``1m20s``)."""
        return format_duration(now.at - when) if when is not None else ""

    return {"now": now, "since": since, "duration": format_duration}


@PAGE.routes.get(PAGE.path)
async def now_page(request: web.Request) -> web.Response:
    return render(
        request,
        "now.html",
        title="Now",
        fragment_url=FRAGMENT,
        refresh_s=REFRESH_S,
        **_values(await _now(request)),
    )


@PAGE.routes.get(FRAGMENT)
async def now_fragment(request: web.Request) -> web.Response:
    return fragment(request, "now_fragment.html", **_values(await _now(request)))
