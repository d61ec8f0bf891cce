"""Who the person at the terminal is (issue 38): an id from the Unix account, a name the operator chooses.

The id (``terminal:<account>``) keys the person in the history and in the imp's memory, and names the
terminal channel: it never changes with the name, so what the imp remembers of the person stays theirs. The
name is what the imp reads and calls them: ``impyard chat --as NAME``, else ``[terminal] name`` in the imp's
imp.toml, else the account's full name (its GECOS field), else the account's name — never ``root``, which
names no person: an administrator's account is the ``operator``.
"""

from __future__ import annotations

import getpass
import pwd
from dataclasses import dataclass

from impyard.imps.config import person_name_problem

ADMIN_ACCOUNTS = frozenset({"root"})  # accounts that name a role, not a person
ADMIN_NAME = "operator"


@dataclass(frozen=True)
class TerminalPerson:
    account: str  # the Unix account
    name: str  # what the imp calls them

    @property
    def id(self) -> str:
        """``terminal:<account>``: the history's and the memory's key, whatever the name."""
        return f"terminal:{self.account}"


def default_name(account: str, full_name: str) -> str:
    """The name of a person who chose none: the account's full name, else its name; the administrator's
    account (``root``, whatever its full name says) is the ``operator``."""
    if account in ADMIN_ACCOUNTS:
        return ADMIN_NAME
    full = full_name.split(",", 1)[0].strip()  # GECOS: "Full Name,room,phone,…"
    for candidate in (full, account):
        if candidate and person_name_problem(candidate) is None and candidate not in ADMIN_ACCOUNTS:
            return candidate
    return ADMIN_NAME


def account() -> str:
    """The Unix account running the chat."""
    return getpass.getuser()


def terminal_person(
    chosen: str | None = None, configured: str | None = None, user: str | None = None
) -> TerminalPerson:
    """The person at this terminal (``user``: its account, else the one running the chat): ``chosen``
    (``--as``), else ``configured`` ([terminal] name), else the account's default. Both were checked where they
    were read (``person_name_problem``)."""
    user = user or account()
    name = chosen or configured
    if name is None:
        try:
            full_name = pwd.getpwnam(user).pw_gecos
        except KeyError:  # an account the password database does not know (a container's uid)
            full_name = ""
        name = default_name(user, full_name)
    return TerminalPerson(account=user, name=name.strip())
