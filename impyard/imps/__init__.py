"""Imps: an imp's ``imp.toml`` — its typed model (``config``), read and checked (``validate``), written back with
its comments (``render``), the store that adds, reads and removes imps (``store``), and ``impyard imp set``'s comment-keeping edits (``edit``).

May import: the foundations, ``storage``, ``backends`` (the runtime names an imp may ask for).
"""
