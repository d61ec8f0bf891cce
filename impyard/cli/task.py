"""``impyard task``: one-shot work that ``impyard supervise`` runs in governed boxes (issue 8)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

import click

from impyard.cli.database import database
from impyard.cli.output import Col, Command, Output, output_options
from impyard.clock import SystemClock
from impyard.durations import format_duration
from impyard.imps.store import ImpError, ImpStore
from impyard.supervisor.settings import task_state_retention_from_env
from impyard.tasks import TASK_STATES, Task, TaskError, TaskRequest, TaskStore


@contextmanager
def task_store() -> Iterator[TaskStore]:
    """The task store of this IMPYARD_HOME; refusals become one-line CLI errors."""
    with database(TaskError, ImpError) as db:
        yield TaskStore(db, SystemClock(), ImpStore())


def _ago(when: datetime, now: datetime) -> str:
    delta = now - when
    if delta.total_seconds() < 0:
        return f"in {format_duration(-delta)}"
    return f"{format_duration(delta)} ago"


def when_text(task: Task, now: datetime) -> str:
    """What a listing says about time: how long a task has run, or when it will or did."""
    if task.state == "running":
        elapsed = task.elapsed(now)
        return f"running {format_duration(elapsed) if elapsed else '0s'}"
    if task.state == "queued":
        if task.not_before > now:
            prefix = "deferred, runs" if task.deferrals else "due"
            return f"{prefix} {task.not_before:%Y-%m-%d %H:%M} UTC"
        return "due now"
    if task.finished_at is not None:
        took = task.elapsed(now)
        return f"{_ago(task.finished_at, now)}" + (f" (took {format_duration(took)})" if took else "")
    return _ago(task.updated_at, now)


def _one_line(text: str | None, limit: int = 70) -> str:
    flat = " ".join((text or "").split())
    return flat[:limit] + ("…" if len(flat) > limit else "")


TASK_COLUMNS = (
    Col("task", no_wrap=True), "imp", "kind", "origin", "state", "tries", Col("when", no_wrap=True),
    "channel", "outcome",
)  # fmt: skip


def _task_row(task: Task, now: datetime) -> tuple[str, ...]:
    state = task.state + (" (cancelling)" if task.cancel_requested and task.state == "running" else "")
    return (
        task.id, task.imp, task.kind, task.origin, state, str(task.attempts), when_text(task, now),
        task.channel_id, _one_line(task.outcome),
    )  # fmt: skip


@click.group("task")
def task_group() -> None:
    """One-shot tasks: run in a box by `impyard supervise` (or `impyard serve --supervise`), governed like chat.

    \b
    Example:
      impyard task add pip "Summarise the week"
      impyard task ls --state running
    """


def task_options(*, posts: str, box: str, gated: str, given: str) -> Callable[[Command], Command]:
    """The options of what a task is asked to do (``ValidTask``), shared by ``task add`` and ``schedule add``;
    the words name what each command's options apply to (``posts``: "Where the task posts", ...)."""
    options = (
        click.option(
            "--channel", "channel_id", default=None,
            help=f"{posts} (default: the imp's task log, task:IMP); a Discord channel needs `impyard serve --supervise`.",
        ),
        click.option("--ceiling", default=None, help=f"Longest {box} may run, 10s to 6h (default 10m)."),
        click.option(
            "--kind", default="prompt", show_default=True, help="Task kind (an open set; the box decides what it means)."
        ),
        click.option(
            "--wake-on-resolve", is_flag=True, help=f"When a gated post of {gated} is decided, queue a follow-up task."
        ),
        click.option("--briefing", is_flag=True, help=f"Give {given} the imp's journal of its recent task outcomes."),
    )  # fmt: skip

    def apply(command: Command) -> Command:
        for option in reversed(options):  # the first option outermost: first in --help
            command = option(command)
        return command

    return apply


@task_group.command("add")
@click.argument("imp")
@click.argument("prompt", required=False)
@task_options(posts="Where the task posts", box="the box", gated="this task", given="the box")
@output_options
def add_command(
    imp: str, prompt: str | None, channel_id: str | None, ceiling: str | None, kind: str, wake_on_resolve: bool,
    briefing: bool, out: Output,
) -> None:  # fmt: skip
    """Queue a task for IMP; a running `impyard supervise` (or `serve --supervise`) starts it within a second.

    \b
    Examples:
      impyard task add pip "Post a short summary of today's release notes" --channel 123456789012345678
      impyard task add pip "Draft next week's plan" --ceiling 20m --briefing
    """
    with task_store() as store:
        task = store.add(
            TaskRequest(
                imp=imp, prompt=prompt, kind=kind, channel_id=channel_id, ceiling=ceiling,
                wake_on_resolve=wake_on_resolve, briefing=briefing,
            )
        )  # fmt: skip
    out.show(
        task.to_json(SystemClock().now()),
        f"queued {task.id} for {task.imp} (channel {task.channel_id}, ceiling {format_duration(task.ceiling_s)})",
    )


