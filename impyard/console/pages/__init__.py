"""The console's pages, in navigation order: one module each, each with its ``PAGE`` (title, address, routes).

The first page is where ``/`` leads.
"""

from __future__ import annotations

from impyard.console.page import Page
from impyard.console.pages import audit, budget

PAGES: tuple[Page, ...] = (
    audit.PAGE,  # first until the Imps page lands (`/` leads to the first; the auth test expects Audit)
    budget.PAGE,
)  # wanted: Imps, Now, Approvals, Budget, Audit, Memory, Hosts
