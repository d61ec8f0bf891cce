"""Whom "forget this person" means (``impyard memory forget --person``, the console's Forget a person).

An operator names a person by a Discord id or by a name; forgetting must take what they wrote under every name
they went by and what was written under every id that used that name (``identify``). The host's history knows
who wrote under which name (``Authors``: ``impyard.conversation.history.History`` is one), and so do the imp's own
records. ``check_person`` is the one rule for what may name a person. ``/forget-me`` needs none of this: Discord
says who asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from box.protocol.memory import MAX_NAME_CHARS
from impyard.memory.errors import MemoryInvalid
from impyard.memory.forgetting import mentions_are_forgettable
from impyard.memory.store import MemoryStore

MAX_KNOWN = 1_000  # records read to learn the ids and names a person wrote under
PERSON_RULE = f"must be a name or a Discord id, 1 to {MAX_NAME_CHARS} printable characters"


class Authors(Protocol):
    """Who wrote under which name, as the host's history knows it."""

    def author_names(self, author_id: str) -> list[str]: ...

    def author_ids(self, author_name: str) -> list[str]: ...


class PersonInvalid(MemoryInvalid):
    """Text that cannot name a person; the message is ``PERSON_RULE`` with what was given."""


def check_person(person: str) -> str:
    """The person as given, stripped; ``PersonInvalid`` (the rule, and the start of what was given) otherwise."""
    text = person.strip()
    if not text or len(text) > MAX_NAME_CHARS or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise PersonInvalid(f"{PERSON_RULE} (got {person[:40]!r})")
    return text


@dataclass(frozen=True)
class Person:
    """The ids and the names forgetting a person takes (``identify``)."""

    asked: str
    ids: tuple[str, ...]
    names: tuple[str, ...]

    @property
    def known_ids(self) -> tuple[str, ...]:
        """The ids, less a name standing in as one (``identify``): what is worth listing as an id."""
        return tuple(i for i in self.ids if i not in self.names)

    @property
    def described(self) -> str:
        """``'carol', id 2003``: whom it is, as the answer and the confirmation say."""
        return ", ".join([*(repr(n) for n in self.names), *(f"id {i}" for i in self.known_ids)])

    @property
    def author_only(self) -> tuple[str, ...]:
        """Names too short or too common to match where merely mentioned (only as who wrote)."""
        return tuple(name for name in self.names if not mentions_are_forgettable(name))


def author_only_note(names: tuple[str, ...] | list[str]) -> str:
    listed = ", ".join(repr(name) for name in names)
    return f"records that only mention {listed} are kept: too short or too common a word to match"


def identify(store: MemoryStore, authors: Authors, imp: str, person: str) -> Person:
    """The ids and the names to forget for ``person``, from the host's history and the imp's own records.

    An id (Discord's digits, or one the history or a record knows as an author id, like ``terminal:alice``)
    comes with every name it wrote under; a name with every id that wrote under it. A name nobody is known
    by stands in as the id as well (no real id equals it), so whatever was kept under it as a key goes too.
    Blocking (history and store reads).
    """
    records = store.show(imp, person=person, limit=MAX_KNOWN, episodes=0)
    names_of_id = [*authors.author_names(person), *(v.author for v in records if v.author_id == person)]
    if person.isdigit() or names_of_id:
        ids, names = [person], names_of_id
    else:
        ids = [
            *authors.author_ids(person),
            *(v.author_id for v in records if v.author == person and v.author_id),
        ]
        names = [person]
    return Person(person, tuple(dict.fromkeys(ids)) or (person,), tuple(dict.fromkeys(names)))
