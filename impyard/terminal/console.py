"""Where the terminal chat reads what the person types and shows what happens (issue 17).

Two consoles with one surface: ``PromptConsole`` when stdin and stdout are a terminal (prompt_toolkit: line
editing, recall, multi-line input, bracketed pastes of any length, a status line, output printed above the
prompt), and ``PlainConsole`` for pipes and scripts (one message a line, no length cut, each turn awaited
before the next line is read). Neither reads the text: the chat decides what a line means.

Lines already typed when one is read (a paste into a terminal that does not bracket it) are handed over
together by ``typed_ahead``, so the chat sends them as one message (issue 19 #3); a pipe's lines never are:
a script's next line waits for the answer to the one before.
"""

from __future__ import annotations

import logging
import os
import select
import sys
from types import TracebackType
from typing import Protocol, TextIO

import anyio
from prompt_toolkit import PromptSession
from prompt_toolkit.application import get_app, run_in_terminal
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input.typeahead import get_typeahead, store_typeahead
from prompt_toolkit.key_binding import KeyBindings, KeyPress, KeyPressEvent
from prompt_toolkit.keys import Keys
from prompt_toolkit.patch_stdout import StdoutProxy
from prompt_toolkit.styles import Style

log = logging.getLogger("impyard.chat")

PROMPT = "you> "  # scripts and tests wait for it
CONTINUATION = "...  "  # the prompt of a message's further lines, as wide as PROMPT
DIM, UNDIM = "\x1b[2m", "\x1b[22m"  # SGR faint on, then off: a quiet line on a terminal


class Interrupted(Exception):
    """Ctrl-C on an empty line: the person wants the chat to stop now."""


class Console(Protocol):
    interactive: bool  # True: messages may be sent while a turn runs (they queue)

    async def __aenter__(self) -> Console: ...
    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def say(self, text: str) -> None:
        """Show a line (or lines) to the person, above the prompt when one is open."""

    def aside(self, text: str) -> None:
        """A quiet line about what the host does meanwhile (dim on a terminal)."""

    def set_status(self, text: str | None) -> None:
        """Where the running turn is (None: no turn runs)."""

    async def read(self) -> str | None:
        """The next message or command; None when the input ended (Ctrl-D, end of a pipe)."""

    def typed_ahead(self) -> list[str]:
        """Whole lines the person already typed after the one ``read`` returned (a paste), without waiting;
        [] when none (or for a pipe: a script's lines are one message each)."""

    async def confirm(self, question: str) -> bool:
        """Ask a yes/no question; anything but yes is no."""


def is_terminal(stdin: TextIO, stdout: TextIO) -> bool:
    try:
        return stdin.isatty() and stdout.isatty()
    except ValueError:  # a closed stream
        return False


def open_console(stdin: TextIO | None = None, stdout: TextIO | None = None) -> Console:
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    if is_terminal(stdin, stdout) and os.environ.get("TERM", "") not in ("", "dumb"):
        return PromptConsole()
    return PlainConsole(stdin.fileno(), stdout)


# ------------------------------------------------------------------ pipes and scripts


