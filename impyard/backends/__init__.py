"""Box backends: where a box runs (a Docker container, or a plain process for development)."""

from impyard.backends.base import (
    BoxBackend,
    BoxDied,
    BoxError,
    BoxHost,
    BoxSpec,
    BoxStartError,
    BoxTimeout,
    RefuseAllHost,
    RunningBox,
)

__all__ = [
    "BoxBackend",
    "BoxDied",
    "BoxError",
    "BoxHost",
    "BoxSpec",
    "BoxStartError",
    "BoxTimeout",
    "RefuseAllHost",
    "RunningBox",
]
