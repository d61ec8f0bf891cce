"""Which box backend runs an imp's task boxes: its ``[box]`` settings (or an operator's override)."""

from __future__ import annotations

from collections.abc import Callable

from impyard.backends import BoxBackend
from impyard.backends.choose import choose_backend
from impyard.backends.docker import DockerLimits
from impyard.imps import ImpStore

BackendFor = Callable[[str], BoxBackend]


class BackendChooser:
    """Each imp's backend from its ``[box]`` settings (or an override); boxes labelled as task boxes."""

    def __init__(self, imps: ImpStore, override: str | None = None) -> None:
        self.imps = imps
        self.override = override
        self._chosen: dict[tuple[str, DockerLimits, str], BoxBackend] = {}

    def __call__(self, imp: str) -> BoxBackend:
        config = self.imps.get(imp)
        key = (self.override or config.box.backend, config.box.docker_limits(), config.box.runtime)
        if key not in self._chosen:
            self._chosen[key] = choose_backend(
                key[0],  # type: ignore[arg-type]
                limits=key[1],
                role="task",
                runtime=key[2],
            )
        return self._chosen[key]
