"""A ``docker run`` command line as the Engine API's create request (issue 18): the box's lockdown is written
once, as ``run_argv``'s flags, and the backend creates exactly that container through the engine's socket.

Each flag maps to the field the docker CLI fills for it (``docker create`` is the oracle the tests compare
against). A flag this table does not know is a ``BoxStartError``: a lockdown flag is never dropped on the
way. Pure: a list of strings in, a request out.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from impyard.backends.base import BoxStartError

_RAM = re.compile(r"^(\d+(?:\.\d+)?) ?([kKmMgGtTpP])?[iI]?[bB]?$")  # the CLI's RAMInBytes
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


@dataclass
class CreateRequest:
    """``POST /containers/create?name=<name>`` with ``body``; ``interactive``: ``-i`` (attach stdin, stdout
    and stderr; stdin closes when the attached client closes it)."""

    name: str | None
    body: dict[str, Any] = field(default_factory=dict)
    interactive: bool = False

    @property
    def host_config(self) -> dict[str, Any]:
        config: dict[str, Any] = self.body.setdefault("HostConfig", {})
        return config


def ram_bytes(text: str) -> int:
    """A size as the docker CLI reads ``--memory`` (binary units: ``512m`` is 512 MiB)."""
    match = _RAM.match(text.strip())
    if match is None:
        raise BoxStartError(f"cannot read the size {text!r} of a box limit")
    return int(float(match[1]) * _UNITS[(match[2] or "").lower()])


def _ulimit(text: str) -> dict[str, Any]:
    name, _, limits = text.partition("=")
    soft, _, hard = limits.partition(":")
    try:
        return {"Name": name, "Soft": int(soft), "Hard": int(hard or soft)}
    except ValueError:
        raise BoxStartError(f"cannot read the ulimit {text!r}") from None


_MOUNT_KEYS = {"type": "Type", "source": "Source", "src": "Source", "target": "Target", "dst": "Target",
               "destination": "Target", "readonly": "ReadOnly", "ro": "ReadOnly"}  # fmt: skip


def _mount(text: str) -> dict[str, Any]:
    """``--mount type=bind,source=…,target=…[,readonly]`` as a HostConfig mount."""
    mount: dict[str, Any] = {}
    for part in text.split(","):
        key, has_value, value = part.partition("=")
        field_name = _MOUNT_KEYS.get(key.strip().lower())
        if field_name is None:
            raise BoxStartError(f"the mount option {key!r} of {text!r} has no Engine API field here")
        if field_name == "ReadOnly":
            mount[field_name] = not has_value or value.strip().lower() in ("1", "true")
        else:
            mount[field_name] = value
    if not mount.get("Target"):
        raise BoxStartError(f"the mount {text!r} names no target")
    mount.setdefault("Type", "volume")  # the CLI's default
    return mount


def _set(path: str, convert: Callable[[str], Any] = str) -> Callable[[CreateRequest, str], None]:
    section, key = path.split(".")

    def apply(request: CreateRequest, value: str) -> None:
        target = request.host_config if section == "HostConfig" else request.body
        target[key] = convert(value)

    return apply


def _append(path: str, convert: Callable[[str], Any] = str) -> Callable[[CreateRequest, str], None]:
    section, key = path.split(".")

    def apply(request: CreateRequest, value: str) -> None:
        target = request.host_config if section == "HostConfig" else request.body
        target.setdefault(key, []).append(convert(value))

    return apply


def _name(request: CreateRequest, value: str) -> None:
    request.name = value


def _tmpfs(request: CreateRequest, value: str) -> None:
    path, _, options = value.partition(":")
    request.host_config.setdefault("Tmpfs", {})[path] = options


def _label(request: CreateRequest, value: str) -> None:
    key, _, text = value.partition("=")
    request.body.setdefault("Labels", {})[key] = text


def _log_driver(request: CreateRequest, value: str) -> None:
    request.host_config["LogConfig"] = {"Type": value, "Config": {}}


def _entrypoint(request: CreateRequest, value: str) -> None:
    request.body["Entrypoint"] = [value]


def _cpus(value: str) -> int:
    try:
        return round(float(value) * 1e9)
    except ValueError:
        raise BoxStartError(f"cannot read --cpus {value!r}") from None


def _interactive(request: CreateRequest) -> None:
    request.interactive = True
    request.body.update(
        AttachStdin=True, AttachStdout=True, AttachStderr=True, OpenStdin=True, StdinOnce=True
    )


# docker run flag → what it sets in the create request (the docker CLI's own mapping).
VALUED: dict[str, Callable[[CreateRequest, str], None]] = {
    "--name": _name,
    "--runtime": _set("HostConfig.Runtime"),
    "--network": _set("HostConfig.NetworkMode"),
    "--tmpfs": _tmpfs,
    "--cap-drop": _append("HostConfig.CapDrop"),
    "--cap-add": _append("HostConfig.CapAdd"),
    "--security-opt": _append("HostConfig.SecurityOpt"),
    "--pids-limit": _set("HostConfig.PidsLimit", int),
    "--memory": _set("HostConfig.Memory", ram_bytes),
    "--memory-swap": _set("HostConfig.MemorySwap", ram_bytes),
    "--cpus": _set("HostConfig.NanoCpus", _cpus),
    "--ulimit": _append("HostConfig.Ulimits", _ulimit),
    "--user": _set("Config.User"),
    "--log-driver": _log_driver,
    "--label": _label,
    "--mount": _append("HostConfig.Mounts", _mount),
    "--env": _append("Config.Env"),
    "--entrypoint": _entrypoint,
    "--workdir": _set("Config.WorkingDir"),
}
FLAGS: dict[str, Callable[[CreateRequest], None]] = {
    "-i": _interactive,
    "--interactive": _interactive,
    "--rm": lambda request: request.host_config.__setitem__("AutoRemove", True),
    "--init": lambda request: request.host_config.__setitem__("Init", True),
    "--read-only": lambda request: request.host_config.__setitem__("ReadonlyRootfs", True),
}


# What the docker CLI sends for every flag left unset, so the engine's record of a box is the CLI's to the byte.
CLI_DEFAULTS: dict[str, Any] = {
    "BlkioWeightDevice": [], "BlkioDeviceReadBps": [], "BlkioDeviceWriteBps": [], "BlkioDeviceReadIOps": [],
    "BlkioDeviceWriteIOps": [], "Devices": [], "Dns": [], "DnsOptions": [], "DnsSearch": [], "PortBindings": {},
    "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0},
}  # fmt: skip


def create_request(argv: list[str]) -> CreateRequest:
    """``[docker, run, <flags>…, image, args…]`` → the create request; ``BoxStartError`` on a flag it cannot map."""
    if len(argv) < 3 or argv[1] != "run":
        raise BoxStartError(f"not a docker run command line: {' '.join(argv[:3])}")
    request = CreateRequest(name=None, body={"HostConfig": copy.deepcopy(CLI_DEFAULTS)})
    at = 2
    while at < len(argv) and argv[at].startswith("-"):
        flag, inline, inline_value = argv[at].partition("=")
        if flag in FLAGS and not inline:
            FLAGS[flag](request)
            at += 1
        elif flag in VALUED:
            if inline:
                value, at = inline_value, at + 1
            elif at + 1 < len(argv):
                value, at = argv[at + 1], at + 2
            else:
                raise BoxStartError(f"the docker run flag {flag} has no value")
            VALUED[flag](request, value)
        else:
            raise BoxStartError(
                f"the docker run flag {argv[at]} has no Engine API field in impyard.backends.runflags: "
                "refusing to start a box without it (map it there)"
            )
    if at >= len(argv):
        raise BoxStartError("the docker run command line names no image")
    request.body["Image"] = argv[at]
    if argv[at + 1 :]:  # none: the image's own command (as the CLI leaves it)
        request.body["Cmd"] = argv[at + 1 :]
    request.body.setdefault("Tty", False)
    if "Ulimits" in request.host_config:  # the CLI keeps them by name
        request.host_config["Ulimits"].sort(key=lambda limit: limit["Name"])
    return request
