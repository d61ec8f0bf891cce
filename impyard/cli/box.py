"""``impyard box``: build the box image and check a real box's lockdown."""

from __future__ import annotations

import platform
import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import anyio
import click
from rich.console import Console
from rich.markup import escape

from box.protocol.models import BoxInitParams, ImpSpec, ReportValue, SessionInfo, TaskRunParams, TaskSpec
from impyard.backends import BoxBackend, BoxError, BoxSpec, RefuseAllHost
from impyard.backends.choose import choose_backend
from impyard.backends.docker import DockerBackend, DockerLimits
from impyard.backends.lockdown import LockdownCheck, evaluate
from impyard.backends.outside import observe_outside
from impyard.backends.runtimes import RUNTIME_ENV, RUNTIME_SETTINGS, RuntimeChoice, RuntimeSetting
from impyard.backends.stateroot import state_root
from impyard.cli.errors import CliError
from impyard.cli.output import Col, Output, output_options
from impyard.threads import in_thread

PROBE_TIMEOUT_S = 60.0


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


@dataclass(frozen=True)
class Observation:
    """A real box seen from both sides: ``inside`` its own report (``box.probe``), ``outside`` what the host
    saw of it while it ran (``impyard.backends.outside``; None for the process backend), and the OCI runtime
    it ran under (None for the process backend)."""

    inside: dict[str, ReportValue]
    outside: dict[str, ReportValue] | None
    runtime: str | None


async def probe(backend: BoxBackend, state_dir: Path) -> Observation:
    """Start a real box, ask it what it observes from inside, look at it from outside, shut it down."""
    now = datetime.now(UTC)
    spec = BoxSpec(imp="box-check", channel_id="check", state_dir=state_dir)
    outside: dict[str, ReportValue] | None = None
    async with backend.open(spec, RefuseAllHost()) as running:
        await running.init(
            BoxInitParams(
                protocol=1,
                imp=ImpSpec(name="box-check"),
                session=SessionInfo(
                    id=f"check-{uuid.uuid4().hex[:8]}", channel_id="check", channel_kind="task"
                ),
                now=now,
            ),
            timeout=PROBE_TIMEOUT_S,
        )
        result = await running.run_task(
            TaskRunParams(task=TaskSpec(id="probe", kind="probe"), now=now), timeout=PROBE_TIMEOUT_S
        )
        if isinstance(backend, DockerBackend):  # while it runs: its cgroup goes with it
            attrs = await in_thread(backend.inspect_box, spec)
            outside = await in_thread(observe_outside, attrs)
    runtime = backend.runtime if isinstance(backend, DockerBackend) else None
    return Observation(result.report, outside, runtime)


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
@output_options
def check_command(backend: str, runtime: str | None, out: Output) -> None:
    """Start a real box and verify its lockdown from inside and from outside.

    \b
    Prints, for each lockdown property, what a confined box shows, what this
    box observed from inside (uid, network interfaces, whether the root is
    read-only, capabilities, NoNewPrivs, pids, memory and file size limits, the
    kernel answering it) and what the host saw from outside (docker inspect and
    the box's cgroup on the host: under gVisor a box cannot see its own limits),
    and exits non-zero if any is missing or neither side can confirm it.
    Examples:
      impyard box check
      impyard box check --runtime runc
    """
    chosen = choose_backend(backend)  # type: ignore[arg-type]
    if isinstance(chosen, DockerBackend) and runtime is not None:
        chosen.runtime_choice = RuntimeChoice(cast(RuntimeSetting, runtime), "--runtime")
    limits = chosen.limits if isinstance(chosen, DockerBackend) else DockerLimits()
    try:
        root = (
            state_root()
        )  # a box mounts nothing outside an enforced state root: the probe's state lies in it
        if root.strict:
            root.path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".box-check-", dir=root.path if root.strict else None) as tmp:
            seen = anyio.run(probe, chosen, Path(tmp) / "state")
    except (BoxError, OSError) as exc:
        raise CliError(f"the box did not start: {exc}") from exc
    checks = evaluate(
        seen.inside,
        memory=limits.memory,
        pids_limit=limits.pids_limit,
        state_quota_bytes=limits.state_quota.max_bytes,
        outside=seen.outside,
        runtime=seen.runtime,
        host_kernel=platform.release(),
    )
    failed = [check for check in checks if not check.ok]
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
                "confined": not failed,
            }
        )
    else:
        out.table(
            (Col("property", no_wrap=True), "expected", "inside", "outside", Col("result", no_wrap=True)),
            (_check_row(check) for check in checks),
            title=f"Box lockdown ({where})",
        )
    if failed:
        raise CliError(
            f"{len(failed)} lockdown properties missing or unconfirmed ({', '.join(c.name for c in failed)}) "
            f"in the {where}: use the Docker backend on an engine that can apply every limit"
        )


def _check_row(check: LockdownCheck) -> tuple[str, ...]:
    return (
        escape(check.name),
        escape(check.expected),
        escape(check.observed),  # what the box reported: text, never markup
        escape(check.outside),
        "[green]ok[/]" if check.ok else "[red]MISSING[/]",
    )
