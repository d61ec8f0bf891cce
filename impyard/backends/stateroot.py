"""The state root (issue 21, docs/kubernetes.md): the one host directory under which every box's ``/state`` lives.

A backend is handed a box's state as a *name under the state root* (a ``StateVolume``), never as an arbitrary
host path: the Docker and process backends mount ``root / name``, and a backend with no host disk of its own
(a Pod on Kubernetes, docs/kubernetes.md) would mount the same name as a ``subPath`` of the root's volume. What
lives there is only the box's own call log and scratch (docs/memory.md); it stays on the host that ran the box
and may be lost with it.

``IMPYARD_STATE_ROOT`` (an absolute path) sets the root and makes it a fence: a box whose state dir is not
strictly inside it is refused (``BoxStartError``), before anything is created or mounted. Unset, the root is
``IMPYARD_HOME/imps`` (where each imp's ``state/`` already is), and a state dir outside it — ``impyard box
check``'s temporary dir, a test's — is still accepted as a root of its own, as before issue 21.
Pure: plain values in, plain values out; nothing here touches the disk except ``Path.resolve``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from impyard import paths
from impyard.backends.base import BoxStartError

STATE_ROOT_ENV = "IMPYARD_STATE_ROOT"
STATE_MOUNT = "/state"  # where every box sees its state volume


@dataclass(frozen=True)
class StateVolume:
    """A box's ``/state``: ``name`` (relative, no ``..``) under the state root ``root``."""

    root: Path
    name: PurePosixPath

    def __post_init__(self) -> None:
        if self.name.is_absolute() or not self.name.parts or ".." in self.name.parts:
            raise BoxStartError(f"a box's state volume must be a name under the state root (got {self.name})")

    @property
    def path(self) -> Path:
        """Where the volume is on the host that runs the box (a bind mount's source)."""
        return self.root.joinpath(*self.name.parts)


@dataclass(frozen=True)
class StateRoot:
    """Where boxes' state lives on this host. ``strict``: a state dir outside ``path`` is refused (the root
    was set by ``source``); else it is its own root (the default root, which only names what is inside it)."""

    path: Path
    strict: bool = False
    source: str = "the default (IMPYARD_HOME/imps)"

    def volume(self, state_dir: Path) -> StateVolume:
        """``state_dir`` as a name under this root; ``BoxStartError`` when the root is a fence it is outside."""
        if self.strict:
            # Links above the state dir are followed before judging; one in its own place is not (the backend
            # opens it without following links and refuses it, issue 11 #2).
            root, resolved = self.path.resolve(), state_dir.parent.resolve() / state_dir.name
            if resolved == root or not resolved.is_relative_to(root):
                raise BoxStartError(
                    f"the box's /state {state_dir} is not inside the state root {root} ({self.source}): "
                    f"no box mounts a host path outside it; set {STATE_ROOT_ENV} to a dir that holds "
                    "IMPYARD_HOME/imps, or unset it"
                )
            return StateVolume(root, PurePosixPath(resolved.relative_to(root).as_posix()))
        if state_dir != self.path and state_dir.is_relative_to(self.path):
            name = PurePosixPath(state_dir.relative_to(self.path).as_posix())
            if ".." not in name.parts:
                return StateVolume(self.path, name)
        return StateVolume(
            state_dir.parent, PurePosixPath(state_dir.name)
        )  # its own root, as before issue 21

    def describe(self) -> str:
        return f"{self.path} ({self.source}{', enforced' if self.strict else ''})"


def state_root(environ: Mapping[str, str] | None = None, home: Path | None = None) -> StateRoot:
    """The state root: ``IMPYARD_STATE_ROOT`` when set (enforced), else ``IMPYARD_HOME/imps``.

    A relative ``IMPYARD_STATE_ROOT`` is a ``BoxStartError`` naming it: no box starts."""
    raw = (os.environ if environ is None else environ).get(STATE_ROOT_ENV, "").strip()
    if not raw:
        return StateRoot((home or paths.home()) / "imps")
    configured = Path(raw).expanduser()
    if not configured.is_absolute():
        raise BoxStartError(
            f"{STATE_ROOT_ENV} must be an absolute path (got {raw!r}): fix it, or unset it to keep boxes' "
            "state under IMPYARD_HOME/imps"
        )
    return StateRoot(configured, strict=True, source=STATE_ROOT_ENV)
