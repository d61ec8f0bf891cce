"""The Docker backend: every box is ``docker run -i --rm --init`` with the full lockdown of docs/box.md.

The lockdown is written once, as ``run_argv``'s command line; the engine is asked for exactly that container
through its API socket (``impyard.backends.runflags`` maps each flag to its create field) and the box's stdio
is a hijacked attach stream (``impyard.backends.engine``): no ``docker run`` client process per box (issue 18).
The docker SDK does the rest of the lifecycle: preflight checks, kill by name, listing and removing labelled
orphans. Fail closed: no engine, no image, an engine that cannot apply a limit, or a flag with no API field is
a ``BoxStartError``, never an unconfined box.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from impyard import paths
from impyard.backends.base import BoxHost, BoxSpec, BoxStartError, RunningBox, supervise_process
from impyard.backends.engine import Engine, EngineError
from impyard.backends.mounts import claimed_mount
from impyard.backends.plan import (
    LABEL_BOX,
    LABEL_CHANNEL,
    LABEL_HOME,
    LABEL_IMP,
    LABEL_ROLE,
    LABEL_RUN,
    BoxPlan,
    box_name,
    box_plan,
)
from impyard.backends.runflags import create_request
from impyard.backends.runtimes import RuntimeChoice, resolve_runtime, runtime_choice, runtime_words
from impyard.backends.statedir import StateQuota, measure_state_dir, prepare_state_dir
from impyard.backends.stateroot import STATE_MOUNT, StateRoot, StateVolume, state_root
from impyard.threads import in_thread

__all__ = [  # the labels and the mount point are the plan's; named here too, where callers have found them
    "LABEL_BOX", "LABEL_CHANNEL", "LABEL_HOME", "LABEL_IMP", "LABEL_ROLE", "LABEL_RUN", "STATE_MOUNT",
    "BOX_UID", "DockerBackend", "DockerLimits", "box_user", "container_name", "docker_argv", "run_argv",
]  # fmt: skip

log = logging.getLogger("impyard.box")

BOX_UID = 10001  # the non-root user boxes run as when the host runs as root
DOCKER_API_TIMEOUT_S = 10

# docker info fields that say the engine can enforce each limit we set.
_REQUIRED_ENGINE_FEATURES = {
    "MemoryLimit": "--memory",
    "SwapLimit": "--memory-swap",
    "PidsLimit": "--pids-limit",
    "CpuCfsQuota": "--cpus",
}


@dataclass(frozen=True)
class DockerLimits:
    """Resource limits of every box (docs/box.md)."""

    memory: str = "512m"  # also the --memory-swap value: no swap beyond it
    cpus: float = 1.0
    pids_limit: int = 128
    tmpfs_size: str = "64m"
    nofile: int = 1024
    state_quota: StateQuota = StateQuota()  # also the largest single file a box may write (--ulimit fsize)


def box_user() -> str:
    """A non-root uid:gid for the box: 10001 when the host is root, else the host's own (non-root) uid."""
    uid = os.getuid()
    if uid == 0:
        return f"{BOX_UID}:{BOX_UID}"
    return f"{uid}:{os.getgid()}"


def container_name(spec: BoxSpec) -> str:
    return box_name(spec)


def run_argv(
    spec: BoxSpec,
    image: str,
    *,
    limits: DockerLimits,
    home_id: str,
    user: str,
    command: list[str] | None = None,
    role: str = "session",
    runtime: str | None = None,
    docker_bin: str = "docker",
    state: StateVolume | None = None,
) -> list[str]:
    """The full ``docker run`` command line of a box: every lockdown flag, one rw mount, and its OCI runtime
    (``runtime``; None: the engine's default). ``state``: the box's state volume under the state root (None:
    ``spec.state_dir`` under the default root, the same directory)."""
    volume = state or StateRoot(paths.home() / "imps").volume(spec.state_dir)
    plan = box_plan(
        spec, image, limits=limits, home_id=home_id, user=user, state=volume, command=command, role=role,
        runtime=runtime,
    )  # fmt: skip
    return docker_argv(plan, docker_bin)


