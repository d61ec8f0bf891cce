"""Which box backend runs an imp's task boxes: its ``[box]`` settings (or an operator's override)."""

from __future__ import annotations

from collections.abc import Callable

from impyard.backends import BoxBackend
from impyard.backends.choose import choose_backend
from impyard.backends.docker import DockerLimits
from impyard.backends.stateroot import StateRoot
from impyard.imps.store import ImpStore

BackendFor = Callable[[str], BoxBackend]


class BackendChooser:
    """Each imp's backend from its ``[box]`` settings (or an override); boxes labelled as task boxes."""

    def __init__(
        self, imps: ImpStore, override: str | None = None, *, state_root: StateRoot | None = None
    ) -> None:
        """``state_root``: under which every task box's /state lies (None: ``IMPYARD_STATE_ROOT``, else
        IMPYARD_HOME/imps, read at each start)."""
        self.imps = imps
        self.override = override
        self.state_root = state_root
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
                state_root=self.state_root,
            )
        return self._chosen[key]
