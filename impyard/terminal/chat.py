"""The terminal surface: ``impyard chat <imp>`` — the whole pipeline, with the operator as the person.

Terminal messages wake the imp always (like a DM) and are framed ``respond``;
the terminal channel is trusted, so the imp's replies there are auto-approved,
while every other act is judged by the gateway as usual.

What the person sees (issue 17): their prompt (``you> ``), the imp's replies (``pip> ``), where a running
turn is (a status line over the prompt), a message sent while a reply is still to come marked queued, and for
a turn that ends without a reply one line that says why. A message sent once the reply is out, while the imp
still remembers the exchange (the turn's ``post`` stage), is not marked: the person has the answer, and the
next turn takes the message when the remembering is done (issue 38). Logs go to a file (``impyard chat`` names it at the start).

Leaving with ``/quit`` or Ctrl-D is a departure (mechanism 103): a memory imp thinks the conversation over
in a ``depart`` task before the chat ends (a dim line says so). The chat runs a task loop for departures
alone meanwhile, so a person silent for 30 minutes in a long chat departs too. Ctrl-C stops the chat and
leaves the departure queued for the next chat or supervisor: the first gives a running turn its grace, the
second stops now (``impyard.terminal.stopping``).
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TextIO

import anyio
from anyio.abc import TaskGroup
from sqlalchemy.exc import SQLAlchemyError

from box.protocol.models import Author, DeliverResult, Message
from impyard.backends import BoxBackend
from impyard.backends.conduct import printable
from impyard.backends.process import NO_LOCKDOWN_WARNING
from impyard.clock import Clock, SystemClock
from impyard.conversation.inbound import MAX_TERMINAL_CHARS, Inbound
from impyard.conversation.pipeline import Routed
from impyard.failure_words import FAILURE_WORDS, REFUSED_WORDS
from impyard.gateway.surfaces import Post
from impyard.memory.departures import depart_now, wait_finished
from impyard.paths import home
from impyard.runtime import Runtime, open_runtime
from impyard.stop_signals import sole_error
from impyard.storage.leases import HostCard, LeaseKeeper, hold_host
from impyard.supervisor import DEPARTURES_ONLY, Supervisor, SupervisorSettings, open_supervisor
from impyard.terminal.commands import help_text, history_count, mode_answer, parse, paste_message
from impyard.terminal.console import Console, Interrupted, open_console
from impyard.terminal.person import TerminalPerson, account, terminal_person
from impyard.terminal.stopping import Stopping
from impyard.terminal.turn_words import outcome_line, route_line, stage_line

log = logging.getLogger("impyard.chat")

SHUTDOWN_WAIT_S = 15  # beyond the turn ceiling: the session's own ceiling ends a turn first
DEPARTURE_WAIT_S = 15  # beyond the depart task's ceiling: the supervisor's own ceiling ends it first


def shown(text: str) -> str:
    """Box text made safe for the operator's terminal: lines and tabs kept, every other control or format
    character escaped (a reply can neither repaint the screen nor forge a line of ours)."""
    return "\n".join(
        "\t".join(printable(part, len(part) * 10 + 10) for part in line.split("\t"))
        for line in text.split("\n")
    )


class ChatSurface:
    """Prints the imp's posts and notices, and shows where its turn is on the console's status line."""

    def __init__(self, imp: str, console: Console) -> None:
        self.imp = imp
        self.console = console
        self._stage: str | None = None  # the running turn's stage, as the status line shows it
        self.reply_pending = False  # a turn runs and its reply (or its silence) is still to come
        self.queued = 0  # messages said to be queued behind that reply (the next turn takes them all)
        self.unmarked = 0  # messages handed in after the reply was out (the next turn takes them too)
        self.skip_notices: frozenset[str] = frozenset()  # said better by the turn's outcome line

    def handed_in(self, outcome: str) -> bool:
        """A message was routed with ``outcome``; True when the person should read that it is queued: only
        behind a reply still to come, never behind one already shown (issue 38)."""
        if outcome == "started":
            self.reply_pending = True
        elif outcome == "queued":
            if self.reply_pending:
                self.queued += 1
                self.console.set_status(stage_line(self.imp, self._stage, self.queued))
                return True
            self.unmarked += 1
        return False

    async def send(self, post: Post) -> list[str]:
        content, files, kind = post.content, post.files, post.kind
        if kind == "notice" and (
            content in self.skip_notices or (bool(self.skip_notices) and content.startswith(REFUSED_WORDS))
        ):
            return [f"term-{uuid.uuid4().hex[:12]}"]  # the failure's own line says why (turn_words)
        label = {"notice": "(impyard)", "staff": f"{self.imp} [staff]>"}.get(kind, f"{self.imp}>")
        lines = [f"{label} {shown(content)}"]
        lines += [f"  [attached {printable(item.filename, 200)}, {len(item.data)} bytes]" for item in files]
        self.console.say("\n".join(lines))
        return [f"term-{uuid.uuid4().hex[:12]}"]

    async def typing(self, channel_id: str, active: bool, *, imp: str = "") -> None:
        pass  # the status line shows every stage (turn_stage)

    async def turn_stage(self, channel_id: str, stage: str | None, *, imp: str = "") -> None:
        self._stage = stage
        if stage is None:  # the turn ended: the next one, if any, takes every message that waited
            self.reply_pending = bool(self.queued or self.unmarked)
            self.queued = self.unmarked = 0
        else:  # PostSend comes after the reply was sent (or the turn chose silence); a failed turn sends none
            self.reply_pending = stage not in ("post", "failed")
        self.console.set_status(stage_line(self.imp, stage, self.queued))


def terminal_channel(user: str) -> str:
    """The terminal channel of a user: one chat holds it at a time, across every home on the database."""
    return f"terminal:{user}"


class Chat:
    """One conversation in the terminal: reads lines, sends messages, answers commands, explains turns."""

    def __init__(
        self,
        runtime: Runtime,
        imp: str,
        person: TerminalPerson,
        console: Console,
        surface: ChatSurface,
        clock: Clock,
        stopping: Stopping | None = None,
    ) -> None:
        self.runtime = runtime
        self.imp = imp
        self.person = person
        self.channel_id = terminal_channel(person.account)
        self.person_id = person.id  # the key of the history and the imp's memory: never the chosen name
        self.left = False  # /quit or the end of input: the person left (a departure); Ctrl-C is not one
        self.console = console
        self.surface = surface
        self.clock = clock
        self.turn_ceiling_s = runtime.conversations.settings_for(imp).turn_ceiling_s
        self.running = 0  # turns this chat waits on
        self._explained: DeliverResult | None = None  # a batch's one result, said once
        self.typed: deque[str] = deque()  # lines typed ahead (a paste), not yet handled
        self.stopping = stopping or Stopping()

    async def run(self) -> None:
        """Until /quit or the end of input, then the running turn's answer; Ctrl-C stops (``Stopping``)."""
        async with anyio.create_task_group() as turns:  # one task per turn this chat still explains
            while True:
                try:
                    line = await self.next_line()
                except Interrupted:
                    turns.cancel_scope.cancel()  # running turns get their grace as the runtime closes
                    self.stopping.request()  # the first request: Ctrl-C on the prompt is a key, not a signal
                    return
                if line is None or not await self.handle(line, turns):
                    self.left = True
                    break
            if self.running:
                self.console.say(f"(impyard) waiting for {self.imp}'s turn to end (Ctrl-C stops at once)…")
                self.stopping.already_stopping()  # so the next Ctrl-C stops now
            turns.cancel_scope.deadline = anyio.current_time() + self.turn_ceiling_s + SHUTDOWN_WAIT_S

    async def next_line(self) -> str | None:
        """The next line to handle: one typed ahead first, else one read (with what was typed after it)."""
        if self.typed:
            return self.typed.popleft()
        line = await self.console.read()
        if line is not None:
            self.typed.extend(self.console.typed_ahead())
        return line

    async def handle(self, line: str, turns: TaskGroup) -> bool:
        """One line; False when it asks to leave. A message takes the message lines typed after it along
        (a paste: one message, one turn, one model call; issue 19 #3)."""
        if not line.strip():
            return True
        command = parse(line)
        if command is None:
            text, taken = paste_message([line, *self.typed], MAX_TERMINAL_CHARS)
            for _ in range(taken - 1):
                self.typed.popleft()
            await self.send(text, turns)
            return True
        if command.name == "/quit":
            return False
        if command.name == "/help":
            self.console.say(help_text(self.imp))
        elif command.name == "/mode":
            self.console.say(mode_answer(self.imp, command.args))
        elif command.name == "/history":
            await self.show_history(command.args)
        elif command.name == "/clear":
            await self.clear()
        else:
            self.console.say(f"(impyard) unknown command {command.word}: /help lists them (// sends a /)")
        return True

    async def send(self, text: str, turns: TaskGroup) -> None:
        message = Message(
            id=f"t-{uuid.uuid4().hex[:16]}", author=Author(id=self.person_id, name=self.person.name),
            content=text, created_at=self.clock.now(),
        )  # fmt: skip
        inbound = Inbound(
            surface="terminal", channel_id=self.channel_id, channel_kind="terminal", message=message,
            channel_name="terminal", max_chars=MAX_TERMINAL_CHARS,
        )  # fmt: skip
        routed = await self.runtime.conversations.route(self.imp, inbound)
        marked = self.surface.handed_in(routed.outcome)
        said = route_line(self.imp, routed.outcome) if marked or routed.outcome != "queued" else None
        if said:
            self.console.say(said)
        if routed.turn is None:
            return
        self.running += 1
        if self.console.interactive:
            turns.start_soon(self.explain, routed)  # the prompt stays open: the next message queues
        else:
            await self.explain(routed)  # a script's next line waits for this answer

    async def explain(self, routed: Routed) -> None:
        """Say what became of the turn that answers this message, once per turn."""
        try:
            with anyio.move_on_after(self.turn_ceiling_s + SHUTDOWN_WAIT_S):
                result = await routed.finished()
                if result is not None and result is not self._explained:
                    self._explained = result
                    said = outcome_line(self.imp, result)
                    if said:
                        self.console.say(said)
        finally:
            self.running -= 1

    async def confirm(self, question: str) -> bool:
        """The console's yes/no, or the line typed ahead after the command (pasted along with it)."""
        if not self.typed:
            return await self.console.confirm(question)
        answer = self.typed.popleft()
        self.console.say(f"{question} [y/N] {shown(answer)}")
        return answer.strip().lower() in ("y", "yes")

    async def depart(self, departures: Supervisor) -> None:
        """Mechanism 103: the person left, so a memory imp thinks the conversation over now, in a ``depart``
        task run by the chat's departures loop. Bounded by the task's ceiling; Ctrl-C leaves it queued."""
        config = self.runtime.conversations.configs.get(self.imp)
        db = self.runtime.db
        task_id = await db.run(
            depart_now, db, departures.tasks, self.imp, self.channel_id, self.person_id,
            memory=bool(config and config.memory.enabled),
        )  # fmt: skip
        if task_id is None:
            return  # memory off, nothing said, or this stretch of talk was thought over already
        self.console.aside(f"{self.imp} is thinking over the conversation…")
        departures.wake()
        task = await db.run(departures.tasks.get, task_id)
        task = await wait_finished(db, departures.tasks, task_id, task.ceiling_s + DEPARTURE_WAIT_S)
        if task.state in ("queued", "running"):
            self.console.say(
                f"(impyard) {self.imp} will think it over later: the next chat or supervisor runs task {task_id}"
            )
        elif task.state != "done":
            self.console.say(f"(impyard) {self.imp} could not think it over: {task.outcome or task.state}")

    async def show_history(self, args: tuple[str, ...]) -> None:
        from impyard.conversation.history import transcript  # the lines `impyard history show` prints

        count = history_count(args)
        if count is None:
            self.console.say("(impyard) use /history or /history N, with N from 1 to 1000")
            return
        messages = await self.runtime.history.db.run(
            self.runtime.history.shown, self.imp, [self.channel_id], count
        )
        if not messages:
            self.console.say("(impyard) no history in this conversation yet")
            return
        self.console.say("\n".join(transcript(self.imp, messages)))

    async def clear(self) -> None:
        count = await self.runtime.history.db.run(self.runtime.history.count, self.channel_id)
        if not count:
            self.console.say("(impyard) this conversation has no history to forget")
            return
        question = (
            f"Forget the {count} messages of this conversation ({self.channel_id})? This cannot be undone; "
            f"what {self.imp} remembers is kept."
        )
        if not await self.confirm(question):
            self.console.say("(impyard) kept the history")
            return
        removed = await self.runtime.history.db.run(self.runtime.history.clear, self.channel_id)
        try:  # the imp's own copy of its exchanges (kept by the host, issue 22) is merged into its prompt: it goes too
            await self.runtime.host.responder_history.db.run(
                self.runtime.host.responder_history.forget_channel, self.channel_id
            )
        except (OSError, sqlite3.Error, SQLAlchemyError) as exc:
            log.warning("could not forget %s in %s's own history lines: %s", self.channel_id, self.imp, exc)
            self.console.say(
                f"(impyard) forgot {removed} messages on the host, but not {self.imp}'s own copy of its "
                f"replies ({exc}): they may still reach its next prompt"
            )
            return
        self.console.say(
            f"(impyard) forgot {removed} messages: {self.imp}'s next reply starts without them. What "
            f"{self.imp} remembers is separate (impyard memory show {self.imp}; impyard memory forget)."
        )


