"""The console's pages, in navigation order: one module each, each with its ``PAGE`` (title, address, routes).

The first page is where ``/`` leads.
"""

from __future__ import annotations

from impyard.console.page import Page
from impyard.console.pages import audit, now

PAGES: tuple[Page, ...] = (now.PAGE, audit.PAGE)
