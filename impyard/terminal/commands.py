"""The terminal chat's slash commands (issue 17): what a typed line asks for, and the help that lists them.

Pure: ``parse`` takes the line and returns a ``Command``, or None for a message to send to the imp;
``paste_message`` joins lines typed at once (a paste) into the one message they send (issue 19 #3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_HISTORY_SHOWN = 20
MAX_HISTORY_SHOWN = 1000

ALIASES = {"/exit": "/quit", "/?": "/help"}
COMMANDS = ("/help", "/quit", "/history", "/clear", "/mode")


def help_text(imp: str) -> str:
    return f"""\
Commands:
  /help          this list
  /history [N]   the last N messages of this conversation (default {DEFAULT_HISTORY_SHOWN}), from the host's history
  /clear         forget this conversation's history (asks first); what {imp} remembers is kept
  /mode          how {imp} is woken here: the terminal wakes it on every message
  /quit          leave, once a running turn has ended (also Ctrl-D); an imp with memory then thinks the
                 conversation over before the chat ends. Ctrl-C on an empty line stops at once (its thinking
                 waits for the next chat or supervisor)
Keys: Enter sends; Alt-Enter (or Esc, then Enter) starts a new line; Up and Down recall earlier messages.
A message that starts with / is sent as it is when it starts with //."""


@dataclass(frozen=True)
class Command:
    name: str  # one of COMMANDS, or "unknown"
    args: tuple[str, ...] = ()
    word: str = ""  # as typed


def parse(text: str) -> Command | None:
    """The command a line asks for; None for a message (``//x`` is the message ``/x``)."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    word, *args = stripped.split()
    name = ALIASES.get(word.lower(), word.lower())
    return Command(name if name in COMMANDS else "unknown", tuple(args), word)


def message_text(text: str) -> str:
    """What a line sends: ``//x`` sends ``/x``."""
    stripped = text.lstrip()
    return stripped[1:] if stripped.startswith("//") else text


def history_count(args: tuple[str, ...]) -> int | None:
    """``/history [N]``: how many messages; None when N is not a number in range."""
    if not args:
        return DEFAULT_HISTORY_SHOWN
    if len(args) == 1 and args[0].isdigit() and 1 <= int(args[0]) <= MAX_HISTORY_SHOWN:
        return int(args[0])
    return None


def mode_answer(imp: str, args: tuple[str, ...]) -> str:
    """``/mode``: channel modes choose which messages wake an imp in a Discord channel; the terminal is a
    direct conversation, woken by every message (the wake rule's DM case), so it cannot take another mode."""
    if not args or args[0] == "all":
        return (
            f"(impyard) every message here wakes {imp}: the terminal is a direct conversation. "
            "Channel modes (all, mention) are for Discord channels: impyard channel mode CHANNEL MODE"
        )
    if args[0] == "mention":
        return (
            f"(impyard) the terminal cannot use mention mode: every message here is addressed to {imp}. "
            "Set it on a Discord channel instead: impyard channel mode CHANNEL mention"
        )
    return "(impyard) the modes are all and mention (and the terminal always wakes the imp): /mode shows it"


def paste_message(lines: Sequence[str], max_chars: int) -> tuple[str, int]:
    """The message that ``lines[0]`` (a message line) starts when lines were typed at once (a paste, issue
    19 #3): it and the message lines right after it, joined by newlines as a bracketed paste sends them, so a
    pasted burst is one turn and one model call, not one per line. It ends before the first command, and
    before the line that would take it past ``max_chars`` (a longer first line stays whole, as typed).
    Returns the text and how many lines it took (at least one)."""
    taken = [message_text(lines[0])]
    size = len(taken[0])
    for line in lines[1:]:
        if parse(line) is not None:
            break  # a command is done in its place, after the message before it
        text = message_text(line)
        if size + 1 + len(text) > max_chars:
            break
        taken.append(text)
        size += 1 + len(text)
    return "\n".join(taken), len(taken)
