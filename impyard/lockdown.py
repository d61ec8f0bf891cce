"""Judge a box's own observations (``box.probe``) against the lockdown of docs/box.md.

A pure function over the probe report, so the rule table is testable without a box.
"""

from __future__ import annotations

from dataclasses import dataclass

from box.protocol.models import ReportValue

_UNLIMITED = {None, "", "max", "-1", "9223372036854771712", "9223372036854775807"}


@dataclass(frozen=True)
class LockdownCheck:
    """One lockdown property: what a confined box shows (``expected``) and what this one showed
    (``observed``), both in words that read on their own ("read-only", "writable"), never a bare flag."""

    name: str
    ok: bool
    observed: str
    expected: str


NOT_REPORTED = "not reported"


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


def _flag(value: ReportValue, *, true: str, false: str) -> str:
    """A yes/no observation in words; anything else (an error text, nothing) as it came."""
    if value is True:
        return true
    if value is False:
        return false
    return NOT_REPORTED if value is None else str(value)


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
    interfaces = report.get("interfaces")
    cap_eff, no_new_privs = report.get("cap_eff"), report.get("no_new_privs")
    checks = [
        LockdownCheck(
            "non-root user", isinstance(uid, int) and uid != 0,
            NOT_REPORTED if uid is None else f"uid {uid}", "a uid other than 0",
        ),
        LockdownCheck(
            "no network", interfaces == "lo",
            NOT_REPORTED if interfaces is None else str(interfaces), "only lo",
        ),
        LockdownCheck(
            "no route out", report.get("can_route_out") is False,
            _flag(report.get("can_route_out"), true="a route out", false="no route out"), "no route out",
        ),
        LockdownCheck(
            "read-only root", report.get("root_writable") is False,
            _flag(report.get("root_writable"), true="writable", false="read-only"), "read-only",
        ),
        LockdownCheck(
            "state mount writable", report.get("state_writable") is True,
            _flag(report.get("state_writable"), true="writable", false="not writable"), "writable",
        ),
        LockdownCheck(
            "no capabilities", cap_eff == 0,
            NOT_REPORTED if cap_eff is None else f"CapEff={cap_eff}", "CapEff=0",
        ),
        LockdownCheck(
            "no new privileges", no_new_privs == 1,
            NOT_REPORTED if no_new_privs is None else f"NoNewPrivs={no_new_privs}", "NoNewPrivs=1",
        ),
        LockdownCheck(
            "pids limit", _limit(report.get("pids_limit")) == pids_limit,
            _pids_words(report.get("pids_limit")), f"{pids_limit} processes",
        ),
        LockdownCheck(
            "memory limit", mem is not None and mem <= memory_bytes,
            _size_words(report.get("memory_limit")), f"at most {_bytes(memory_bytes)}",
        ),
        LockdownCheck(
            "no swap beyond memory", swap_ok,
            _limit_words(swap) if swap is None or str(swap) == "0" or _limit(swap) is None
            else f"memory+swap {_bytes(_limit(swap) or 0)}",
            "no swap (memory+swap = memory)",
        ),
        LockdownCheck(
            "cpu quota", quota_ok,
            f"quota {quota}" if quota_ok else _limit_words(quota), "a CFS quota",
        ),
    ]  # fmt: skip
    if state_quota_bytes is not None:  # one file can never outgrow the state dir's quota (issue 11 #11)
        checks.append(
            LockdownCheck(
                "file size limit",
                file_limit is not None and file_limit <= state_quota_bytes,
                _size_words(report.get("file_size_limit")),
                f"at most {_bytes(state_quota_bytes)}",
            )  # fmt: skip
        )
    return checks