async def run_chat(
    imp: str,
    *,
    backend: str | None = None,
    stdin: TextIO | None = None,
    out: TextIO | None = None,
    log_path: Path | None = None,
    backends: Mapping[str, BoxBackend] | None = None,
    departures: SupervisorSettings | None = None,
    as_name: str | None = None,
) -> None:
    """``backends``: each imp's backend, for its sessions and its tasks (tests); ``departures``: the settings of
    the chat's departures loop (its kinds are always ``depart`` alone); ``as_name``: what the imp calls the
    person (``--as``; else the imp's ``[terminal] name``, else the account's: ``impyard.terminal.person``)."""
    clock = SystemClock()
    user = account()
    settings = replace(departures or SupervisorSettings(), kinds=DEPARTURES_ONLY)
    card = HostCard("chat", str(home()))
    stopping = Stopping()
    starting = anyio.CancelScope()  # the chat's start and life: cancelled by a stop request before it is up

    def stop_starting(by_signal: bool) -> None:
        log.warning("stop requested during start-up: stopping before the chat starts; what started is closed")
        shown = out or sys.stdout
        shown.write(("\n" if by_signal else "") + "(impyard) stopping before the chat started\n")
        shown.flush()
        starting.cancel()

    keeper: LeaseKeeper | None = None
    try:
        async with anyio.create_task_group() as signals:
            # Ctrl-C and SIGTERM are received for the chat's whole life, its closing included (issue 38); one
            # before the chat is up stops its start (what started is closed: the lease, the boxes).
            await signals.start(stopping.receive_signals, name="stop signals")
            stopping.gently = stopping.now = stop_starting  # until the chat is up (``_chat`` sets its own)
            try:
                with starting:
                    # Issue 21: one chat per terminal channel on the database (LeaseHeld names the holder, before
                    # anything starts), and this process's own record for `impyard hosts`.
                    async with hold_host(card, [f"channel:{terminal_channel(user)}"]) as keeper:
                        console = open_console(stdin, out)
                        await _chat(
                            imp, console, clock, user, settings, card, keeper, backend, log_path, backends,
                            stopping, as_name,
                        )  # fmt: skip
            finally:
                stopping.forget_handlers()
                signals.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise sole_error(group) from None
    if keeper is not None and keeper.lost_error is not None:
        raise keeper.lost_error  # after every box closed: the chat exits 1, naming the lease and its taker


