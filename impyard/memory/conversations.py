"""Saved conversations (``memory_conversations``): the state a box keeps of its conversation with one person
in one channel (its focus, its summary), in the session's writes scope, read through the session's reach.

A channel keeps the conversations of its ``MAX_CONVERSATIONS_PER_CHANNEL`` most recently saved people, each
at most ``MAX_CONVERSATION_STATE_BYTES`` of JSON (``conversation_json``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, select
from sqlalchemy.engine import Connection

from box.protocol.memory import MAX_CONVERSATION_STATE_BYTES
from impyard.clock import iso, parse_iso
from impyard.memory.errors import MemoryInvalid
from impyard.memory.reach import Reach, per_reach
from impyard.storage.db import Database
from impyard.storage.portable import bytewise, per_dialect, upsert
from impyard.storage.tables import memory_conversations as _C

MAX_CONVERSATIONS_PER_CHANNEL = (
    200  # people whose conversation state a channel keeps (the most recently saved)
)


@per_dialect
def _SAVE_CONVERSATION(dialect: str) -> Any:  # noqa: N802 - a statement
    statement = upsert(dialect)(_C).values(
        imp=bindparam("imp"), scope=bindparam("scope"), channel_id=bindparam("channel_id"),
        person=bindparam("person"), state=bindparam("state"), updated_at=bindparam("at"),
    )  # fmt: skip
    return statement.on_conflict_do_update(
        index_elements=[_C.c.imp, _C.c.channel_id, _C.c.person],
        set_={
            "scope": statement.excluded.scope,
            "state": statement.excluded.state,
            "updated_at": statement.excluded.updated_at,
        },
    )


_kept = (
    select(_C.c.person)
    .where(_C.c.imp == bindparam("imp"), _C.c.channel_id == bindparam("channel_id"))
    .order_by(bytewise(_C.c.updated_at).desc(), (_C.c.person == bindparam("person")).desc())
    .limit(bindparam("keep"))
)
# The channel's most recently saved people are kept; the portable form of a LIMIT in a DELETE: NOT IN (SELECT …).
_TRIM_CONVERSATIONS = delete(_C).where(
    _C.c.imp == bindparam("imp"), _C.c.channel_id == bindparam("channel_id"), _C.c.person.not_in(_kept)
)


def _conversation(shape: str) -> Any:
    return select(_C.c.state, _C.c.updated_at).where(
        Reach.criterion(_C, shape),
        _C.c.channel_id == bindparam("channel_id"),
        _C.c.person == bindparam("person"),
    )


def conversation_json(state: dict[str, Any]) -> str:
    """The state as stored; refuses more than ``MAX_CONVERSATION_STATE_BYTES`` and non-finite numbers."""
    try:
        text = json.dumps(state, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise MemoryInvalid(f"a conversation's state must be plain JSON: {exc}") from None
    size = len(text.encode())
    if size > MAX_CONVERSATION_STATE_BYTES:
        raise MemoryInvalid(
            f"a conversation's state is at most {MAX_CONVERSATION_STATE_BYTES} bytes of JSON (got {size}); "
            "cut the focus or the summary"
        )
    return text


def get(
    db: Database, reach: Reach, channel_id: str, person: str
) -> tuple[dict[str, Any] | None, datetime | None]:
    """The saved state of the conversation with ``person`` in ``channel_id`` within ``reach``, and when it was
    saved (None, None: none)."""
    statement = per_reach("conversation", reach, _conversation)
    params = reach.params(channel_id=channel_id, person=person)
    row = db.read(lambda conn: conn.execute(statement, params).first())
    if row is None:
        return None, None
    return json.loads(row[0]), parse_iso(row[1])


def put(
    db: Database, imp: str, scope: str, channel_id: str, person: str, state: dict[str, Any], now: datetime
) -> None:
    """Save the conversation's state in ``scope`` (at most 256 KiB of JSON).

    A channel keeps the conversations of its ``MAX_CONVERSATIONS_PER_CHANNEL`` most recently saved people;
    saving one more lets go of the longest untouched, which had gone stale anyway (a new conversation
    starts after the person's absence). So a box naming made-up people holds at most that many states of
    256 KiB per channel, however many it invents.
    """
    text = conversation_json(state)
    params = {
        "imp": imp, "scope": scope, "channel_id": channel_id, "person": person, "state": text, "at": iso(now),
        "keep": MAX_CONVERSATIONS_PER_CHANNEL,
    }  # fmt: skip

    def write(conn: Connection) -> None:
        conn.execute(_SAVE_CONVERSATION(conn.dialect.name), params)
        conn.execute(_TRIM_CONVERSATIONS, params)

    # SERIALIZABLE, not locking: the trim reads every saved conversation of the channel, which no generation
    # row guards; two saves of one imp in one channel at once are rare (one box per channel) and run again.
    db.write(write)
