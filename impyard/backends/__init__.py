"""Box backends: where a box runs (a Docker container, or a plain process for development).

May import: the foundations and ``storage``; of ``box/``, only ``box.protocol`` and what both sides run.
"""

from impyard.backends.base import (
    BoxBackend,
    BoxDied,
    BoxError,
    BoxHost,
    BoxSpec,
    BoxStartError,
    BoxTimeout,
    QuietHost,
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
    "QuietHost",
    "RefuseAllHost",
    "RunningBox",
]
