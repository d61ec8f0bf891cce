"""``impyard now``: what every host on this database is doing now — the console's Now page, on the command line.

Read through ``impyard.conversation.activity.read_now`` (the page calls the same function): turns in flight with
their stage, messages queued, warm boxes, task runs under way, and the newest turn outcomes. Only hosts that hold
their lease record are shown, so a host that was killed or lost the database is never listed as live.
"""

from __future__ import annotations

from datetime import datetime

import click
from rich.markup import escape

from impyard.cli.database import database
from impyard.cli.output import Col, Output, output_options
from impyard.conversation.activity import MAX_RECENT_OUTCOMES, RECENT_OUTCOMES, Now, read_now
from impyard.durations import format_duration

SESSION_COLUMNS = (
    "imp", "channel", "surface", Col("stage", no_wrap=True), Col("for", no_wrap=True), "messages", "queued", "box",
    Col("host", no_wrap=True), Col("pid", no_wrap=True),
)  # fmt: skip
TASK_COLUMNS = (
    "task",
    "imp",
    "kind",
    "channel",
    Col("running", no_wrap=True),
    Col("host", no_wrap=True),
    "pid",
)
OUTCOME_COLUMNS = (
    Col("finished", no_wrap=True), "imp", "channel", "surface", "outcome", "messages", Col("took", no_wrap=True),
    "error",
)  # fmt: skip
NOTHING = (
    "no host is running on this database: each `impyard chat` and `impyard serve` shows here while it runs"
)


def _since(when: datetime | None, now: datetime) -> str:
    return format_duration(now - when) if when is not None else "-"


def _session_rows(now: Now) -> list[tuple[str, ...]]:
    turns = now.turns
    rest = [s for s in now.sessions if not s.in_turn]
    return [
        tuple(
            escape(cell)
            for cell in (
                s.imp,
                s.channel,
                s.surface,
                s.stage or "idle",
                _since(s.stage_since or s.turn_since, now.at) if s.in_turn else "-",
                str(s.in_turn) if s.in_turn else "-",
                str(s.waiting),
                "warm" if s.warm else "-",
                s.hostname,
                str(s.pid or "?"),
            )  # fmt: skip
        )
        for s in [*turns, *rest]
    ]


def _task_rows(now: Now) -> list[tuple[str, ...]]:
    return [
        tuple(
            escape(cell)
            for cell in (
                t.task_id,
                t.imp,
                t.kind,
                t.channel,
                _since(t.started_at, now.at),
                t.hostname or "?",
                str(t.pid or "?"),
            )  # fmt: skip
        )
        for t in now.tasks
    ]


def _outcome_rows(now: Now) -> list[tuple[str, ...]]:
    return [
        tuple(
            escape(cell)
            for cell in (
                f"{_since(o.finished_at, now.at)} ago",
                o.imp,
                o.channel,
                o.surface,
                o.outcome,
                str(o.messages),
                format_duration(o.took_s) if o.took_s is not None else "-",
                o.error or "",
            )  # fmt: skip
        )
        for o in now.recent
    ]


@click.command("now")
@click.option(
    "--recent",
    type=click.IntRange(0, MAX_RECENT_OUTCOMES),
    default=RECENT_OUTCOMES,
    show_default=True,
    help="How many of the newest turn outcomes to list.",
)
@output_options
def now_command(recent: int, out: Output) -> None:
    """Show what every host on this database is doing now: turns in flight and their stage, queued messages,
    warm boxes, task runs, and the newest turn outcomes.

    \b
    A turn's stage is reading (history and memories), thinking (the model's
    reply calls), writing (the reply made and posted) or remembering (history
    and memory kept after delivery); starting before its box said one.
    Hosts publish this about once a second. No message text is shown.
    Examples:
      impyard now
      impyard now --recent 50 --json
    """
    with database() as db:
        found = read_now(db, recent=recent)
    if out.as_json:
        out.json(found.as_json())
        return
    if not found.hosts and not found.recent and not found.tasks:
        click.echo(NOTHING)
        return
    shown = False
    for title, columns, rows in (
        ("Sessions", SESSION_COLUMNS, _session_rows(found)),
        ("Task runs", TASK_COLUMNS, _task_rows(found)),
        ("Recent outcomes", OUTCOME_COLUMNS, _outcome_rows(found)),
    ):
        if rows:
            if shown:
                click.echo()
            out.table(columns, rows, title=title)
            shown = True
    if not shown:
        hosts = ", ".join(f"{h.hostname} ({h.command}, pid {h.pid or '?'})" for h in found.hosts)
        click.echo(f"nothing in flight; running: {hosts}")
