"""The console's web application: the pages, and the rules every request passes first (docs/console.md).

Middlewares, outermost first: the security headers every answer carries; the ``Host`` check (loopback consoles
answer only to loopback names); the login (``impyard.console.auth``); the CSRF check on every POST; then the page.
A page that fails answers 500 with one line and the console goes on; a bad form value is the page's 400.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from urllib.parse import urlencode

from aiohttp import web
from aiohttp.typedefs import Handler

from impyard.console.auth import COOKIE, CSRF_FIELD, CSRF_HEADER, Keys, bearer, host_name, is_loopback
from impyard.console.context import CONTEXT, ConsoleContext
from impyard.console.render import CSRF, ENV, NAV, environment, nav_of

log = logging.getLogger("impyard.console")

MAX_BODY_BYTES = 64 * 1024  # a form the console takes is a few fields: a decision's note, a search
KEYS = web.AppKey("impyard.console.keys", Keys)
LOOPBACK_ONLY = web.AppKey("impyard.console.loopback_only", bool)
STATIC = "/static/"
SECURITY_HEADERS = {
    # Only the console's own files run; no inline script or style, no frame, no form posting elsewhere.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # No Referer leaves the console's origin (nor the token in one). Not "no-referrer": under it a browser sends
    # `Origin: null` with every form post, which the origin check below must refuse.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",  # what the stores said is never kept by the browser
}
NO_LOGIN = (
    "This is the impyard console: open the address `impyard console` printed when it started "
    "(http://…/?token=…). Without its token nothing is shown."
)


def _plain(status: int, line: str) -> web.Response:
    return web.Response(status=status, text=line + "\n", content_type="text/plain", charset="utf-8")


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = exc
    except Exception:  # one request fails, never the console
        log.exception("console: %s %s failed", request.method, request.path)
        response = _plain(500, "the console could not answer this request; its log says why")
    response.headers.update(SECURITY_HEADERS)
    return response


@web.middleware
async def host_check(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.app[LOOPBACK_ONLY] and not is_loopback(host_name(request.headers.get("Host", ""))):
        return _plain(400, "this console answers only to a loopback address (127.0.0.1, localhost, [::1])")
    return await handler(request)


@web.middleware
async def login(request: web.Request, handler: Handler) -> web.StreamResponse:
    keys = request.app[KEYS]
    if keys.is_token(request.query.get("token")):
        # The token once in the address: a session cookie, then the same address without the token.
        query = {k: v for k, v in request.query.items() if k != "token"}
        target = request.path + (f"?{urlencode(query)}" if query else "")
        response = web.HTTPSeeOther(target)
        response.set_cookie(COOKIE, keys.session, httponly=True, samesite="Strict", path="/")
        return response
    if keys.is_session(request.cookies.get(COOKIE)) or keys.is_token(
        bearer(request.headers.get("Authorization"))
    ):
        return await handler(request)
    return _plain(401, NO_LOGIN)


@web.middleware
async def csrf_check(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return await handler(request)
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        return _plain(403, f"refused: this change came from {origin[:100]}, not from the console's own pages")
    keys = request.app[KEYS]
    given = request.headers.get(CSRF_HEADER)
    if given is None and request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        given = str((await request.post()).get(CSRF_FIELD, "")) or None
    if not keys.is_csrf(given):
        return _plain(
            403, "refused: this change lacks the console's CSRF token (reload the page and try again)"
        )
    return await handler(request)


async def static_file(request: web.Request) -> web.StreamResponse:
    """The console's own CSS and JavaScript (packaged with impyard; nothing fetched from elsewhere)."""
    name = request.match_info["name"]
    kinds = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}
    kind = next((kinds[s] for s in kinds if name.endswith(s)), None)
    if kind is None or "/" in name or name.startswith("."):
        raise web.HTTPNotFound()
    item = resources.files("impyard.console").joinpath("static", name)
    if not item.is_file():
        raise web.HTTPNotFound()
    return web.Response(body=item.read_bytes(), content_type=kind)


def index_handler(first: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def index(request: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther(first)

    return index


def build_app(context: ConsoleContext, keys: Keys, *, loopback_only: bool = True) -> web.Application:
    """The console over ``context``, guarded by ``keys``; ``loopback_only``: answer only to loopback names."""
    from impyard.console.pages import PAGES

    app = web.Application(
        middlewares=[security_headers, host_check, login, csrf_check], client_max_size=MAX_BODY_BYTES
    )
    app[CONTEXT] = context
    app[KEYS] = keys
    app[LOOPBACK_ONLY] = loopback_only
    app[ENV] = environment()
    app[NAV] = nav_of(PAGES)
    app[CSRF] = keys.csrf
    app.router.add_get("/", index_handler(PAGES[0].path))
    app.router.add_get(STATIC + "{name}", static_file)
    for page in PAGES:
        app.add_routes(page.routes)
    return app
