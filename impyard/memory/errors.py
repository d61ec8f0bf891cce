"""The memory store's refusals: what a box is answered DENIED or INVALID_PARAMS for (``service``)."""

from __future__ import annotations

from impyard.errors import ImpyardError


class MemoryStoreError(ImpyardError):
    """Base of the store's refusals."""


class MemoryDenied(MemoryStoreError):
    """A request names a record outside the session's scopes (the box is answered DENIED)."""

    rule = "memory-scopes"


class MemoryForgotten(MemoryDenied):
    """An episode of a message deleted on its surface, its turn still running then (answered DENIED)."""

    rule = "memory-forgotten"


class MemoryInvalid(MemoryStoreError, ValueError):
    """A request the store cannot take (too large, malformed); the box is answered INVALID_PARAMS."""
