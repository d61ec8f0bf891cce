"""The console's pages, in navigation order: one module each, each with its ``PAGE`` (title, address, routes).

The first page is where ``/`` leads.
"""

from __future__ import annotations

from impyard.console.page import Page
from impyard.console.pages import approvals, audit, budget, hosts, imps, memory, now

# Navigation order: Imps, Now, Approvals, Budget, Audit, Memory, Hosts.
PAGES: tuple[Page, ...] = (
    imps.PAGE, now.PAGE, approvals.PAGE, budget.PAGE, audit.PAGE, memory.PAGE, hosts.PAGE,
)  # fmt: skip
