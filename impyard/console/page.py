"""A console page: its title and address in the navigation, and its routes (one module per page)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web


@dataclass(frozen=True)
class Page:
    """``routes`` answer under ``path`` (the page itself at ``path``; fragments and actions below it)."""

    title: str
    path: str
    routes: web.RouteTableDef = field(default_factory=web.RouteTableDef, compare=False)
    in_nav: bool = True
