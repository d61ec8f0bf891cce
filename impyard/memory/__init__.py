"""The host's side of the memory engine (issue 23; docs/memory.md): the box thinks, the host keeps.

``store`` (tables, the scoped query layer, the operator API), ``vectors`` (compact blobs), ``cache``
(the per-(imp, scope, dims) matrices and recall scoring), ``scopes`` (which scopes a session writes and
reads; presence), ``service`` (the ``memory.*`` requests of a box).

May import: the foundations, ``storage``, ``backends``, ``imps``, ``channels``, ``gateway``, ``tasks``.
"""

from impyard.memory.cache import VectorCache
from impyard.memory.scopes import SessionScopes, decide, presence, resolve
from impyard.memory.service import MemoryService, memory_service
from impyard.memory.store import MemoryDenied, MemoryInvalid, MemoryStore, ScopedMemory

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
