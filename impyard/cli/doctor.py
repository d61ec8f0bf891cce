"""``impyard doctor``: what is set up, and the fix for what is not."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import click
from rich.markup import escape

from impyard import paths
from impyard.audit import redact_url
from impyard.backends import BoxStartError
from impyard.backends.docker import DockerBackend
from impyard.cli.output import Output, output_options
from impyard.imps import ImpError, ImpStore


@dataclass(frozen=True)
class Finding:
    item: str
    ok: bool
    detail: str
    fix: str = ""


def _docker_findings() -> list[Finding]:
    backend = DockerBackend()
    try:
        version = backend.client().version().get("Version", "?")
    except BoxStartError as exc:
        return [
            Finding(
                "Docker engine", False, str(exc).split(":")[0], "apt-get install docker.io; start dockerd"
            ),
            Finding("Box image", False, "unknown (no engine)", "impyard box build (after Docker runs)"),
        ]
    engine = Finding("Docker engine", True, f"reachable, version {version}")
    try:
        backend.preflight()
    except BoxStartError as exc:
        fix = "impyard box build" if "not built" in str(exc) else "see the detail"
        return [engine, Finding("Box image", False, str(exc), fix)]
    return [engine, Finding("Box image", True, backend.image)]


def _model_findings() -> list[Finding]:
    key = os.environ.get("OPENAI_API_KEY")
    configured = os.environ.get("OPENAI_BASE_URL")
    base = (
        redact_url(configured) if configured else "https://api.openai.com/v1 (default)"
    )  # issue 11 #9: no proxy credentials
    if key:
        return [Finding("Model key", True, f"OPENAI_API_KEY set ({len(key)} characters); base {base}")]
    return [
        Finding(
            "Model key",
            False,
            "OPENAI_API_KEY not set",
            "export OPENAI_API_KEY=sk-… (and OPENAI_BASE_URL for a compatible server)",
        )
    ]


def _discord_findings() -> list[Finding]:
    """Each imp's Discord token: where it is read from and whether it is there (never the token)."""
    try:
        imps = ImpStore().scan()
    except ImpError as exc:
        return [Finding("Discord token(s)", False, str(exc), "fix the imp directory named in the error")]
    if not imps:
        return [
            Finding(
                "Discord token(s)", False, "no imps yet", "impyard imp add NAME (impyard chat creates one)"
            )
        ]
    findings = []
    for name, config in imps:
        if isinstance(config, ImpError):
            findings.append(Finding(f"Imp {name}", False, str(config).splitlines()[0], "edit its imp.toml"))
            continue
        status = ImpStore().token_status(config)
        detail = f"{status.source}: " + ("set" if status.is_set else "not set")
        fix = status.problem or (
            "" if status.is_set else f"only needed for Discord: export {config.token_env}=…"
        )
        findings.append(Finding(f"Discord token ({name})", status.is_set and not status.problem, detail, fix))
    return findings


def _state_findings() -> list[Finding]:
    home = paths.home()
    try:
        home.mkdir(parents=True, exist_ok=True)
        probe = home / ".doctor-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return [
            Finding("State dir", False, f"{home}: {exc.strerror}", "set IMPYARD_HOME to a writable directory")
        ]
    return [Finding("State dir", True, str(home))]


@click.command("doctor")
@output_options
def doctor_command(out: Output) -> None:
    """Check the Docker engine, the box image, the model key, Discord tokens and the state dir.

    \b
    Example:
      impyard doctor
    """
    findings = _docker_findings() + _model_findings() + _discord_findings() + _state_findings()
    out.listing(
        [asdict(finding) for finding in findings],
        columns=("", "item", "detail", "fix"),
        rows=(_finding_row(finding) for finding in findings),
        title="impyard doctor",
    )


def _finding_row(finding: Finding) -> tuple[str, ...]:
    # details are text, not markup: "[redacted]" must print as itself
    return (
        "[green]ok[/]" if finding.ok else "[red]!![/]",
        escape(finding.item),
        escape(finding.detail),
        escape(finding.fix),
    )