async def _chat(
    imp: str,
    console: Console,
    clock: Clock,
    user: str,
    settings: SupervisorSettings,
    card: HostCard,
    keeper: LeaseKeeper,
    backend: str | None,
    log_path: Path | None,
    backends: Mapping[str, BoxBackend] | None,
    stopping: Stopping,
    as_name: str | None,
) -> None:
    async with console:
        surface = ChatSurface(imp, console)
        async with (
            open_runtime(
                [imp], surface, backend=backend, clock=clock, backends=dict(backends) if backends else None
            ) as runtime,
            open_supervisor(  # no lock: `impyard supervise` may run beside it
                host=runtime.host, backend=backend, settings=settings,
                backend_for=backends.__getitem__ if backends else None,
                spares=runtime.sessions.spares,  # issue 37: a departure takes the imp's spare box
            ) as departing,
        ):  # fmt: skip
            failure_notice = runtime.conversations.settings_for(imp).failure_notice
            # issue 19 #5: the turn's outcome line says which failure, with its detail: one line, not two
            surface.skip_notices = frozenset({failure_notice, *FAILURE_WORDS} if failure_notice else ())
            chosen = runtime.backends[imp].name
            if chosen == "process":
                console.say(f"\n!!! {NO_LOCKDOWN_WARNING}\n")
            person = terminal_person(as_name, runtime.conversations.configs[imp].terminal.name, user)
            console.say(
                f"Chatting with {imp} ({chosen} backend) as {shown(person.name)}. /help lists the commands; "
                "/quit leaves."
            )
            if log_path is not None:
                console.say(f"Log: {log_path}")
            chat = Chat(runtime, imp, person, console, surface, clock, stopping)
            async with anyio.create_task_group() as tg:

                def stop_gently(by_signal: bool) -> None:
                    line = "(impyard) stopping…"
                    if runtime.sessions.turns_running:
                        line = (
                            f"(impyard) stopping: {imp}'s turn gets a moment to end (Ctrl-C again stops now)…"
                        )
                    console.say(("\n" if by_signal else "") + line)  # after the ^C the terminal echoed
                    tg.cancel_scope.cancel()  # a running turn gets its grace while the runtime closes

                def stop_now(by_signal: bool) -> None:
                    cut = f": {imp}'s turn is cut off" if runtime.sessions.turns_running else ""
                    console.say(("\n" if by_signal else "") + f"(impyard) stopping now{cut}")
                    tg.cancel_scope.cancel()
                    runtime.sessions.hurry()  # no grace: the boxes are killed at once

                stopping.gently, stopping.now = stop_gently, stop_now
                if stopping.requests:  # asked before the chat was up
                    tg.cancel_scope.cancel()

                def lease_lost(why: str) -> None:
                    log.error("%s; stopping", why)
                    console.say(f"(impyard) {why}; stopping")
                    tg.cancel_scope.cancel()

                keeper.on_lost = lease_lost
                runtime.gateway.lease_guard = keeper  # a chat that lost its channel acts no more
                card.warm_boxes = lambda: len(runtime.sessions.sessions)
                card.boxes = runtime.boxes  # per imp, with their runtime (the console's Imps page)
                card.imp_revisions = runtime.imp_revisions  # issue 36: which settings it runs
                card.spare_boxes = runtime.sessions.spares.waiting  # issue 37
                if keeper.lost is not None:
                    lease_lost(keeper.lost)
                tg.start_soon(partial(departing.run, stop=anyio.Event()), name="departures")
                await chat.run()
                if chat.left:
                    await chat.depart(departing)
                tg.cancel_scope.cancel()  # a departure still running is requeued for the next run
        console.say("(impyard) bye")
