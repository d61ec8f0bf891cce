"""The Discord surface: inbound messages, outbound sends, slash commands, `impyard serve`.

May import: everything below it — the foundations, ``storage``, ``backends``, ``imps``, ``channels``,
``gateway``, ``tasks``, ``memory``, ``conversation``, the assembly (``impyard.host``, ``impyard.runtime``) and
``supervisor``. Not ``terminal`` (a peer) nor ``cli``.
"""
