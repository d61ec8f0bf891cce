"""``impyard chat [IMP]``: talk to an imp in the terminal, through the whole pipeline."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

import anyio
import click

from impyard.backends import BoxError
from impyard.cli.errors import CliError
from impyard.cli.shared_imps import bring_up_to_date
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.policy import PolicyError
from impyard.imps.config import new_imp_settings
from impyard.imps.store import ImpError, ImpStore
from impyard.paths import home
from impyard.storage.db import DatabaseError
from impyard.storage.instance import AlreadyRunning, InstanceLock
from impyard.storage.leases import LeaseHeld, LeaseLost

DEFAULT_IMP = "pip"
LOG_FILE = Path("logs") / "chat.log"  # under IMPYARD_HOME
LOG_FILE_BYTES = 5 * 1024 * 1024
LOG_FILES_KEPT = 3
NO_KEY = (
    "no model key is configured: export OPENAI_API_KEY=sk-... (and, for any OpenAI-compatible server, "
    "OPENAI_BASE_URL=http://host:port/v1), then run impyard chat again"
)


def pick_imp(store: ImpStore, name: str | None) -> str:
    """The named imp; else the only one; else a first imp created with a starter persona."""
    if name:
        store.get(name)  # a clear error for an unknown imp
        return name
    names = store.names()
    if len(names) == 1:
        return names[0]
    if names:
        if sys.stdin.isatty() and sys.stdout.isatty():
            return str(click.prompt("Chat with which imp?", type=click.Choice(names), default=names[0]))
        raise CliError(f"several imps exist ({', '.join(names)}): say which, e.g. impyard chat {names[0]}")
    store.add(DEFAULT_IMP, **new_imp_settings())  # a first imp remembers (issue 23)
    click.echo(
        f"Created a first imp, {DEFAULT_IMP!r}; give it a persona in {store.path(DEFAULT_IMP) / 'persona.md'}",
        err=True,
    )
    return DEFAULT_IMP


def log_to_file(path: Path) -> None:
    """The chat's logs go to ``path``, never between the lines of the conversation (issue 17)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILES_KEPT, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(min(root.level, logging.INFO))  # a file has room for what happened; -vv adds debug
    logging.captureWarnings(True)


@click.command("chat")
@click.argument("imp", required=False)
@click.option(
    "--backend",
    type=click.Choice(["auto", "docker", "process"]),
    default=None,
    help="Override the imp's [box] backend (process has no lockdown).",
)
@click.option(
    "--as",
    "as_name",
    metavar="NAME",
    default=None,
    help="What the imp calls you (default: the imp's [terminal] name, else your account's full name or "
    "login; root is 'operator'). What it remembers of you stays yours whatever the name.",
)
def chat_command(imp: str | None, backend: str | None, as_name: str | None) -> None:
    """Chat with an imp in the terminal.

    \b
    The message goes through the whole pipeline: history, wake, framing, the
    imp's warm box and the gateway (terminal replies are auto-approved). With
    no IMP and no imps yet, a first imp called 'pip' is created; with several,
    it asks which. Type /help in the chat for its commands. Logs go to
    IMPYARD_HOME/logs/chat.log, not to the screen.

    You are known by your Unix account (the history and the imp's memory keep
    you as terminal:<account>), and called by a name: --as NAME, else
    [terminal] name in the imp's imp.toml, else your account's full name or
    login ('operator' for root). Changing the name keeps what the imp
    remembers of you.

    A message sent while the imp's reply is still to come waits for the next
    turn, marked "(queued: …)"; one sent after the reply, while the imp
    remembers the exchange, is not marked: the next turn takes it.

    Ctrl-C on an empty prompt (or SIGINT, SIGTERM) stops the chat: a turn
    under way gets a moment to end and its reply is still shown; Ctrl-C again
    stops at once (the turn is cut off, its box killed). The chat exits 0.

    \b
    Example:
      export OPENAI_API_KEY=sk-...
      impyard chat pip
      impyard chat pip --as Ana
    """
    from impyard.imps.config import person_name_problem
    from impyard.terminal.chat import run_chat

    if as_name is not None and (problem := person_name_problem(as_name)) is not None:
        raise CliError(f"--as: the name {problem}")
    if not UpstreamConfig.from_env().api_key:
        raise CliError(NO_KEY)
    try:
        store = ImpStore()
        bring_up_to_date(store)  # issue 36: the imps as the database has them
        name = pick_imp(store, imp)
        with InstanceLock(home(), "chat"):
            log_path = home() / LOG_FILE
            log_to_file(log_path)
            anyio.run(lambda: run_chat(name, backend=backend, log_path=log_path, as_name=as_name))
    except (
        ImpError,
        PolicyError,
        DatabaseError,
        AlreadyRunning,
        BoxError,
        LeaseHeld,
        LeaseLost,
    ) as exc:  # other ImpyardErrors: the root
        raise CliError(str(exc)) from exc
    except KeyboardInterrupt:
        pass
