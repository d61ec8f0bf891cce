"""``impyard box``: build the box image and check real boxes' lockdown (a started box and a spare)."""

from __future__ import annotations

import platform
import tempfile
from pathlib import Path
from typing import cast

import anyio
import click
from rich.console import Console
from rich.markup import escape

from impyard.backends import BoxError
from impyard.backends.choose import choose_backend
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.lockdown import LockdownCheck, evaluate
from impyard.backends.runtimes import RUNTIME_ENV, RUNTIME_SETTINGS, RuntimeChoice, RuntimeSetting
from impyard.backends.stateroot import state_root
from impyard.cli.box_probe import (
    SPARE,
    SPARE_CHECKS,
    STARTED,
    BoxCheck,
    SpareCheckError,
    SpareObservation,
    judge_spare,
    probe,
    probe_spare,
    spare_failed,
)
from impyard.cli.errors import CliError
from impyard.cli.output import Col, Output, output_options


@click.group("box")
def box_group() -> None:
    """The box: the locked-down container every imp runs in.

    \b
    Example:
      impyard box build
      impyard box check
    """


@box_group.command("build")
@click.option(
    "--base", default=None, help="Base image (default: python:3.11-slim, else a local Debian base)."
)
@click.option("--force", is_flag=True, help="Rebuild even if the image for this box version exists.")
def build_command(base: str | None, force: bool) -> None:
    """Build the box image without a container registry.

    \b
    The box's Python dependencies are downloaded on the host and copied in; when
    the base image cannot be pulled, a minimal Debian base is built locally with
    debootstrap. Example:
      impyard box build
    """
    from impyard.backends.image import BoxImageError, build_image

    console = Console(stderr=True)
    try:
        with console.status("Building the box image…") as status:

            def progress(line: str) -> None:
                status.update(f"Building the box image… {line.strip()[:80]}")
                console.print(f"[dim]{line.rstrip()}[/dim]", highlight=False)

            tag = build_image(base=base, force=force, progress=progress)
    except BoxImageError as exc:
        raise CliError(str(exc)) from exc
    click.echo(tag)


@box_group.command("check")
@click.option(
    "--backend",
    type=click.Choice(["auto", "docker", "process"]),
    default="auto",
    show_default=True,
    help="Where to start the box (process has no lockdown and fails the check).",
)
@click.option(
    "--runtime",
    type=click.Choice(list(RUNTIME_SETTINGS)),
    default=None,
    help=f"The Docker box's OCI runtime (default: ${RUNTIME_ENV}, else auto: runsc when the engine has it).",
)
@click.option(
    "--no-spare",
    is_flag=True,
    help="Check the started box only, not a spare box as the spare pool starts it (issue 37).",
)
@output_options
def check_command(backend: str, runtime: str | None, no_spare: bool, out: Output) -> None:
    """Start real boxes and verify their lockdown from inside and from outside.

    \b
    Prints, for each lockdown property, what a confined box shows, what the box
    observed from inside (uid, network interfaces, whether the root is
    read-only, capabilities, NoNewPrivs, pids, memory and file size limits, the
    kernel answering it) and what the host saw from outside (docker inspect and
    the box's cgroup on the host: under gVisor a box cannot see its own limits),
    and exits non-zero if any is missing or neither side can confirm it.
    Each row names its box: one started for the check, and a spare box started
    as a host's pool starts one (issue 37) — unclaimed (seen from outside; its
    host refuses every request; its /state is its own and empty), then claimed
    for a check channel as a conversation claims one (probed inside like the
    started box; the channel's /state is in it, and the channel's again once
    it closed). --no-spare checks the started box only.
    Examples:
      impyard box check
      impyard box check --runtime runc
      impyard box check --no-spare
    """
    spare = not no_spare
    chosen = choose_backend(backend)  # type: ignore[arg-type]
    if isinstance(chosen, DockerBackend) and runtime is not None:
        chosen.runtime_choice = RuntimeChoice(cast(RuntimeSetting, runtime), "--runtime")
    limits = chosen.limits if isinstance(chosen, DockerBackend) else DockerLimits()
    spare_seen: SpareObservation | None = None
    spare_error = ""
    try:
        root = (
            state_root()
        )  # a box mounts nothing outside an enforced state root: the probes' state lies in it
        if root.strict:
            root.path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".box-check-", dir=root.path if root.strict else None) as tmp:
            seen = anyio.run(probe, chosen, Path(tmp) / "state")
            if spare:
                try:
                    spare_seen = anyio.run(probe_spare, chosen, Path(tmp) / "spare")
                except SpareCheckError as exc:
                    spare_error = str(exc)
                except (BoxError, OSError) as exc:
                    spare_error = f"the spare box: {exc}"
    except (BoxError, OSError) as exc:
        raise CliError(f"the box did not start: {exc}") from exc
    memory, pids_limit, quota = limits.memory, limits.pids_limit, limits.state_quota.max_bytes
    host_kernel = platform.release()
    checks = evaluate(
        seen.inside, memory=memory, pids_limit=pids_limit, state_quota_bytes=quota, outside=seen.outside,
        runtime=seen.runtime, host_kernel=host_kernel,
    )  # fmt: skip
    spare_checks: list[BoxCheck] = []
    if spare_seen is not None:
        spare_checks = judge_spare(
            spare_seen, memory=memory, pids_limit=pids_limit, state_quota_bytes=quota, host_kernel=host_kernel
        )
    elif spare:
        spare_checks = spare_failed(spare_error)
    failed = [check for check in checks if not check.ok]
    spare_failed_rows = [row for row in spare_checks if not row.check.ok]
    where = chosen.name + (f" backend, runtime {seen.runtime}" if seen.runtime else " backend")
    if out.as_json:
        out.json(
            {
                "backend": chosen.name,
                "runtime": seen.runtime,
                "runtime_setting": chosen.runtime_choice.describe()
                if isinstance(chosen, DockerBackend)
                else None,
                "observed": seen.inside,
                "outside": seen.outside,
                "checks": [check.__dict__ for check in checks],
                "confined": not failed,  # the started box's, as ever; the spare's is spare.confined
                "spare": _spare_json(spare_seen, spare_checks) if spare else None,
            }
        )
    else:
        rows = [BoxCheck(STARTED, check) for check in checks] + spare_checks
        out.table(
            (
                Col("box", no_wrap=True),
                Col("property", no_wrap=True),
                "expected",
                "inside",
                "outside",
                Col("result", no_wrap=True),
            ),
            (_check_row(row) for row in rows),
            title=f"Box lockdown ({where})",
        )
    if failed or spare_failed_rows:
        raise CliError(_failure_line(failed, spare_failed_rows, where))