class LineReader:
    """Reads lines from a file descriptor without a thread, so a signal can always end the wait.

    No line is cut: a line is whatever came before the newline, however long."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self._eof = False

    async def readline(self) -> str | None:
        while b"\n" not in self._buffer and not self._eof:
            await anyio.wait_readable(self.fd)
            chunk = os.read(self.fd, 65536)  # readable: returns at once, never blocks
            self._eof = not chunk
            self._buffer += chunk
        if b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
        elif self._buffer:
            line, self._buffer = self._buffer, b""
        else:
            return None
        return line.decode("utf-8", errors="replace").rstrip("\r")

    def ready_lines(self) -> list[str]:
        """Every whole line that can be read now without waiting (a half-typed last line stays for later)."""
        while not self._eof and select.select([self.fd], [], [], 0)[0]:
            chunk = os.read(self.fd, 65536)  # readable: returns at once (a terminal gives a line a read)
            self._eof = not chunk
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line.decode("utf-8", errors="replace").rstrip("\r") for line in lines]


class PlainConsole:
    """One message a line; what was read is echoed after the prompt when stdin is not a terminal, so the
    output reads as a transcript."""

    interactive = False

    def __init__(self, fd: int, out: TextIO) -> None:
        self.reader = LineReader(fd)
        self.out = out
        self.echo = not os.isatty(fd)

    async def __aenter__(self) -> PlainConsole:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.out.flush()

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def aside(self, text: str) -> None:
        self.say(text)  # a pipe gets no escape sequences

    def set_status(self, text: str | None) -> None:
        pass  # nobody watches a pipe wait; the outcome is said when the turn ends

    async def read(self) -> str | None:
        self.out.write(PROMPT)
        self.out.flush()
        line = await self.reader.readline()
        if self.echo:
            self.out.write(f"{line}\n" if line is not None else "\n")
            self.out.flush()
        return line

    def typed_ahead(self) -> list[str]:
        if self.echo:
            return []  # a pipe: each line is its own message, answered before the next is read
        return self.reader.ready_lines()  # a terminal: a paste arrived whole before its first line was read

    async def confirm(self, question: str) -> bool:
        self.out.write(f"{question} [y/N] ")
        self.out.flush()
        answer = await self.reader.readline()
        if self.echo:
            self.out.write(f"{answer or ''}\n")
        return (answer or "").strip().lower() in ("y", "yes")


# ------------------------------------------------------------------ a terminal


class PromptConsole:
    """prompt_toolkit's prompt, with the turn's status on the line above it while a turn runs."""

    interactive = True

    def __init__(self) -> None:
        self._status: str | None = None
        self.style = Style.from_dict(
            # A colour, even the default one, makes the renderer write the prompt's trailing space (a bare
            # space at the end of a line is left out), so "you> " is there for scripts and tests to see.
            {"status": "italic fg:ansibrightblack", "prompt": "bold fg:ansidefault"}
        )
        self.session: PromptSession[str] = PromptSession(
            history=InMemoryHistory(),  # this run's messages: Up and Down recall them
            key_bindings=_key_bindings(),
            prompt_continuation=CONTINUATION,
            style=self.style,
            erase_when_done=False,
        )
        # A terminal that never answers a cursor position request: the log says so, never the conversation.
        self.session.app.renderer.cpr_not_supported_callback = _no_cpr

    async def __aenter__(self) -> PromptConsole:
        self._proxy = StdoutProxy(raw=True)  # whatever else prints lands above the prompt, never inside it
        self._saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = self._proxy
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        sys.stdout, sys.stderr = self._saved
        self._proxy.close()  # flushes what is left

    def say(self, text: str) -> None:
        """Written in order, at once: above the prompt while one is open, else straight to the terminal."""
        output = self.session.app.output

        def write() -> None:
            # The tty still turns \n into \r\n: prompt_toolkit's raw mode keeps output processing.
            output.write_raw(text + "\n")
            output.flush()

        if self.session.app.is_running:
            run_in_terminal(write)  # erases the prompt, writes, draws the prompt again below
        else:
            write()

    def aside(self, text: str) -> None:
        self.say(f"{DIM}{text}{UNDIM}")

    def set_status(self, text: str | None) -> None:
        self._status = text
        if self.session.app.is_running:
            self.session.app.invalidate()

    def _message(self) -> StyleAndTextTuples:
        if self._status and not get_app().is_done:
            # Its own style class per text: the renderer redraws the whole line, never a diff of two words.
            key = "".join(ch for ch in self._status if ch.isalnum())[:40]
            return [(f"class:status class:status-{key}", self._status), ("", "\n"), ("class:prompt", PROMPT)]
        return [("class:prompt", PROMPT)]

    async def read(self) -> str | None:
        try:
            return await self.session.prompt_async(
                self._message, handle_sigint=False, set_exception_handler=False
            )
        except EOFError:
            return None
        except KeyboardInterrupt:
            raise Interrupted() from None

    def typed_ahead(self) -> list[str]:
        """A paste the terminal did not bracket arrives as keys with Enters among them: the first Enter ended
        the prompt, and prompt_toolkit kept the keys it had read past it. Their whole lines are handed over
        (issue 19 #3: one message, one model call); anything else — a half line, an edit key — stays for the
        next prompt, as typed. A bracketed paste arrives as one message already."""
        lines, rest = typed_lines(get_typeahead(self.session.input))
        store_typeahead(self.session.input, rest)
        return lines

    async def confirm(self, question: str) -> bool:
        asker: PromptSession[str] = PromptSession(style=self.style)
        asker.app.renderer.cpr_not_supported_callback = _no_cpr
        try:
            answer = await asker.prompt_async(
                f"{question} [y/N] ", handle_sigint=False, set_exception_handler=False
            )
        except (EOFError, KeyboardInterrupt):
            return False
        return answer.strip().lower() in ("y", "yes")


_ENTER = (Keys.ControlM, Keys.ControlJ)


def typed_lines(keys: list[KeyPress]) -> tuple[list[str], list[KeyPress]]:
    """The whole lines among keys read ahead (plain characters, each line ended by Enter), and the keys from the
    first that is not part of one: a half line, or a key that edits (an arrow, Backspace, Alt-Enter) — the prompt
    must see those as typed."""
    lines: list[str] = []
    start = 0
    line: list[str] = []
    for index, press in enumerate(keys):
        if press.key in _ENTER:
            lines.append("".join(line))
            line, start = [], index + 1
        elif isinstance(press.key, str) and len(press.key) == 1 and press.key.isprintable():
            line.append(press.key)  # a character key is the character itself
        else:
            break
    return lines, keys[start:]


def _no_cpr() -> None:
    log.info("the terminal does not answer cursor position requests")


def _key_bindings() -> KeyBindings:
    bindings = KeyBindings()

    @bindings.add("escape", "enter")  # Alt-Enter sends ESC then Enter: a new line in the message
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.newline(copy_margin=False)

    @bindings.add("c-c")
    def _interrupt(event: KeyPressEvent) -> None:
        if event.current_buffer.text:
            event.current_buffer.reset()  # Ctrl-C clears a half-typed message …
        else:
            event.app.exit(exception=KeyboardInterrupt())  # … and on an empty line stops the chat

    return bindings