def docker_argv(plan: BoxPlan, docker_bin: str = "docker") -> list[str]:
    """A plan as ``docker run`` flags: the lockdown every box gets, then what the plan says."""
    limits = plan.limits
    argv = [
        docker_bin, "run", "-i", "--rm", "--init",
        *(["--runtime", plan.runtime] if plan.runtime else []),
        "--name", plan.name,
        "--network", "none",
        "--read-only",
        "--tmpfs", f"/tmp:rw,nosuid,nodev,noexec,size={limits.tmpfs_size}",
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--pids-limit", str(limits.pids_limit),
        "--memory", limits.memory,
        "--memory-swap", limits.memory,
        "--cpus", f"{limits.cpus:g}",
        "--ulimit", f"nofile={limits.nofile}:{limits.nofile}",
        "--ulimit", f"fsize={limits.state_quota.max_bytes}:{limits.state_quota.max_bytes}",
        "--user", plan.user,
        "--log-driver", "none",
        *(arg for key, value in plan.labels.items() for arg in ("--label", f"{key}={value}")),
        "--mount", f"type=bind,source={plan.state.path},target={STATE_MOUNT}",
        *(arg for key, value in plan.env.items() for arg in ("--env", f"{key}={value}")),
    ]  # fmt: skip
    if plan.command:
        argv += ["--entrypoint", plan.command[0], plan.image, *plan.command[1:]]
    else:
        argv.append(plan.image)
    return argv


