"""Judge a box's lockdown (docs/box.md) from both sides: what the box observes from inside (``box.probe``)
and what the host sees from outside (``impyard.backends.outside``: the engine's record and the box's cgroup).

Under gVisor (runsc) a box does not see its own cgroups, so the limits are confirmed from outside; under
runc both sides see them. A side may confirm a property, show it missing, or not see it: a property passes
when at least one side confirms it and no side shows it missing — one that neither side can confirm fails,
never waved through (issue 22). Pure functions over the two reports, so the rule table is testable without
a box.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from box.protocol.models import ReportValue

_UNLIMITED = {None, "", "max", "-1", "9223372036854771712", "9223372036854775807"}
GVISOR_MARK = "gVisor"  # the first line of gVisor's kernel log: "Starting gVisor..."

NOT_REPORTED = "not reported"
NOT_LOOKED = "–"  # the process backend: nothing outside to look at
NOT_ASKED = "not asked (unclaimed)"  # a spare before its claim runs no task (issue 37)
# Properties the host cannot see: only the box's own view confirms them
SEEN_INSIDE_ONLY = frozenset({"state mount writable"})


@dataclass(frozen=True)
class Side:
    """What one side showed of a property: ``confirms`` True (it holds), False (it is missing), or None (this
    side cannot see it), and the observation in words that read on their own."""

    confirms: bool | None
    words: str


UNSEEN_OUTSIDE = Side(None, NOT_LOOKED)


@dataclass(frozen=True)
class LockdownCheck:
    """One lockdown property: what a confined box shows (``expected``), what this one showed from inside
    (``observed``) and what the host saw from outside (``outside``), in words ("read-only", "writable"),
    never a bare flag."""

    name: str
    ok: bool
    observed: str
    expected: str
    outside: str = NOT_LOOKED
    confirmed_by: str = ""  # "inside", "outside", "both"; "" when not confirmed


def judge(name: str, expected: str, inside: Side, outside: Side = UNSEEN_OUTSIDE) -> LockdownCheck:
    """At least one side confirms, and neither shows the property missing."""
    verdicts = (inside.confirms, outside.confirms)
    ok = True in verdicts and False not in verdicts
    by = (
        {(True, True): "both", (True, None): "inside", (None, True): "outside"}.get(verdicts, "")
        if ok
        else ""
    )
    return LockdownCheck(name, ok, inside.words, expected, outside.words, by)


# ------------------------------------------------------------------ reading values


def _size_bytes(text: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    text = text.strip().lower()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _limit(value: ReportValue) -> int | None:
    if value is None or str(value).strip() in _UNLIMITED:
        return None
    try:
        return int(str(value).split()[0])
    except ValueError:
        return None


def _quota_set(value: ReportValue) -> bool:
    """cgroup v1 ``cfs_quota_us`` ("100000", "-1") or v2 ``cpu.max`` ("100000 100000", "max 100000")."""
    words = str(value).split() if value is not None else []
    return bool(words) and words[0] not in _UNLIMITED


def _at_most(value: ReportValue, bound: int) -> bool:
    limit = _limit(value)
    return limit is not None and 0 < limit <= bound


def _flag(value: ReportValue, *, true: str, false: str) -> str:
    """A yes/no observation in words; anything else (an error text, nothing) as it came."""
    if value is True:
        return true
    if value is False:
        return false
    return NOT_REPORTED if value is None else str(value)


def _yes_no(value: ReportValue, *, good: bool) -> bool | None:
    """A flag that is ``good`` confirms, its opposite shows the property missing, anything else is unseen."""
    if isinstance(value, bool):
        return value is good
    return None


def _bytes(value: int) -> str:
    """A size as people read it: whole MiB when it is one, else bytes."""
    return f"{value // 1024**2} MiB" if value % 1024**2 == 0 else f"{value} bytes"


def _limit_words(value: ReportValue) -> str:
    """A limit as observed: its number (bytes shown in MiB too), or that there is none."""
    if value is None:
        return NOT_REPORTED
    limit = _limit(value)
    if limit is None:
        return f"no limit ({value})" if str(value).strip() else "no limit"
    return str(value)


def _pids_words(value: ReportValue) -> str:
    limit = _limit(value)
    return f"{limit} processes" if limit is not None else _limit_words(value)


def _size_words(value: ReportValue) -> str:
    limit = _limit(value)
    return _bytes(limit) if limit is not None else _limit_words(value)


def _swap_words(swap: ReportValue) -> str:
    if swap is None or str(swap) == "0" or _limit(swap) is None:
        return _limit_words(swap)
    return f"memory+swap {_bytes(_limit(swap) or 0)}"


def _no_swap(swap: ReportValue, memory: ReportValue) -> bool:
    """cgroup v1: memsw == memory means no swap; cgroup v2: swap.max == 0."""
    return str(swap) == "0" or (_limit(swap) is not None and _limit(swap) == _limit(memory))


# ------------------------------------------------------------------ outside: the engine, then the kernel


def _applied(
    engine_ok: bool,
    engine_words: str,
    kernel: ReportValue,
    kernel_ok: bool,
    kernel_words: str,
    where: str = "cgroup",
) -> Side:
    """A limit seen from outside: the engine must have recorded it and the host's kernel must hold it
    (``where``: the box's cgroup, or its process on the host); a kernel view the host cannot read leaves the
    property unseen from outside, never confirmed by the engine's word alone."""
    if not engine_ok:
        return Side(False, f"engine: {engine_words}")
    if kernel is None:
        return Side(None, f"engine: {engine_words}; {where}: not visible from here")
    return Side(kernel_ok, f"engine: {engine_words}; {where}: {kernel_words}")


def _engine_int(value: ReportValue) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _outside_sides(
    out: dict[str, ReportValue], *, memory_bytes: int, pids_limit: int, state_quota_bytes: int | None
) -> dict[str, Side]:
    """Each property as the host sees it (``impyard.backends.outside``)."""
    user = str(out.get("user") or "")
    uid = user.split(":")[0]
    network = out.get("network_mode")
    no_network = Side(network == "none", f"network {network}" if network else "no network mode recorded")
    security = [opt for opt in str(out.get("security_opt") or "").split(",") if opt]
    nnp_engine = any(opt.startswith("no-new-privileges") and not opt.endswith(":false") for opt in security)
    nnp = out.get("no_new_privs")
    engine_pids = _engine_int(out.get("engine_pids_limit"))
    engine_memory = _engine_int(out.get("engine_memory"))
    engine_swap = _engine_int(out.get("engine_memory_swap"))
    engine_cpus = _engine_int(out.get("engine_nano_cpus")) or _engine_int(out.get("engine_cpu_quota"))
    cgroup_memory, cgroup_swap = out.get("memory_limit"), out.get("memory_swap_limit")
    cap_drop = str(out.get("cap_drop") or "").split(",")
    cap_add = str(out.get("cap_add") or "")
    fsize = _engine_int(out.get("engine_file_size_limit"))
    sides = {
        "non-root user": Side(
            bool(uid) and uid not in ("0", "root"), f"user {user}" if user else "no user: root"
        ),
        "no network": no_network,
        "no route out": no_network,
        "read-only root": Side(
            out.get("readonly_rootfs") is True,
            "read-only" if out.get("readonly_rootfs") is True else "writable",
        ),
        "state mount writable": Side(None, "(seen from inside only)"),
        "no capabilities": Side(
            "ALL" in cap_drop and not cap_add,
            f"cap-drop {','.join(c for c in cap_drop if c) or 'none'}" + (f", cap-add {cap_add}" if cap_add else ""),
        ),
        "no new privileges": _applied(
            nnp_engine, "no-new-privileges" if nnp_engine else "not asked for",
            nnp, nnp == 1, f"NoNewPrivs={nnp}", "host process",
        ),
        "pids limit": _applied(
            engine_pids == pids_limit, f"{engine_pids} processes" if engine_pids > 0 else "no limit",
            out.get("pids_limit"), _limit(out.get("pids_limit")) == pids_limit, _pids_words(out.get("pids_limit")),
        ),
        "memory limit": _applied(
            0 < engine_memory <= memory_bytes, _bytes(engine_memory) if engine_memory > 0 else "no limit",
            cgroup_memory, _at_most(cgroup_memory, memory_bytes), _size_words(cgroup_memory),
        ),
        "no swap beyond memory": _applied(
            engine_swap == engine_memory > 0,
            f"memory+swap {_bytes(engine_swap)}" if engine_swap > 0 else "swap not limited",
            cgroup_swap, _no_swap(cgroup_swap, cgroup_memory), _swap_words(cgroup_swap),
        ),
        "cpu quota": _applied(
            engine_cpus > 0, "a CPU limit" if engine_cpus > 0 else "no CPU limit",
            out.get("cpu_quota"), _quota_set(out.get("cpu_quota")),
            f"quota {out.get('cpu_quota')}" if _quota_set(out.get("cpu_quota")) else _limit_words(out.get("cpu_quota")),
        ),
    }  # fmt: skip
    if state_quota_bytes is not None:
        sides["file size limit"] = Side(
            0 < fsize <= state_quota_bytes, f"engine: {_bytes(fsize)}" if fsize else "engine: no limit"
        )
    return sides


# ------------------------------------------------------------------ the runtime in force


def runtime_check(
    report: dict[str, ReportValue], runtime: str, host_kernel: str, outside: dict[str, ReportValue] | None
) -> LockdownCheck:
    """The runtime the box was asked to run under is the one it runs under: from inside, the kernel
    answering it (gVisor's, or the host's own under runc); from outside, the engine's HostConfig.Runtime."""
    kernel, log_head = report.get("kernel"), str(report.get("kernel_log") or "")
    gvisor = GVISOR_MARK in log_head
    release = str(kernel).split()[0] if kernel else ""
    if kernel is None:
        inside = Side(None, NOT_REPORTED)
    elif runtime == "runsc":
        inside = Side(gvisor, f"gVisor kernel {release}" if gvisor else f"kernel {release}, not gVisor")
    else:
        same = release == host_kernel and not gvisor
        inside = Side(
            same,
            f"the host's kernel {release}" if same else f"kernel {release}" + (" (gVisor)" if gvisor else ""),
        )
    expected = "gVisor's kernel (runsc)" if runtime == "runsc" else f"the host's kernel {host_kernel} (runc)"
    seen = None if outside is None else outside.get("runtime")
    out_side = UNSEEN_OUTSIDE if outside is None else Side(seen == runtime, f"runtime {seen}")
    return judge("runtime", expected, inside, out_side)


# ------------------------------------------------------------------ the whole lockdown


def evaluate(
    report: dict[str, ReportValue],
    *,
    memory: str,
    pids_limit: int,
    state_quota_bytes: int | None = None,
    outside: dict[str, ReportValue] | None = None,
    runtime: str | None = None,
    host_kernel: str = "",
) -> list[LockdownCheck]:
    """One check per lockdown property; all must pass for a box to count as confined. ``outside``: what the
    host saw of the running box (None: nothing to look at, the process backend); ``runtime``: the OCI runtime
    the box was started under (adds the runtime row), ``host_kernel`` the host's kernel release."""
    memory_bytes = _size_bytes(memory)
    mem = report.get("memory_limit")
    swap = report.get("memory_swap_limit")
    quota = report.get("cpu_quota")
    uid = report.get("uid")
    interfaces = report.get("interfaces")
    cap_eff, no_new_privs = report.get("cap_eff"), report.get("no_new_privs")
    pids = report.get("pids_limit")

    def seen(value: ReportValue, holds: bool, words: str) -> Side:
        """An inside observation: unseen when the box could not read it (None), else it holds or not."""
        return Side(None, NOT_REPORTED) if value is None else Side(holds, words)

    inside = {
        "non-root user": seen(uid, isinstance(uid, int) and uid != 0, f"uid {uid}"),
        "no network": seen(interfaces, interfaces == "lo", str(interfaces)),
        "no route out": Side(
            _yes_no(report.get("can_route_out"), good=False),
            _flag(report.get("can_route_out"), true="a route out", false="no route out"),
        ),
        "read-only root": Side(
            _yes_no(report.get("root_writable"), good=False),
            _flag(report.get("root_writable"), true="writable", false="read-only"),
        ),
        "state mount writable": Side(
            _yes_no(report.get("state_writable"), good=True),
            _flag(report.get("state_writable"), true="writable", false="not writable"),
        ),
        "no capabilities": seen(cap_eff, cap_eff == 0, f"CapEff={cap_eff}"),
        "no new privileges": seen(no_new_privs, no_new_privs == 1, f"NoNewPrivs={no_new_privs}"),
        "pids limit": seen(pids, _limit(pids) == pids_limit, _pids_words(pids)),
        "memory limit": seen(mem, _at_most(mem, memory_bytes), _size_words(mem)),
        "no swap beyond memory": seen(swap, _no_swap(swap, mem), _swap_words(swap)),
        "cpu quota": seen(quota, _quota_set(quota), f"quota {quota}" if _quota_set(quota) else _limit_words(quota)),
    }  # fmt: skip
    expected = {
        "non-root user": "a uid other than 0",
        "no network": "only lo",
        "no route out": "no route out",
        "read-only root": "read-only",
        "state mount writable": "writable",
        "no capabilities": "CapEff=0",
        "no new privileges": "NoNewPrivs=1",
        "pids limit": f"{pids_limit} processes",
        "memory limit": f"at most {_bytes(memory_bytes)}",
        "no swap beyond memory": "no swap (memory+swap = memory)",
        "cpu quota": "a CFS quota",
    }
    if state_quota_bytes is not None:  # one file can never outgrow the state dir's quota (issue 11 #11)
        file_limit = report.get("file_size_limit")
        # the probe reports an unlimited RLIMIT_FSIZE as None; a report without the key did not look
        inside["file size limit"] = (
            Side(None, NOT_REPORTED)
            if "file_size_limit" not in report
            else Side(
                _at_most(file_limit, state_quota_bytes),
                _size_words(file_limit) if file_limit is not None else "no limit",
            )
        )
        expected["file size limit"] = f"at most {_bytes(state_quota_bytes)}"
    outside_sides = (
        {}
        if outside is None
        else _outside_sides(
            outside, memory_bytes=memory_bytes, pids_limit=pids_limit, state_quota_bytes=state_quota_bytes
        )
    )
    checks = [
        judge(name, expected[name], side, outside_sides.get(name, UNSEEN_OUTSIDE))
        for name, side in inside.items()
    ]
    if runtime is not None:
        checks.insert(0, runtime_check(report, runtime, host_kernel, outside))
    return checks


def evaluate_outside(
    outside: dict[str, ReportValue] | None,
    *,
    memory: str,
    pids_limit: int,
    state_quota_bytes: int | None = None,
    runtime: str | None = None,
    host_kernel: str = "",
) -> list[LockdownCheck]:
    """A box seen from outside only: a spare before its claim (issue 37), which runs no task and is not asked.
    The same rules as ``evaluate``, each property judged on the host's view alone; those only the inside can
    see are left out. ``outside`` None (the process backend): nothing confirms anything, and every row fails."""
    checks = evaluate(
        {},
        memory=memory,
        pids_limit=pids_limit,
        state_quota_bytes=state_quota_bytes,
        outside=outside,
        runtime=runtime,
        host_kernel=host_kernel,
    )
    return [replace(check, observed=NOT_ASKED) for check in checks if check.name not in SEEN_INSIDE_ONLY]