@task_group.command("ls")
@click.option("--imp", default=None, help="Only this imp's tasks.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(TASK_STATES),
    help="Only tasks in this state (repeatable).",
)
@click.option(
    "-n",
    "limit",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="How many (newest first).",
)
@output_options
def ls_command(imp: str | None, states: tuple[str, ...], limit: int, out: Output) -> None:
    """List tasks, newest first; running ones show how long they have run.

    \b
    Examples:
      impyard task ls
      impyard task ls --imp pip --state running --state queued
    """
    with task_store() as store:
        tasks = store.latest(imp=imp, states=states or None, limit=limit)
    now = SystemClock().now()
    out.listing(
        [task.to_json(now) for task in tasks],
        columns=TASK_COLUMNS,
        rows=(_task_row(task, now) for task in tasks),
        empty="no tasks" + (" in that selection" if imp or states else ' yet: impyard task add IMP "…"'),
        min_width=160,
    )


def describe(store: TaskStore, task: Task, now: datetime) -> str:
    lines = [f"task {task.id}: {task.state}" + (" (cancel requested)" if task.cancel_requested else "")]
    origin: str = task.origin
    if task.schedule_id:
        origin += f" {task.schedule_id}" + (
            f", for {task.scheduled_for:%Y-%m-%d %H:%M} UTC" if task.scheduled_for else ""
        )
    if task.parent_task:
        origin += f" of {task.parent_task} (gate {task.parent_gate})"
    lines += [
        f"  imp        {task.imp}   kind {task.kind}   origin {origin}",
        f"  channel    {task.channel_id}",
        f"  ceiling    {format_duration(task.ceiling_s)}   attempts {task.attempts}   deferrals {task.deferrals}"
        f"   wake on resolve {'yes' if task.wake_on_resolve else 'no'}   briefing {'yes' if task.briefing else 'no'}",
        f"  created    {task.created_at:%Y-%m-%d %H:%M:%S} UTC",
        f"  when       {when_text(task, now)}",
    ]
    if task.outcome:
        lines.append(f"  outcome    {task.outcome}   (attested by the host)")
    if task.box_outcome:
        lines.append(
            f"  box said   {task.box_outcome}: {_one_line(task.box_summary, 300) or '-'}   (its own report)"
        )
    if task.prompt:
        lines.append("  prompt     " + task.prompt.strip().replace("\n", "\n             "))
    lines.append(f"  state      {state_line(task)}")
    runs = store.runs(task.id)
    if runs:
        lines.append("runs:")
        for run in runs:
            finished = f", finished {run.finished_at:%H:%M:%S}" if run.finished_at else ""
            lines.append(
                f"  {run.attempt}. run {run.run_id}  {run.backend}  started {run.started_at:%Y-%m-%d %H:%M:%S}"
                f"{finished}  {run.result or 'running'}"
                + (f" (exit {run.returncode})" if run.returncode is not None else "")
            )
    gates = store.gates_of(task.id)
    if gates:
        lines.append("gates:")
        for gate in gates:
            lines.append(f"  {gate.id}  {gate.state}  {gate.act} to {gate.target}  ({gate.reason})")
    trail = store.audit_trail(task.id)
    lines.append("audit trail:" if trail else "audit trail: none yet")
    for record in trail:
        cost = f" ${record.cost_micros / 1_000_000:.6f}" if record.cost_micros else ""
        lines.append(
            f"  {record.at:%H:%M:%S} {record.method} {record.purpose} -> {record.verdict}{cost}"
            f"  {_one_line(record.reason or record.detail, 90)}"
        )
    return "\n".join(lines)


def state_line(task: Task) -> str:
    """Where the task's own /state (its box's call log and scratch) is, and when the supervisor removes it."""
    path = ImpStore().task_state_dir(task.imp, task.id)
    retention = task_state_retention_from_env()
    kept = (
        "kept"
        if retention is None
        else f"removed {format_duration(int(retention.total_seconds()))} after it finished"
    )
    return f"{path}" + ("" if path.is_dir() else " (not there: pruned, or never made)") + f"   {kept}"


@task_group.command("show")
@click.argument("task_id")
@output_options
def show_command(task_id: str, out: Output) -> None:
    """Show one task with its runs, gates and audit trail.

    \b
    Example:
      impyard task show t-1a2b3c4d5e
    """
    now = SystemClock().now()
    with task_store() as store:
        task = store.get(task_id)
        if out.as_json:
            data = task.to_json(now)
            data["state_dir"] = str(ImpStore().task_state_dir(task.imp, task.id))
            data["runs"] = [run.to_json() for run in store.runs(task.id)]
            data["gates"] = [gate.to_json() for gate in store.gates_of(task.id)]
            data["audit"] = [record.to_json() for record in store.audit_trail(task.id)]
            out.json(data)
            return
        click.echo(describe(store, task, now))


@task_group.command("cancel")
@click.argument("task_id")
@output_options
def cancel_command(task_id: str, out: Output) -> None:
    """Cancel a queued task, or stop a running one (its supervisor kills the box).

    \b
    Example:
      impyard task cancel t-1a2b3c4d5e
    """
    with task_store() as store:
        task = store.request_cancel(task_id)
    if task.state == "cancelled":
        text = f"cancelled {task.id}; it will not run"
    else:
        text = f"cancel requested for {task.id}; the running supervisor kills its box within a second"
    out.show(task.to_json(SystemClock().now()), text)
