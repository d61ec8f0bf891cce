"""Server-rendered HTML: Jinja2 templates (autoescaped), the layout, the navigation and the CSRF field.

Every page extends ``templates/base.html``; ``render`` gives it the navigation, the page's title, the CSRF token
(``{{ csrf_field() }}`` in every form that posts) and the console's clock. Text from the stores (messages, names,
audit details) is escaped by Jinja's autoescape; nothing is marked safe that came from outside.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
from aiohttp import web
from markupsafe import Markup

from impyard.console.auth import CSRF_FIELD
from impyard.console.page import Page

ENV = web.AppKey("impyard.console.templates", jinja2.Environment)
NAV = web.AppKey("impyard.console.nav", tuple)
CSRF = web.AppKey("impyard.console.csrf", str)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("impyard.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a name a template misspells is an error, never an empty cell
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["utc"] = utc
    env.filters["usd"] = usd
    return env


def utc(when: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A time as the CLI shows it (UTC); nothing for no time."""
    return "" if when is None else when.strftime(fmt)


def usd(micros: int | None, digits: int = 4) -> str:
    """Micro-dollars as dollars (``no limit`` for None, as ``impyard budget show`` says)."""
    return "no limit" if micros is None else f"{micros / 1_000_000:.{digits}f}"


def render(
    request: web.Request, template: str, *, title: str, status: int = 200, **values: Any
) -> web.Response:
    """``template`` with ``values``, inside the layout."""
    app = request.app
    csrf = app[CSRF]
    context: Mapping[str, Any] = {
        "title": title,
        "nav": app[NAV],
        "here": request.path,
        "csrf_token": csrf,
        "csrf_field": lambda: Markup('<input type="hidden" name="{}" value="{}">').format(CSRF_FIELD, csrf),
        **values,
    }
    html = app[ENV].get_template(template).render(context)
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


def fragment(request: web.Request, template: str, **values: Any) -> web.Response:
    """A part of a page (what ``data-refresh-url`` polls): the template alone, no layout."""
    html = request.app[ENV].get_template(template).render(values)
    return web.Response(text=html, content_type="text/html", charset="utf-8")


def nav_of(pages: tuple[Page, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((page.title, page.path) for page in pages if page.in_nav)
