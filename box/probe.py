"""What the box observes about its own confinement (``task.run`` kind ``probe``).

``impyard box check`` compares these observations with the lockdown of
docs/box.md. Reading only: the probe changes nothing and sends no packet.
Under gVisor (runsc) some of them are not visible (its own cgroups, /sys/class/net,
NoNewPrivs in /proc): the probe asks the kernel another way where one exists
(``prctl``, ``if_nameindex``) and reports None where none does; the host looks
from outside (issue 22).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import resource
import socket
import sys
import tempfile
from pathlib import Path

from box.protocol.models import ReportValue

_CGROUP_FILES = {
    # name: (cgroup v1 path, cgroup v2 path)
    "pids_limit": ("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"),
    "memory_limit": ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"),
    "memory_swap_limit": (
        "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes",
        "/sys/fs/cgroup/memory.swap.max",
    ),
    "cpu_quota": ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu.max"),
}


def _status_field(name: str) -> str | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == name:
                return value.strip()
    except OSError:
        return None
    return None


def _read_first(*paths: str) -> str | None:
    for path in paths:
        try:
            return Path(path).read_text().strip()
        except OSError:
            continue
    return None


def _writable(directory: str) -> bool:
    try:
        with tempfile.NamedTemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def _can_route_out() -> bool:
    """True if an outside address is routable. A UDP connect sends no packet."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1, never a real host
        except OSError as exc:
            return exc.errno not in (errno.ENETUNREACH, errno.EHOSTUNREACH)
    return True


PR_GET_NO_NEW_PRIVS = 39
SYSLOG_ACTION_READ_ALL = 3
KERNEL_LOG_BYTES = 4096


def _no_new_privs() -> int | None:
    """NoNewPrivs from /proc/self/status, else from the kernel itself (gVisor's /proc omits the field)."""
    shown = _status_field("NoNewPrivs")
    if shown:
        return int(shown)
    try:
        answer = int(ctypes.CDLL(None, use_errno=True).prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0))
    except (OSError, AttributeError):
        return None
    return answer if answer in (0, 1) else None


def _interfaces() -> str | None:
    """The network interfaces this box has, comma-separated (gVisor has no /sys/class/net)."""
    try:
        return ",".join(sorted(os.listdir("/sys/class/net")))
    except OSError:
        pass
    try:
        return ",".join(sorted(name for _index, name in socket.if_nameindex()))
    except OSError:
        return None


def _kernel_log_head() -> str | None:
    """The kernel log's first line, where the kernel lets a box read it: gVisor's says "Starting gVisor...";
    under runc the host's kernel refuses (no CAP_SYSLOG, seccomp), and the box reports None."""
    buffer = ctypes.create_string_buffer(KERNEL_LOG_BYTES)
    try:
        size = int(
            ctypes.CDLL(None, use_errno=True).klogctl(SYSLOG_ACTION_READ_ALL, buffer, KERNEL_LOG_BYTES)
        )
    except (OSError, AttributeError):
        return None
    if size <= 0:
        return None
    lines = buffer.raw[:size].decode("utf-8", "replace").splitlines()
    return lines[0][:200] if lines else None


def _file_size_limit() -> int | None:
    """The largest file this box may write (RLIMIT_FSIZE), in bytes; None when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


STATE_ENTRIES_SHOWN = 16
STATE_NAME_CHARS = 64


def _state_entries(state_dir: Path) -> str | None:
    """Some names in /state (at most 16, each cut to 64 characters), sorted: a claimed spare shows the channel's
    files there (issue 37). Bounded work and output, whatever the dir holds."""
    try:
        with os.scandir(state_dir) as entries:
            names = [
                entry.name[:STATE_NAME_CHARS] for entry in itertools.islice(entries, STATE_ENTRIES_SHOWN)
            ]
    except OSError:
        return None
    return ",".join(sorted(names))


def observe(state_dir: Path) -> dict[str, ReportValue]:
    cap_eff = _status_field("CapEff")
    uname = os.uname()
    report: dict[str, ReportValue] = {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "python": sys.version.split()[0],
        "kernel": f"{uname.release} {uname.version}",
        "kernel_log": _kernel_log_head(),
        "interfaces": _interfaces(),
        "can_route_out": _can_route_out(),
        "root_writable": _writable("/"),
        "tmp_writable": _writable(tempfile.gettempdir()),
        "state_dir": str(state_dir),
        "state_writable": state_dir.is_dir() and _writable(str(state_dir)),
        "state_entries": _state_entries(state_dir),
        "cap_eff": int(cap_eff, 16) if cap_eff else None,
        "no_new_privs": _no_new_privs(),
        "file_size_limit": _file_size_limit(),
    }
    for name, paths in _CGROUP_FILES.items():
        report[name] = _read_first(*paths)
    return report
