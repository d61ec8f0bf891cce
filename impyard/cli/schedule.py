"""``impyard schedule``: recurring tasks (every N, or cron in a timezone) for ``impyard supervise``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.console import Console
from rich.table import Column, Table

from impyard.cli.errors import CliError
from impyard.clock import SystemClock
from impyard.db import DatabaseError, open_database
from impyard.durations import format_duration
from impyard.imps import ImpError, ImpStore
from impyard.schedules import (
    MISSED_POLICIES,
    Schedule,
    ScheduleError,
    ScheduleRequest,
    ScheduleStore,
    describe_next,
)
from impyard.tasks import TaskError, TaskStore


@contextmanager
def schedule_store() -> Iterator[ScheduleStore]:
    try:
        db = open_database()
    except DatabaseError as exc:
        raise CliError(str(exc)) from exc
    clock = SystemClock()
    imps = ImpStore()
    try:
        yield ScheduleStore(db, clock, TaskStore(db, clock, imps), imps)
    except (ScheduleError, TaskError, ImpError) as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    finally:
        db.close()


def _echo(schedule: Schedule, as_json: bool, verb: str) -> None:
    if as_json:
        click.echo(json.dumps(schedule.to_json(), indent=2))
        return
    state = "paused" if schedule.paused else f"next run {describe_next(schedule)}"
    click.echo(f"{verb} {schedule.id} for {schedule.imp}: {schedule.trigger.describe()}, {state}")


@click.group("schedule")
def schedule_group() -> None:
    """Recurring tasks: every N, or on a cron expression in a timezone."""


@schedule_group.command("add")
@click.argument("imp")
@click.argument("prompt", required=False)
@click.option(
    "--every", default=None, help="Fire every interval, e.g. 24h, 90m (1m to 366d), counted from now."
)
@click.option(
    "--cron", default=None, help='Fire on a cron expression, e.g. "0 9 * * 1-5" (5 fields, or @daily).'
)
@click.option("--tz", default=None, help="Timezone of --cron (IANA name, e.g. Europe/Oslo; default UTC).")
@click.option(
    "--missed", type=click.Choice(MISSED_POLICIES), default="once", show_default=True,
    help="After downtime: skip missed runs, run once for them, or run all of them.",
)  # fmt: skip
@click.option(
    "--now",
    "run_now",
    is_flag=True,
    help="Also fire right away (otherwise the first run is the next fire time).",
)
@click.option(
    "--channel",
    "channel_id",
    default=None,
    help="Where its tasks post (default: the imp's task log, task:IMP).",
)
@click.option("--ceiling", default=None, help="Longest each task's box may run, 10s to 6h (default 10m).")
@click.option(
    "--kind",
    default="prompt",
    show_default=True,
    help="Task kind (an open set; the box decides what it means).",
)
@click.option(
    "--wake-on-resolve", is_flag=True, help="When a gated post of a run is decided, queue a follow-up task."
)
@click.option("--briefing", is_flag=True, help="Give each run the imp's journal of its recent task outcomes.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def add_command(
    imp: str, prompt: str | None, every: str | None, cron: str | None, tz: str | None, missed: str, run_now: bool,
    channel_id: str | None, ceiling: str | None, kind: str, wake_on_resolve: bool, briefing: bool, as_json: bool,
) -> None:  # fmt: skip
    """Add a schedule for IMP.

    \b
    Examples:
      impyard schedule add pip --cron "0 9 * * 1-5" --tz Europe/Oslo "Post today's summary" --channel 123456789012345678
      impyard schedule add pip --every 24h --missed skip "Check the changelog and note anything new"
    """
    with schedule_store() as store:
        schedule = store.add(
            ScheduleRequest(
                imp=imp, prompt=prompt, every=every, cron=cron, tz=tz, missed=missed, now=run_now,
                channel_id=channel_id, ceiling=ceiling, kind=kind, wake_on_resolve=wake_on_resolve, briefing=briefing,
            )
        )  # fmt: skip
    _echo(schedule, as_json, "added")


@schedule_group.command("ls")
@click.option("--imp", default=None, help="Only this imp's schedules.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def ls_command(imp: str | None, as_json: bool) -> None:
    """List schedules with their next run.

    \b
    Example:
      impyard schedule ls
    """
    with schedule_store() as store:
        schedules = store.list(imp)
    if as_json:
        click.echo(json.dumps([schedule.to_json() for schedule in schedules], indent=2))
        return
    if not schedules:
        click.echo('no schedules yet: impyard schedule add IMP --every 24h "…"')
        return
    table = Table(
        Column("schedule", no_wrap=True), "imp", "when", Column("next run", no_wrap=True), "missed", "state",
        "channel", "ceiling", "runs", "prompt",
    )  # fmt: skip
    for s in schedules:
        prompt = " ".join((s.prompt or f"({s.kind})").split())
        table.add_row(
            s.id, s.imp, s.trigger.describe(), "-" if s.paused else describe_next(s), s.missed,
            "paused" if s.paused else "active", s.channel_id, format_duration(s.ceiling_s), str(s.fired),
            prompt[:50] + ("…" if len(prompt) > 50 else ""),
        )  # fmt: skip
    Console(width=max(Console().width, 160)).print(table)


@schedule_group.command("rm")
@click.argument("schedule_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def rm_command(schedule_id: str, as_json: bool) -> None:
    """Remove a schedule (tasks it already queued stay; cancel them with `impyard task cancel`).

    \b
    Example:
      impyard schedule rm s-1a2b3c4d
    """
    with schedule_store() as store:
        schedule = store.remove(schedule_id)
    if as_json:
        click.echo(json.dumps(schedule.to_json(), indent=2))
    else:
        click.echo(f"removed {schedule.id}")


@schedule_group.command("pause")
@click.argument("schedule_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def pause_command(schedule_id: str, as_json: bool) -> None:
    """Pause a schedule: it fires no more until resumed.

    \b
    Example:
      impyard schedule pause s-1a2b3c4d
    """
    with schedule_store() as store:
        schedule = store.pause(schedule_id)
    _echo(schedule, as_json, "paused")


@schedule_group.command("resume")
@click.argument("schedule_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def resume_command(schedule_id: str, as_json: bool) -> None:
    """Resume a paused schedule from now on (fires that fell in the pause are not made up for).

    \b
    Example:
      impyard schedule resume s-1a2b3c4d
    """
    with schedule_store() as store:
        schedule = store.resume(schedule_id)
    _echo(schedule, as_json, "resumed")
