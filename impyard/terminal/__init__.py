"""The terminal surface: ``impyard chat <imp>`` (``chat``), its slash commands (``commands``), where it reads and
shows (``console``) and what it says about a turn (``turn_words``).

May import: everything below it — the foundations, ``storage``, ``backends``, ``imps``, ``channels``,
``gateway``, ``tasks``, ``memory``, ``conversation``, the assembly (``impyard.host``, ``impyard.runtime``) and
``supervisor``. Not ``discord`` (a peer) nor ``cli``.
"""
