"""``python -m bench``: run the benchmark scenarios, write JSON, print a short table.

Example:
  python -m bench --out bench/results/latest.json --markdown bench/RESULTS.md
  python -m bench --quick --only warm_turn --only gateway --no-docker
  python -m bench --only hosts --only ledger --no-docker
  python -m bench --only realmodel     # a real model on llama.cpp's server (issue 38; never in the default run)
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import burst, cold_warm, contention, fanout, gateway, hosts, memory, memory_days, night, warm_turn
from bench import memory_recall as memory_evidence  # issue 32
from bench.env import ROOT, environment, isolated_home, settle
from bench.harness import Context, NamedBackend, Plan, add_imps, result
from bench.realmodel import rows as realmodel_rows  # issue 38
from bench.realmodel import run as realmodel_run
from bench.report import RowsOf, markdown, rich_table, rows
from impyard.backends import BoxBackend, BoxStartError
from impyard.backends.docker import DockerBackend
from impyard.backends.image import BoxImageError, build_image, expected_tag, image_present
from impyard.backends.process import ProcessBackend
from impyard.backends.runtimes import RuntimeChoice

DEFAULT_OUT = ROOT / "bench" / "results" / "latest.json"  # bench/results/ is git-ignored
BUSY_LOAD = 0.5  # a 1-minute load average above this at the start means someone else is using the CPUs

SCENARIOS: dict[str, tuple[Callable[[Context], Awaitable[dict[str, Any]]], RowsOf]] = {
    "warm_turn": (warm_turn.run, warm_turn.rows),
    "cold_warm": (cold_warm.run, cold_warm.rows),
    "burst": (burst.run, burst.rows),
    "fanout": (fanout.run, fanout.rows),
    "gateway": (gateway.run, gateway.rows),
    "memory_recall": (memory.recall, memory.recall_rows),
    "memory_turn": (memory.turn_overhead, memory.turn_rows),
    "memory_night": (night.run, night.rows),
    "memory_days": (memory_days.run, memory_days.rows),
    "memory_evidence": (memory_evidence.run, memory_evidence.rows),  # issue 32: needs the real embedder
    "hosts": (hosts.run, hosts.rows),
    "ledger": (contention.run, contention.rows),
    "realmodel": (realmodel_run, realmodel_rows),  # issue 38: only with --only realmodel
}
# Run only when named with --only: they build or download what the default run must not (a C++ server, a model)
# and take tens of minutes of CPU; CI runs the default set.
OPT_IN = frozenset({"realmodel"})
DEFAULT_SCENARIOS = [name for name in SCENARIOS if name not in OPT_IN]


class RichProgress:
    """One progress line per phase of a scenario."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: Any = None

    def phase(self, description: str, total: int) -> None:
        self._task = self._progress.add_task(description, total=total)

    def advance(self, steps: int = 1) -> None:
        self._progress.advance(self._task, steps)


def choose_backends(
    use_docker: bool, say: Callable[[str], None]
) -> tuple[dict[str, BoxBackend], dict[str, str]]:
    """The process backend always; Docker under runc where an engine runs and the box image is (or can be)
    built, and Docker under gVisor's runsc where the engine has it registered (issue 22)."""
    backends: dict[str, BoxBackend] = {"process": ProcessBackend(warn=False)}
    if not use_docker:
        return backends, {"docker": "--no-docker", "runsc": "--no-docker"}
    try:
        tag = expected_tag()
        if not image_present(tag):
            say(f"building the box image {tag} …")
            build_image(progress=lambda line: None)
        docker = DockerBackend(tag, runtime=RuntimeChoice("runc", "the benchmark"))
        docker.preflight()
    except (BoxImageError, BoxStartError) as exc:
        return backends, {"docker": str(exc), "runsc": str(exc)}
    backends["docker"] = docker
    runsc = DockerBackend(tag, runtime=RuntimeChoice("runsc", "the benchmark"))
    try:
        runsc.preflight()
    except BoxStartError as exc:
        return backends, {"runsc": str(exc)}
    backends["runsc"] = NamedBackend(runsc, "runsc")
    return backends, {}


async def run_scenarios(names: list[str], ctx: Context, console: Console) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        # each scenario starts on a quiet machine; --quick only checks that everything runs, its figures are noise
        waited = await settle(ctx.plan.settle_s)
        began = time.perf_counter()
        try:
            results[name] = await SCENARIOS[name][0](ctx)
            results[name]["settled_before_s"] = waited
            results[name]["duration_s"] = round(time.perf_counter() - began, 1)
        except Exception as exc:  # noqa: BLE001 - one broken scenario is reported, the rest still run
            console.print(f"scenario {name} failed:\n{traceback.format_exc()}", style="red", markup=False)
            status = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            results[name] = result({}, baseline=None, ratio=None, targets={}, met=False, status=status)
    return results


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="Tiny sample counts: checks that the benchmark runs (seconds).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_OUT, show_default=True,
              help="Where the JSON results go.")  # fmt: skip
@click.option(
    "--only", multiple=True, type=click.Choice(list(SCENARIOS)), help="Run only this scenario (repeatable)."
)
@click.option("--no-docker", is_flag=True, help="Measure the process backend only.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the table as Markdown, with the machine and the command (e.g. bench/RESULTS.md).")  # fmt: skip
def main(quick: bool, out: Path, only: tuple[str, ...], no_docker: bool, markdown_path: Path | None) -> None:
    """Benchmark impyard against its targets (README.md, "Performance"); every figure beside a baseline from the same run.

    \b
    Example:
      python -m bench --out bench/results/latest.json --markdown bench/RESULTS.md
      python -m bench --quick --only warm_turn --no-docker
    """
    console = Console(stderr=True)
    plan = Plan.quick() if quick else Plan()
    names = [name for name in SCENARIOS if name in only] if only else DEFAULT_SCENARIOS
    if names and all(name in OPT_IN for name in names):
        no_docker = True  # the real model runs its chat on the process backend: no box image to build
    started, began, load_before = datetime.now(UTC), time.perf_counter(), os.getloadavg()[0]
    if load_before > BUSY_LOAD:
        console.print(
            f"[yellow]the machine is busy (load {load_before:.1f}): other work will show in the figures[/yellow]"
        )
    with isolated_home():
        backends, skipped = choose_backends(not no_docker, console.print)
        add_imps(list(backends))
        for name, why in skipped.items():
            console.print(f"[yellow]not measuring the {name} backend:[/yellow] {why}")
        try:
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            with Progress(*columns, console=console) as bar:
                ctx = Context(plan=plan, progress=RichProgress(bar), backends=backends)
                scenarios = anyio.run(run_scenarios, names, ctx, console)
        finally:
            docker = backends.get("docker")
            if isinstance(docker, DockerBackend):
                docker.remove_orphans()
    results = {
        "command": shlex.join(["python", "-m", "bench", *sys.argv[1:]]),
        "started_at": started.isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - began, 1),
        "quick": quick,
        "environment": {
            **environment(),
            "load_1m_at_start": round(load_before, 2),
            "load_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "backends": {"measured": list(backends), "skipped": skipped},
        "plan": asdict(plan),
        "scenarios": scenarios,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    table = rows(scenarios, {name: rows_of for name, (_run, rows_of) in SCENARIOS.items()})
    Console(width=None if sys.stdout.isatty() else 180).print(rich_table(table))
    console.print(f"results: {out} ({results['duration_s']:.0f} s)")
    if markdown_path is not None:
        markdown_path.write_text(markdown(results, table))


if __name__ == "__main__":
    main()
