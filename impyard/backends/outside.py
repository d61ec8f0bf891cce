"""What the host sees of a running Docker box (issue 22): the engine's record of it (``docker inspect``) and
what the host's kernel applies to it (its cgroup, and NoNewPrivs of its process on the host).

Under gVisor a box cannot see its own cgroups, so ``impyard box check`` confirms the limits from here.
Reading only. The keys of the cgroup limits are those of the box's own report (``box.probe``), so one rule
(``impyard.backends.lockdown``) judges both sides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from box.protocol.models import ReportValue

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")

# report key: (cgroup v1 controller, its file, the cgroup v2 file)
CGROUP_LIMITS = {
    "pids_limit": ("pids", "pids.max", "pids.max"),
    "memory_limit": ("memory", "memory.limit_in_bytes", "memory.max"),
    "memory_swap_limit": ("memory", "memory.memsw.limit_in_bytes", "memory.swap.max"),
    "cpu_quota": ("cpu", "cpu.cfs_quota_us", "cpu.max"),
}
UNIFIED = ""  # the cgroup v2 hierarchy's "controller"


def observe_outside(
    attrs: dict[str, Any], *, proc_root: Path = PROC, cgroup_root: Path = CGROUP
) -> dict[str, ReportValue]:
    """The box as the host sees it: ``engine_*`` and the other HostConfig fields are what Docker recorded;
    ``no_new_privs`` and the cgroup limits are what the host's kernel holds (None: the host cannot see them,
    e.g. when impyard runs in another pid namespace or without the host's cgroup filesystem)."""
    host = attrs.get("HostConfig") or {}
    container_id = str(attrs.get("Id") or "")
    pid = int((attrs.get("State") or {}).get("Pid") or 0)
    lines = _own_cgroup_lines(proc_root, pid, container_id)
    report: dict[str, ReportValue] = {
        "runtime": host.get("Runtime"),
        "network_mode": host.get("NetworkMode"),
        "readonly_rootfs": host.get("ReadonlyRootfs"),
        "cap_drop": ",".join(host.get("CapDrop") or []),
        "cap_add": ",".join(host.get("CapAdd") or []),
        "security_opt": ",".join(host.get("SecurityOpt") or []),
        "user": (attrs.get("Config") or {}).get("User"),
        "engine_pids_limit": host.get("PidsLimit"),
        "engine_memory": host.get("Memory"),
        "engine_memory_swap": host.get("MemorySwap"),
        "engine_nano_cpus": host.get("NanoCpus"),
        "engine_cpu_quota": host.get("CpuQuota"),
        "engine_file_size_limit": _ulimit(host, "fsize"),
        "host_pid": pid or None,
        # the box's process on the host (runc) or its sandbox's (runsc): only when it is this container's
        "no_new_privs": _status_field(proc_root, pid, "NoNewPrivs") if lines else None,
    }
    dirs = _cgroup_dirs(lines, container_id, cgroup_root)
    report["cgroup"] = str(dirs.get("pids") or dirs.get(UNIFIED) or "") or None
    for key, (controller, v1_file, v2_file) in CGROUP_LIMITS.items():
        report[key] = _read(dirs, controller, v1_file, v2_file)
    return report


def _ulimit(host: dict[str, Any], name: str) -> int | None:
    for limit in host.get("Ulimits") or []:
        if limit.get("Name") == name:
            return int(limit.get("Hard", 0))
    return None


def _status_field(proc_root: Path, pid: int, name: str) -> int | None:
    try:
        for line in (proc_root / str(pid) / "status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == name and value.strip().isdigit():
                return int(value.strip())
    except OSError:
        return None
    return None


def _own_cgroup_lines(proc_root: Path, pid: int, container_id: str) -> list[str]:
    """The host pid's cgroup lines, only when they name this container (else the pid is not its: another
    pid namespace, or a pid reused)."""
    if not pid or not container_id:
        return []
    try:
        lines = (proc_root / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return []
    return lines if any(container_id in line for line in lines) else []


def _cgroup_dirs(lines: list[str], container_id: str, cgroup_root: Path) -> dict[str, Path]:
    """Each controller's cgroup dir of the container on the host (cgroup v1: per controller; v2: UNIFIED),
    from its process's cgroup lines, else where Docker puts a container's cgroup by default."""
    dirs: dict[str, Path] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if container_id not in path:
            continue  # e.g. runsc's v2 line is "0::/" on a v1 host
        names = controllers.split(",") if controllers else [UNIFIED]
        for name in names:
            for mount in (cgroup_root / controllers, cgroup_root / name):
                candidate = mount / path.lstrip("/") if controllers else cgroup_root / path.lstrip("/")
                if candidate.is_dir():
                    dirs.setdefault(name, candidate)
                    break
    if not dirs and container_id:
        for name in ("pids", "memory", "cpu"):
            if (candidate := cgroup_root / name / "docker" / container_id).is_dir():
                dirs[name] = candidate
        for path in (f"system.slice/docker-{container_id}.scope", f"docker/{container_id}"):
            if (candidate := cgroup_root / path).is_dir():
                dirs.setdefault(UNIFIED, candidate)
    return dirs


def _read(dirs: dict[str, Path], controller: str, v1_file: str, v2_file: str) -> str | None:
    for directory, name in ((dirs.get(controller), v1_file), (dirs.get(UNIFIED), v2_file)):
        if directory is None:
            continue
        try:
            return (directory / name).read_text().strip()
        except OSError:
            continue
    return None
