"""A box as an engine sees it (issue 21): what to run, as whom, within which limits, with which labels and which
state volume — and nothing of the host's but a name under the state root.

Every backend that asks an engine for a box renders one ``BoxPlan``: the Docker backend as ``docker run`` flags
(``impyard.backends.docker.run_argv``, then the Engine API's create request), a Pod backend as a Pod manifest
(docs/kubernetes.md, on paper). The lockdown that every box gets whatever its plan says — no network, a
read-only root with a small noexec ``/tmp``, no capabilities, no new privileges, an init, stdin open for the
protocol, removed when it ends — is not in the plan: no plan can switch it off. Pure: plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from impyard import paths
from impyard.backends.base import BoxSpec
from impyard.backends.stateroot import STATE_MOUNT, StateVolume

if TYPE_CHECKING:
    from impyard.backends.docker import DockerLimits

LABEL_BOX = "org.impyard.box"
LABEL_HOME = "org.impyard.home"
LABEL_IMP = "org.impyard.imp"
LABEL_CHANNEL = "org.impyard.channel"
LABEL_RUN = "org.impyard.run"
LABEL_ROLE = "org.impyard.role"  # session | task: a chat supervisor never reaps the scheduler's boxes
STATE_ENV = "IMPYARD_STATE_DIR"  # tells the box program where its /state is


def box_name(spec: BoxSpec) -> str:
    """The box's name with its engine (a container's, a Pod's): readable, unique per run."""
    return (
        f"impyard-{paths.safe_name(spec.imp, 24)}-{paths.safe_name(spec.channel_id, 24)}-{spec.run_id[:12]}"
    )


def box_labels(spec: BoxSpec, *, home_id: str, role: str) -> dict[str, str]:
    """The labels the host finds its boxes by (and kills them by, and reaps orphans by)."""
    return {
        LABEL_BOX: "1",
        LABEL_HOME: home_id,
        LABEL_IMP: spec.imp,
        LABEL_CHANNEL: spec.channel_id,
        LABEL_RUN: spec.run_id,
        LABEL_ROLE: role,
    }


@dataclass(frozen=True)
class BoxPlan:
    """One box, engine-neutral. ``command``: None runs the image's own (``python -m box``); ``runtime``: the
    OCI runtime (``runsc``, ``runc``; None: the engine's default); ``state``: the one writable mount, seen by
    the box at ``/state``."""

    name: str
    image: str
    user: str  # "uid:gid", never 0
    limits: DockerLimits
    labels: Mapping[str, str]
    state: StateVolume
    command: tuple[str, ...] | None = None
    runtime: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({STATE_ENV: STATE_MOUNT}))


def box_plan(
    spec: BoxSpec,
    image: str,
    *,
    limits: DockerLimits,
    home_id: str,
    user: str,
    state: StateVolume,
    command: list[str] | None = None,
    role: str = "session",
    runtime: str | None = None,
) -> BoxPlan:
    """The plan of ``spec``'s box: its name and labels from the spec, its state as ``state`` (a name under the
    state root, ``StateRoot.volume``), never the spec's host path itself."""
    return BoxPlan(
        name=box_name(spec),
        image=image,
        user=user,
        limits=limits,
        labels=MappingProxyType(box_labels(spec, home_id=home_id, role=role)),
        state=state,
        command=tuple(command) if command else None,
        runtime=runtime,
    )
