"""Judge a box's own observations (``box.probe``) against the lockdown of design.md §10.

A pure function over the probe report, so the rule table is testable without a box.
"""

from __future__ import annotations

from dataclasses import dataclass

from box.protocol.models import ReportValue

_UNLIMITED = {None, "", "max", "-1", "9223372036854771712", "9223372036854775807"}


@dataclass(frozen=True)
class LockdownCheck:
    name: str
    ok: bool
    observed: str
    expected: str


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


def evaluate(
    report: dict[str, ReportValue], *, memory: str, pids_limit: int, state_quota_bytes: int | None = None
) -> list[LockdownCheck]:
    """One check per lockdown property; all must pass for a box to count as confined."""
    memory_bytes = _size_bytes(memory)
    mem = _limit(report.get("memory_limit"))
    swap = report.get("memory_swap_limit")
    # cgroup v1: memsw == memory means no swap; cgroup v2: swap.max == 0.
    swap_ok = str(swap) == "0" or (_limit(swap) is not None and _limit(swap) == mem)
    quota = report.get("cpu_quota")
    quota_ok = quota is not None and str(quota).split()[0] not in _UNLIMITED
    uid = report.get("uid")
    file_limit = _limit(report.get("file_size_limit"))
    checks = [
        LockdownCheck("non-root user", isinstance(uid, int) and uid != 0, str(uid), "uid != 0"),
        LockdownCheck(
            "no network", report.get("interfaces") == "lo", str(report.get("interfaces")), "only lo"
        ),
        LockdownCheck(
            "no route out", report.get("can_route_out") is False, str(report.get("can_route_out")), "False"
        ),
        LockdownCheck(
            "read-only root", report.get("root_writable") is False, str(report.get("root_writable")), "False"
        ),
        LockdownCheck(
            "state mount writable",
            report.get("state_writable") is True,
            str(report.get("state_writable")),
            "True",
        ),
        LockdownCheck("no capabilities", report.get("cap_eff") == 0, str(report.get("cap_eff")), "CapEff 0"),
        LockdownCheck(
            "no new privileges",
            report.get("no_new_privs") == 1,
            str(report.get("no_new_privs")),
            "NoNewPrivs 1",
        ),
        LockdownCheck(
            "pids limit",
            _limit(report.get("pids_limit")) == pids_limit,
            str(report.get("pids_limit")),
            str(pids_limit),
        ),
        LockdownCheck(
            "memory limit",
            mem is not None and mem <= memory_bytes,
            str(report.get("memory_limit")),
            f"<= {memory_bytes}",
        ),
        LockdownCheck("no swap beyond memory", swap_ok, str(swap), "memory-swap = memory"),
        LockdownCheck("cpu quota", quota_ok, str(quota), "a CFS quota"),
    ]
    if state_quota_bytes is not None:  # one file can never outgrow the state dir's quota (issue 11 #11)
        checks.append(
            LockdownCheck(
                "file size limit",
                file_limit is not None and file_limit <= state_quota_bytes,
                str(report.get("file_size_limit")),
                f"<= {state_quota_bytes}",
            )  # fmt: skip
        )
    return checks
