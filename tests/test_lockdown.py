"""The lockdown rule from both sides (issue 22): a property passes when one side confirms it and no side shows
it missing; one neither side can confirm fails. And what the host reads of a box from outside: the engine's
record and the box's cgroup (v1 and v2), only when the process it reads is really the box's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from box.protocol.models import ReportValue
from impyard.backends.lockdown import NOT_ASKED, LockdownCheck, Side, evaluate, evaluate_outside, judge
from impyard.backends.outside import observe_outside

MIB = 1024**2
CID = "c0ffee" * 10 + "abcd"


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize(
    ("inside", "outside", "ok", "confirmed_by"),
    [
        (True, None, True, "inside"),
        (None, True, True, "outside"),  # gVisor: the box cannot see it, the host can
        (True, True, True, "both"),
        (None, None, False, ""),  # neither side can confirm: a failure, never waved through
        (True, False, False, ""),  # the host sees it missing
        (False, True, False, ""),  # the box sees it missing
        (False, None, False, ""),
        (None, False, False, ""),
    ],
)
def test_one_side_confirms_and_none_denies(
    inside: bool | None, outside: bool | None, ok: bool, confirmed_by: str
) -> None:
    check = judge("pids limit", "128 processes", Side(inside, "in"), Side(outside, "out"))
    assert (check.ok, check.confirmed_by, check.observed, check.outside) == (ok, confirmed_by, "in", "out")


# What a confined box shows of itself under each runtime, and what the host shows of it.
RUNC_INSIDE: dict[str, ReportValue] = {
    "uid": 10001, "interfaces": "lo", "can_route_out": False, "root_writable": False, "state_writable": True,
    "cap_eff": 0, "no_new_privs": 1, "pids_limit": "128", "memory_limit": str(512 * MIB),
    "memory_swap_limit": str(512 * MIB), "cpu_quota": "100000", "file_size_limit": 256 * MIB,
    "kernel": "6.1.0-test #1 SMP", "kernel_log": None,
}  # fmt: skip
RUNSC_INSIDE: dict[str, ReportValue] = {
    **RUNC_INSIDE, "pids_limit": None, "memory_limit": None, "memory_swap_limit": None, "cpu_quota": None,
    "kernel": "4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016", "kernel_log": "[    0.000000] Starting gVisor...",
}  # fmt: skip
OUTSIDE: dict[str, ReportValue] = {
    "runtime": "runsc", "network_mode": "none", "readonly_rootfs": True, "cap_drop": "ALL", "cap_add": "",
    "security_opt": "no-new-privileges", "user": "10001:10001", "engine_pids_limit": 128,
    "engine_memory": 512 * MIB, "engine_memory_swap": 512 * MIB, "engine_nano_cpus": 10**9,
    "engine_cpu_quota": 0, "engine_file_size_limit": 256 * MIB, "no_new_privs": 1, "pids_limit": "128",
    "memory_limit": str(512 * MIB), "memory_swap_limit": str(512 * MIB), "cpu_quota": "100000",
}  # fmt: skip
HIDDEN_BY_GVISOR = {"pids limit", "memory limit", "no swap beyond memory", "cpu quota"}


def checks(
    inside: dict[str, ReportValue], outside: dict[str, ReportValue] | None, runtime: str | None = "runsc"
) -> dict[str, LockdownCheck]:
    found = evaluate(
        inside, memory="512m", pids_limit=128, state_quota_bytes=256 * MIB, outside=outside,
        runtime=runtime, host_kernel="6.1.0-test",
    )  # fmt: skip
    return {check.name: check for check in found}


def failed(
    inside: dict[str, ReportValue], outside: dict[str, ReportValue] | None, runtime: str = "runsc"
) -> set[str]:
    return {name for name, check in checks(inside, outside, runtime).items() if not check.ok}


def test_a_confined_box_passes_under_each_runtime() -> None:
    assert failed(RUNSC_INSIDE, OUTSIDE) == set()
    assert failed(RUNC_INSIDE, {**OUTSIDE, "runtime": "runc"}, "runc") == set()
    shown = checks(RUNSC_INSIDE, OUTSIDE)
    assert {shown[name].confirmed_by for name in HIDDEN_BY_GVISOR} == {"outside"}
    assert shown["pids limit"].outside == "engine: 128 processes; cgroup: 128 processes"


def test_under_gvisor_the_limits_fail_when_the_host_cannot_see_them() -> None:
    assert failed(RUNSC_INSIDE, None) == HIDDEN_BY_GVISOR  # nothing from outside
    unseen = {
        **OUTSIDE,
        "pids_limit": None,
        "memory_limit": None,
        "memory_swap_limit": None,
        "cpu_quota": None,
    }
    assert failed(RUNSC_INSIDE, unseen) == HIDDEN_BY_GVISOR  # the engine's word alone confirms nothing
    assert "cgroup: not visible from here" in checks(RUNSC_INSIDE, unseen)["pids limit"].outside


@pytest.mark.parametrize(
    ("outside", "missing"),
    [
        ({"engine_pids_limit": 0, "pids_limit": "max"}, "pids limit"),
        ({"pids_limit": "max"}, "pids limit"),  # the engine recorded it, the kernel does not hold it
        (
            {"engine_memory": 0, "engine_memory_swap": -1, "memory_limit": "9223372036854771712"},
            "memory limit",
        ),
        ({"engine_memory_swap": 1024 * MIB, "memory_swap_limit": str(1024 * MIB)}, "no swap beyond memory"),
        ({"engine_nano_cpus": 0, "cpu_quota": "-1"}, "cpu quota"),
        ({"security_opt": "", "no_new_privs": 1}, "no new privileges"),
        ({"no_new_privs": 0}, "no new privileges"),
        ({"network_mode": "bridge"}, "no network"),
        ({"readonly_rootfs": False}, "read-only root"),
        ({"cap_drop": "", "cap_add": ""}, "no capabilities"),
        ({"user": ""}, "non-root user"),
        ({"engine_file_size_limit": None}, "file size limit"),
        ({"runtime": "runc"}, "runtime"),
    ],
)
def test_a_limit_missing_outside_fails_even_when_the_box_cannot_tell(
    outside: dict[str, ReportValue], missing: str
) -> None:
    assert missing in failed(RUNSC_INSIDE, {**OUTSIDE, **outside})


@pytest.mark.parametrize(
    ("inside", "missing"),
    [
        ({"pids_limit": "max"}, "pids limit"),
        ({"memory_limit": "max"}, "memory limit"),  # (and memory+swap is then more than memory)
        ({"memory_swap_limit": str(1024 * MIB)}, "no swap beyond memory"),
        ({"cpu_quota": "-1"}, "cpu quota"),
        ({"no_new_privs": 0}, "no new privileges"),
        ({"kernel_log": "[0.0] Starting gVisor..."}, "runtime"),  # runc asked for, gVisor answered
        ({"kernel": "5.10.0-other #1"}, "runtime"),  # not the host's own kernel
        ({"kernel": None}, None),  # not reported: the host's HostConfig.Runtime confirms it
    ],
)
def test_under_runc_a_limit_the_box_sees_missing_fails(
    inside: dict[str, ReportValue], missing: str | None
) -> None:
    found = failed({**RUNC_INSIDE, **inside}, {**OUTSIDE, "runtime": "runc"}, "runc")
    assert missing in found if missing else found == set()


def test_gvisor_asked_for_but_not_in_force_fails() -> None:
    assert "runtime" in failed({**RUNSC_INSIDE, "kernel_log": None, "kernel": "6.1.0-test #1"}, OUTSIDE)


def test_the_process_backend_has_no_outside_and_no_runtime_row() -> None:
    shown = checks({**RUNC_INSIDE, "interfaces": "eth0,lo"}, None, runtime=None)
    assert "runtime" not in shown and shown["no network"].outside == "–"
    assert not shown["no network"].ok and shown["pids limit"].ok  # the inside alone decides


def outside_only(
    outside: dict[str, ReportValue] | None, runtime: str | None = "runsc"
) -> dict[str, LockdownCheck]:
    found = evaluate_outside(
        outside, memory="512m", pids_limit=128, state_quota_bytes=256 * MIB, runtime=runtime,
        host_kernel="6.1.0-test",
    )  # fmt: skip
    return {check.name: check for check in found}


def test_an_unclaimed_spare_is_judged_on_the_hosts_view_alone() -> None:
    """Issue 37: a spare before its claim runs no task; the same rules judge what the host sees of it."""
    shown = outside_only(OUTSIDE)
    inside_only = {"state mount writable"}  # the host cannot see it
    assert set(shown) == set(checks(RUNSC_INSIDE, OUTSIDE)) - inside_only
    assert all(c.ok and c.confirmed_by == "outside" and c.observed == NOT_ASKED for c in shown.values())
    for outside, missing in [
        ({"network_mode": "bridge"}, {"no network", "no route out"}),
        ({"pids_limit": "max"}, {"pids limit"}),
        ({"pids_limit": None}, {"pids limit"}),  # the engine's word alone confirms nothing
        ({"runtime": "runc"}, {"runtime"}),
    ]:
        assert {n for n, c in outside_only({**OUTSIDE, **outside}).items() if not c.ok} == missing, outside
    # The process backend: nothing to look at, nothing confirmed.
    assert not any(check.ok for check in outside_only(None, runtime=None).values())


# ------------------------------------------------------------------ what the host reads from outside


def _attrs(pid: int, runtime: str = "runsc") -> dict[str, Any]:
    return {
        "Id": CID,
        "State": {"Pid": pid},
        "Config": {"User": "10001:10001"},
        "HostConfig": {
            "Runtime": runtime, "NetworkMode": "none", "ReadonlyRootfs": True, "CapDrop": ["ALL"],
            "CapAdd": None, "SecurityOpt": ["no-new-privileges"], "PidsLimit": 128, "Memory": 512 * MIB,
            "MemorySwap": 512 * MIB, "NanoCpus": 10**9, "CpuQuota": 0,
            "Ulimits": [{"Name": "nofile", "Hard": 1024, "Soft": 1024}, {"Name": "fsize", "Hard": 256 * MIB, "Soft": 256 * MIB}],
        },
    }  # fmt: skip


def _proc(root: Path, pid: int, cgroup_lines: list[str], nnp: int = 1) -> Path:
    (root / "proc" / str(pid)).mkdir(parents=True)
    (root / "proc" / str(pid) / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    (root / "proc" / str(pid) / "status").write_text(f"Name:\texe\nNoNewPrivs:\t{nnp}\nSeccomp:\t2\n")
    return root / "proc"


def _files(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text + "\n")


def test_cgroup_v1_limits_are_read_where_the_boxs_process_says(tmp_path: Path) -> None:
    lines = [f"8:pids:/docker/{CID}", f"4:memory:/docker/{CID}", f"1:cpu,cpuacct:/docker/{CID}", "0::/"]
    proc = _proc(tmp_path, 4242, lines)
    cgroup = tmp_path / "cgroup"
    _files(cgroup / "pids" / "docker" / CID, {"pids.max": "128"})
    _files(cgroup / "memory" / "docker" / CID, {"memory.limit_in_bytes": "536870912", "memory.memsw.limit_in_bytes": "536870912"})  # fmt: skip
    _files(cgroup / "cpu,cpuacct" / "docker" / CID, {"cpu.cfs_quota_us": "100000"})
    seen = observe_outside(_attrs(4242), proc_root=proc, cgroup_root=cgroup)
    assert (seen["pids_limit"], seen["memory_limit"], seen["memory_swap_limit"], seen["cpu_quota"]) == (
        "128", "536870912", "536870912", "100000",
    )  # fmt: skip
    assert (seen["runtime"], seen["no_new_privs"], seen["engine_file_size_limit"]) == ("runsc", 1, 256 * MIB)
    assert failed(RUNSC_INSIDE, seen) == set()


def test_cgroup_v2_limits_are_read_from_the_unified_hierarchy(tmp_path: Path) -> None:
    proc = _proc(tmp_path, 77, [f"0::/system.slice/docker-{CID}.scope"])
    unified = tmp_path / "cgroup" / "system.slice" / f"docker-{CID}.scope"
    _files(unified, {"pids.max": "128", "memory.max": "536870912", "memory.swap.max": "0", "cpu.max": "100000 100000"})  # fmt: skip
    seen = observe_outside(_attrs(77), proc_root=proc, cgroup_root=tmp_path / "cgroup")
    assert (seen["pids_limit"], seen["memory_swap_limit"], seen["cpu_quota"]) == ("128", "0", "100000 100000")
    assert failed(RUNSC_INSIDE, seen) == set()
    _files(unified, {"cpu.max": "max 100000"})
    assert failed(
        RUNSC_INSIDE, observe_outside(_attrs(77), proc_root=proc, cgroup_root=tmp_path / "cgroup")
    ) == {"cpu quota"}


def test_a_pid_that_is_not_the_boxs_is_never_read(tmp_path: Path) -> None:
    """Another pid namespace, or a pid reused: its NoNewPrivs and cgroup say nothing about the box."""
    proc = _proc(tmp_path, 4242, ["8:pids:/docker/someone-else", "0::/user.slice"], nnp=1)
    _files(tmp_path / "cgroup" / "pids" / "user.slice", {"pids.max": "128"})
    seen = observe_outside(_attrs(4242), proc_root=proc, cgroup_root=tmp_path / "cgroup")
    assert (seen["no_new_privs"], seen["pids_limit"]) == (None, None)
    assert failed(RUNSC_INSIDE, seen) == HIDDEN_BY_GVISOR  # the engine's record alone confirms nothing


def test_without_the_boxs_process_the_default_cgroup_path_is_read(tmp_path: Path) -> None:
    _files(tmp_path / "cgroup" / "pids" / "docker" / CID, {"pids.max": "128"})
    seen = observe_outside(_attrs(0), proc_root=tmp_path / "proc", cgroup_root=tmp_path / "cgroup")
    assert seen["pids_limit"] == "128" and seen["no_new_privs"] is None
