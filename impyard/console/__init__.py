"""The operator's console (issue 34; docs/console.md): a web surface over the same stores and rules as the CLI.

``impyard console`` serves it on loopback (``impyard.console.server``); every page and action needs the login token
the command prints (``impyard.console.auth``), every change is a POST with a CSRF token, and every change goes through
the store functions the CLI calls — the console is one more surface, never a second implementation. Pages live in
``impyard.console.pages``, one module each.

May import: everything below it — the foundations, ``metrics``, ``storage``, ``backends``, ``imps``, ``channels``,
``gateway``, ``tasks``, ``memory``, ``conversation``, the assembly (``impyard.host``, ``impyard.runtime``) and
``supervisor``. Not ``discord`` nor ``terminal`` (peers) nor ``cli``.
"""
