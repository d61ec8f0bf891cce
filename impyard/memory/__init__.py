"""The host's side of the memory engine (issue 23; docs/memory.md): the box thinks, the host keeps.

``store`` (``MemoryStore``: the front of the memory tables and the operator API) and ``scoped``
(``ScopedMemory``: a session's view, filtered by its ``reach``) hand their work to one module per aggregate:
``records``, ``lookups``, ``search`` and ``moments`` (records and their episodes), ``constructs`` and
``slot``, ``dispositions`` (learned rules, the rule law), ``conversations``, ``night`` and ``compact``,
``forgetting`` (with ``identities``: whom forgetting a person takes), ``copying``, ``stats``, ``day`` (the imp's
day as it went), ``counts``, with ``generations`` (the scopes' locks and versions) and
``errors`` beneath them. ``vectors`` (compact blobs), ``cache`` (the per-(imp, scope, dims) matrices and
recall scoring) with ``cache_rows`` (what it loads), ``scopes`` (which scopes a session writes and reads;
presence), ``service`` (the ``memory.*`` requests of a box) and ``act`` (the gateway's handler that
serves them through the service).

May import: the foundations, ``storage``, ``backends``, ``imps``, ``channels``, ``gateway``, ``tasks``.
"""

from impyard.memory.cache import VectorCache
from impyard.memory.errors import MemoryDenied, MemoryInvalid
from impyard.memory.scoped import ScopedMemory
from impyard.memory.scopes import SessionScopes, decide, presence, resolve
from impyard.memory.service import MemoryService, memory_service
from impyard.memory.store import MemoryStore

__all__ = [
    "MemoryDenied",
    "MemoryInvalid",
    "MemoryService",
    "MemoryStore",
    "ScopedMemory",
    "SessionScopes",
    "VectorCache",
    "decide",
    "memory_service",
    "presence",
    "resolve",
]