class DockerBackend:
    name = "docker"

    def __init__(
        self,
        image: str | None = None,
        *,
        limits: DockerLimits | None = None,
        home_id: str | None = None,
        role: str = "session",
        runtime: str | RuntimeChoice = "auto",
        state_root: StateRoot | None = None,
    ) -> None:
        """``runtime``: the imp's ``[box] runtime`` (``IMPYARD_BOX_RUNTIME``, when set, overrides it), or a
        ``RuntimeChoice`` already made (the environment is then not read). ``state_root``: under which every
        box's /state must lie (None: ``IMPYARD_STATE_ROOT``, read at each start, else IMPYARD_HOME/imps)."""
        self.state_root = state_root
        self._image = image
        self.role = role
        self.runtime_choice = runtime if isinstance(runtime, RuntimeChoice) else runtime_choice(runtime)
        self._runtime: str | None = None
        self.limits = limits or DockerLimits()
        self.home_id = home_id or paths.home_id()
        self._client: docker.DockerClient | None = None
        self._engine = Engine()
        self._checked = False

    @property
    def lockdown(self) -> tuple[object, ...]:
        """What its boxes are — image, limits, runtime, home and state root — whatever role label they carry: two
        backends with the same lockdown start the same box (issue 37: a task may run on a spare box that the
        session manager's backend started, ``impyard.conversation.spares.same_lockdown``). The image as it was
        given (None: the current box sources' own, not hashed here, on the event loop)."""
        return ("docker", self._image, self.limits, self.runtime_choice, self.home_id, self.state_root)

    @property
    def image(self) -> str:
        if self._image is None:
            from impyard.backends.image import expected_tag

            self._image = expected_tag()
        return self._image

    # ------------------------------------------------------------ preflight (fail closed)

    @property
    def runtime(self) -> str:
        """The OCI runtime this backend's boxes run under (issue 22), from the setting and the engine's
        registered runtimes; a ``BoxStartError`` when the setting asks for one the engine lacks."""
        if self._runtime is None:
            registered = self.client().info().get("Runtimes") or {}
            self._runtime = resolve_runtime(self.runtime_choice, set(registered))
        return self._runtime

    @property
    def resolved_runtime(self) -> str | None:
        """The runtime once known (the first box's preflight resolved it), without asking the engine: None before."""
        return self._runtime

    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                client = docker.from_env(timeout=DOCKER_API_TIMEOUT_S)
                client.ping()
            except docker.errors.DockerException as exc:
                raise BoxStartError(
                    f"the Docker engine is not reachable ({_short(exc)}): start dockerd "
                    "(or install docker.io), or choose the process backend for development"
                ) from exc
            self._client = client
        return self._client

    def preflight(self) -> None:
        """Refuse to start anything unless every lockdown flag can be applied."""
        if self._checked:
            return
        client = self.client()
        info = client.info()
        for feature, flag in _REQUIRED_ENGINE_FEATURES.items():
            if info.get(feature) is False:
                raise BoxStartError(
                    f"the Docker engine cannot apply {flag} ({feature} is off in `docker info`); "
                    "refusing to start an unconfined box: enable the cgroup controller (e.g. swapaccount=1)"
                )
        self._runtime = resolve_runtime(self.runtime_choice, set(info.get("Runtimes") or {}))
        try:
            client.images.get(self.image)
        except docker.errors.ImageNotFound as exc:
            raise BoxStartError(f"the box image {self.image} is not built: run `impyard box build`") from exc
        self._checked = True

    # ------------------------------------------------------------ lifecycle

    def kill_by_name(self, name: str) -> None:
        try:
            self.client().containers.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress (--rm)
                raise

    def inspect_box(self, spec: BoxSpec) -> dict[str, Any]:
        """The engine's record of a running box (``docker inspect``): what it applied, seen from outside."""
        attrs: dict[str, Any] = self.client().containers.get(container_name(spec)).attrs
        return attrs

    def labelled(self, **labels: str) -> list[Container]:
        filters = [f"{LABEL_BOX}=1", f"{LABEL_HOME}={self.home_id}"]
        filters += [f"org.impyard.{key}={value}" for key, value in labels.items()]
        # ignore_removed: a box that ends between the listing and its inspection (a session closing, a spare
        # drained) is simply not listed, instead of failing the whole listing with NotFound
        return self.client().containers.list(all=True, filters={"label": filters}, ignore_removed=True)

    def remove_orphans(self) -> int:
        """Remove this home's boxes of this role left by a supervisor that died; returns how many."""
        removed = 0
        for container in self.labelled(role=self.role):
            log.warning("removing orphaned box %s", container.name)
            self.kill_by_name(container.name or container.short_id)  # a listed container has a name
            removed += 1
        return removed

    def prepare_state_dir(self, state_dir: Path, user: str) -> None:
        """The state dir belongs to the box user and is private; refuse a start when it is over its quota.

        Blocking (it may repair ownership once, or count a large dir): ``open`` runs it in a worker thread.
        """
        uid, gid = (int(part) for part in user.split(":"))
        try:
            prepare_state_dir(state_dir, uid, gid)
            over = measure_state_dir(state_dir, self.limits.state_quota).over(self.limits.state_quota)
        except OSError as exc:  # e.g. a link in the state dir's place: never followed, never started
            raise BoxStartError(
                f"the state dir {state_dir} cannot be prepared ({exc.strerror or exc}): check it by hand"
            ) from exc
        if over:
            raise BoxStartError(
                f"the state dir {state_dir} holds {over}: free space in it, or raise [box] state_quota in imp.toml"
            )

    @asynccontextmanager
    async def open(
        self, spec: BoxSpec, host: BoxHost, *, command: list[str] | None = None
    ) -> AsyncIterator[RunningBox]:
        # Issue 21: the box's /state is a name under the state root, or no box starts.
        volume = (self.state_root or state_root()).volume(spec.state_dir)
        # Issue 22: claimed before the state dir is touched; refused while a running box's /state overlaps it.
        async with (
            claimed_mount(spec, mount=volume.path),
            self._open_claimed(spec, host, command, volume) as running,
        ):
            yield running

    @asynccontextmanager
    async def _open_claimed(
        self, spec: BoxSpec, host: BoxHost, command: list[str] | None, volume: StateVolume
    ) -> AsyncIterator[RunningBox]:
        await in_thread(self.preflight)
        user = box_user()
        await in_thread(self.prepare_state_dir, volume.path, user)
        name = container_name(spec)
        argv = run_argv(
            spec,
            self.image,
            limits=self.limits,
            home_id=self.home_id,
            user=user,
            command=command,
            role=self.role,
            runtime=self.runtime,
            state=volume,
        )
        log.info(
            "box %s/%s starting as %s under runtime %s (asked: %s)",
            spec.imp, spec.channel_id, name, runtime_words(self.runtime), self.runtime_choice.describe(),
        )  # fmt: skip
        request = create_request(argv)  # a flag with no API field is refused here, before anything starts
        try:
            process = await self._engine.run_attached(request)
        except EngineError as exc:
            raise _start_error(exc, self.image) from exc

        async def terminate() -> None:
            await process.remove()  # nothing to do once the engine has removed it (--rm)

        async with supervise_process(
            spec, process, host, terminate, state_quota=self.limits.state_quota, state_dir=volume.path
        ) as running:
            yield running


def _start_error(exc: EngineError, image: str) -> BoxStartError:
    if exc.status == 404 and "image" in exc.message.lower():
        return BoxStartError(f"the box image {image} is not built: run `impyard box build`")
    return BoxStartError(
        f"the Docker engine did not start the box ({exc.message}): refusing to run it otherwise"
    )


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
