"""Which OCI runtime a Docker box runs under (issue 22): gVisor's ``runsc`` wherever the engine has it, else ``runc``.

Under ``runc`` a box shares the host's kernel: the lockdown narrows what it may ask of that kernel, but one
kernel bug still reaches the host. Under ``runsc`` a user-space kernel (gVisor) answers the box's system
calls. The setting is ``IMPYARD_BOX_RUNTIME`` (the operator's override) or the imp's ``[box] runtime``:
``auto`` (runsc when the engine has it registered), ``runsc`` (refuse to start a box without it) or ``runc``.
Pure functions over plain values; the Docker backend asks the engine which runtimes it has.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal, cast, get_args

from impyard.backends.base import BoxStartError

RuntimeSetting = Literal["auto", "runsc", "runc"]
RUNTIME_SETTINGS: tuple[str, ...] = get_args(RuntimeSetting)
RUNTIME_ENV = "IMPYARD_BOX_RUNTIME"
GVISOR = "runsc"
RUNC = "runc"
DAEMON_JSON = "/etc/docker/daemon.json"
# --platform=ptrace needs no KVM or nested virtualisation; --network=none: no network in the sandbox at all.
RUNSC_ARGS = ("--platform=ptrace", "--network=none")
DOCS = "docs/box.md#the-runtime-runc-or-gvisor"

RUNTIME_WORDS = {
    GVISOR: "gVisor, a user-space kernel",
    RUNC: "the host's kernel",
}


@dataclass(frozen=True)
class RuntimeChoice:
    """What was asked for, and where the ask came from (named in every error about it)."""

    setting: RuntimeSetting = "auto"
    source: str = "the default"

    def describe(self) -> str:
        return f"{self.setting} ({self.source})"


def runtime_choice(configured: str = "auto", environ: Mapping[str, str] | None = None) -> RuntimeChoice:
    """``IMPYARD_BOX_RUNTIME`` when set (the operator's override for every imp), else ``configured`` (the
    imp's ``[box] runtime``). A bad value of the variable is a ``BoxStartError`` naming it: no box starts."""
    raw = (os.environ if environ is None else environ).get(RUNTIME_ENV, "").strip()
    if raw:
        if raw not in RUNTIME_SETTINGS:
            raise BoxStartError(
                f"{RUNTIME_ENV} must be one of {', '.join(RUNTIME_SETTINGS)} (got {raw!r}): "
                f"fix it, or unset it to use each imp's [box] runtime"
            )
        return RuntimeChoice(cast(RuntimeSetting, raw), RUNTIME_ENV)
    if configured not in RUNTIME_SETTINGS:  # the config's own validation refuses it first
        raise BoxStartError(
            f"[box] runtime must be one of {', '.join(RUNTIME_SETTINGS)} (got {configured!r})"
        )
    source = "the default" if configured == "auto" else "[box] runtime"
    return RuntimeChoice(cast(RuntimeSetting, configured), source)


def daemon_json(runsc_path: str | None = None) -> str:
    """The daemon.json lines that register gVisor with dockerd (merged into any file already there)."""
    path = runsc_path or shutil.which(GVISOR) or f"/usr/bin/{GVISOR}"
    entry = {"runtimes": {GVISOR: {"path": path, "runtimeArgs": list(RUNSC_ARGS)}}}
    return json.dumps(entry)


def install_hint(runsc_path: str | None = None) -> str:
    """How to make runsc available to this engine, in one line."""
    return (
        f"apt-get install runsc, add {daemon_json(runsc_path)} to {DAEMON_JSON} (merged with what is there), "
        "then reload dockerd: kill -HUP $(pidof dockerd)"
    )


def resolve_runtime(choice: RuntimeChoice, registered: Collection[str]) -> str:
    """The runtime a box runs under, given the engine's registered runtimes (``docker info``: Runtimes).

    ``auto`` is runsc when the engine has it, else runc; an explicit runtime the engine lacks is a
    ``BoxStartError`` that says how to register it — never a quiet fallback to a weaker one."""
    wanted: str = choice.setting
    if wanted == "auto":
        wanted = GVISOR if GVISOR in registered else RUNC
    if wanted in registered:
        return wanted
    if wanted == GVISOR:
        raise BoxStartError(
            f"the box runtime runsc (gVisor) is asked for by {choice.source} but this Docker engine does not "
            f"have it registered: {install_hint()}; or set {RUNTIME_ENV}=runc"
        )
    have = ", ".join(sorted(registered)) or "none"
    raise BoxStartError(
        f"the box runtime {wanted} is asked for by {choice.source} but this Docker engine has only: {have}; "
        f"set {RUNTIME_ENV}=auto"
    )


def runtime_words(runtime: str) -> str:
    """The runtime and what answers a box's system calls under it: "runsc (gVisor, a user-space kernel)"."""
    return f"{runtime} ({RUNTIME_WORDS[runtime]})" if runtime in RUNTIME_WORDS else runtime
