"""Pick the box backend: Docker for real use; the process backend only when asked or when Docker is absent."""

from __future__ import annotations

import logging
from typing import Literal

from impyard.backends.base import BoxBackend, BoxStartError
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.process import NO_LOCKDOWN_WARNING, ProcessBackend

log = logging.getLogger("impyard.box")

BackendName = Literal["auto", "docker", "process"]


def choose_backend(
    name: BackendName = "auto",
    *,
    limits: DockerLimits | None = None,
    role: str = "session",
    runtime: str = "auto",
) -> BoxBackend:
    """``docker`` fails closed if Docker cannot run a confined box; ``auto`` falls back to process, loudly.
    ``runtime``: the Docker box's OCI runtime setting (``[box] runtime``; ``IMPYARD_BOX_RUNTIME`` overrides it)."""
    if name == "process":
        return ProcessBackend()
    docker_backend = DockerBackend(limits=limits, role=role, runtime=runtime)
    if name == "docker":
        return docker_backend
    try:
        docker_backend.client()
    except BoxStartError as exc:
        log.warning("Docker is not available (%s). %s", exc, NO_LOCKDOWN_WARNING)
        return ProcessBackend(warn=False)
    return docker_backend
