"""``impyard schedule``: recurring tasks (every N, or cron in a timezone) for ``impyard supervise``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click

from impyard.cli.database import database
from impyard.cli.output import Col, Output, output_options
from impyard.cli.task import task_options
from impyard.clock import SystemClock
from impyard.durations import format_duration
from impyard.imps.store import ImpError, ImpStore
from impyard.tasks import TaskError, TaskStore
from impyard.tasks.schedules import Schedule, ScheduleRequest, ScheduleStore, describe_next
from impyard.tasks.triggers import MISSED_POLICIES, ScheduleError


@contextmanager
def schedule_store() -> Iterator[ScheduleStore]:
    with database(ScheduleError, TaskError, ImpError) as db:
        clock, imps = SystemClock(), ImpStore()
        yield ScheduleStore(db, clock, TaskStore(db, clock, imps), imps)


def _echo(schedule: Schedule, out: Output, verb: str) -> None:
    state = "paused" if schedule.paused else f"next run {describe_next(schedule)}"
    out.show(
        schedule.to_json(), f"{verb} {schedule.id} for {schedule.imp}: {schedule.trigger.describe()}, {state}"
    )


SCHEDULE_COLUMNS = (
    Col("schedule", no_wrap=True), "imp", "when", Col("next run", no_wrap=True), "missed", "state",
    "channel", "ceiling", "runs", "prompt",
)  # fmt: skip


def _schedule_row(s: Schedule) -> tuple[str, ...]:
    prompt = " ".join((s.prompt or f"({s.kind})").split())
    return (
        s.id, s.imp, s.trigger.describe(), "-" if s.paused else describe_next(s), s.missed,
        "paused" if s.paused else "active", s.channel_id, format_duration(s.ceiling_s), str(s.fired),
        prompt[:50] + ("…" if len(prompt) > 50 else ""),
    )  # fmt: skip


@click.group("schedule")
def schedule_group() -> None:
    """Recurring tasks: every N, or on a cron expression in a timezone.

    \b
    Example:
      impyard schedule add pip "Morning briefing" --cron "0 9 * * 1-5" --tz Europe/Oslo
      impyard schedule ls
    """


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
@task_options(posts="Where its tasks post", box="each task's box", gated="a run", given="each run")
@output_options
def add_command(
    imp: str, prompt: str | None, every: str | None, cron: str | None, tz: str | None, missed: str, run_now: bool,
    channel_id: str | None, ceiling: str | None, kind: str, wake_on_resolve: bool, briefing: bool, out: Output,
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
    _echo(schedule, out, "added")


@schedule_group.command("ls")
@click.option("--imp", default=None, help="Only this imp's schedules.")
@output_options
def ls_command(imp: str | None, out: Output) -> None:
    """List schedules with their next run.

    \b
    Example:
      impyard schedule ls
    """
    with schedule_store() as store:
        schedules = store.all_for(imp)
    out.listing(
        [schedule.to_json() for schedule in schedules],
        columns=SCHEDULE_COLUMNS,
        rows=(_schedule_row(schedule) for schedule in schedules),
        empty='no schedules yet: impyard schedule add IMP --every 24h "…"',
        min_width=160,
    )


@schedule_group.command("rm")
@click.argument("schedule_id")
@output_options
def rm_command(schedule_id: str, out: Output) -> None:
    """Remove a schedule (tasks it already queued stay; cancel them with `impyard task cancel`).

    \b
    Example:
      impyard schedule rm s-1a2b3c4d
    """
    with schedule_store() as store:
        schedule = store.remove(schedule_id)
    out.show(schedule.to_json(), f"removed {schedule.id}")


@schedule_group.command("pause")
@click.argument("schedule_id")
@output_options
def pause_command(schedule_id: str, out: Output) -> None:
    """Pause a schedule: it fires no more until resumed.

    \b
    Example:
      impyard schedule pause s-1a2b3c4d
    """
    with schedule_store() as store:
        schedule = store.pause(schedule_id)
    _echo(schedule, out, "paused")


@schedule_group.command("resume")
@click.argument("schedule_id")
@output_options
def resume_command(schedule_id: str, out: Output) -> None:
    """Resume a paused schedule from now on (fires that fell in the pause are not made up for).

    \b
    Example:
      impyard schedule resume s-1a2b3c4d
    """
    with schedule_store() as store:
        schedule = store.resume(schedule_id)
    _echo(schedule, out, "resumed")
