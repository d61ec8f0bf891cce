"""Pick the box backend: Docker for real use; the process backend only when asked or when Docker is absent."""

from __future__ import annotations

import logging
from typing import Literal

from impyard.backends.base import BoxBackend, BoxStartError
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.process import NO_LOCKDOWN_WARNING, ProcessBackend
from impyard.backends.stateroot import StateRoot

log = logging.getLogger("impyard.box")

BackendName = Literal["auto", "docker", "process"]


def choose_backend(
    name: BackendName = "auto",
    *,
    limits: DockerLimits | None = None,
    role: str = "session",
    runtime: str = "auto",
    state_root: StateRoot | None = None,
) -> BoxBackend:
    """``docker`` fails closed if Docker cannot run a confined box; ``auto`` falls back to process, loudly.
    ``runtime``: the Docker box's OCI runtime setting (``[box] runtime``; ``IMPYARD_BOX_RUNTIME`` overrides it).
    ``state_root``: under which every box's /state lies (None: ``IMPYARD_STATE_ROOT``, else IMPYARD_HOME/imps)."""
    if name == "process":
        return ProcessBackend(state_root=state_root)
    docker_backend = DockerBackend(limits=limits, role=role, runtime=runtime, state_root=state_root)
    if name == "docker":
        return docker_backend
    try:
        docker_backend.client()
    except BoxStartError as exc:
        log.warning("Docker is not available (%s). %s", exc, NO_LOCKDOWN_WARNING)
        return ProcessBackend(warn=False, state_root=state_root)
    return docker_backend