def _failure_line(failed: list[LockdownCheck], spare: list[BoxCheck], where: str) -> str:
    """One line naming each box that failed, and what; the fix where it is the engine's limits."""
    parts = []
    if failed:
        parts.append(
            f"{len(failed)} lockdown properties missing or unconfirmed in the started box "
            f"({', '.join(c.name for c in failed)})"
        )
    for box in dict.fromkeys(row.box for row in spare):
        names = [row.check.name for row in spare if row.box == box]
        if box == SPARE:
            parts.append(spare[0].check.outside)  # "the spare box did not start: …"
            continue
        shared = [c.name for c in failed if c.name in names]  # said once, for the started box
        listed = ["those of the started box"] * bool(shared) + [n for n in names if n not in shared]
        counted = f"{len(names)} check{'' if len(names) == 1 else 's'}"
        parts.append(f"{counted} failed in the {box} box ({', '.join(listed)})")
    lockdown = failed or any(row.check.name not in SPARE_CHECKS for row in spare)
    fix = ": use the Docker backend on an engine that can apply every limit" if lockdown else ""
    return f"{'; '.join(parts)} (the {where}){fix}"


def _spare_json(seen: SpareObservation | None, checks: list[BoxCheck]) -> dict[str, object]:
    """``--json``'s ``spare``: its checks (each naming its box), ``confined``, and what was seen of it."""
    return {
        "checks": [{"box": row.box, **row.check.__dict__} for row in checks],
        "confined": all(row.check.ok for row in checks),
        "unclaimed": None
        if seen is None
        else {"outside": seen.unclaimed_outside, "refusal": seen.refusal, "state": seen.fresh_state},
        "claimed": None
        if seen is None
        else {"observed": seen.claimed.inside, "outside": seen.claimed.outside},
        "error": next((row.check.outside for row in checks if row.box == SPARE), None),
    }


def _check_row(row: BoxCheck) -> tuple[str, ...]:
    check = row.check
    return (
        escape(row.box),
        escape(check.name),
        escape(check.expected),
        escape(check.observed),  # what the box reported: text, never markup
        escape(check.outside),
        "[green]ok[/]" if check.ok else "[red]MISSING[/]",
    )
