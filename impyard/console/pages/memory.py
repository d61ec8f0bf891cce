"""Memory: what one imp remembers in one scope, chosen explicitly (scopes are privacy boundaries: never a mix).

The records (``impyard memory show --scope``: the same ``MemoryStore.show``, felt strength as the store computes
it), what the imp holds in mind (``memory slot``), its learned rules (``memory rules``), a search (``memory
search --scope``: the same vector, ``impyard.query_vector``, and ``MemoryStore.search``), the imp's day
(``impyard.memory.day``), and Forget: one record (``memory forget --record``) or everything about a person
(``memory forget --person``, the ``/forget-me`` path), each a confirmation page, then a POST with the CSRF token.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from box.common import laws
from impyard import query_vector
from impyard.console.context import ConsoleContext, context_of
from impyard.console.page import Page
from impyard.console.render import render
from impyard.conversation.history import History
from impyard.imps.config import ImpConfig
from impyard.imps.store import ImpError
from impyard.memory import day as imp_day
from impyard.memory.forgetting import Forgotten
from impyard.memory.identities import Person, PersonInvalid, author_only_note, check_person, identify
from impyard.memory.scopes import ScopeNameError, parse_scope
from impyard.memory.store import MemoryStore
from impyard.threads import in_thread

PAGE = Page("Memory", "/memory")
FORGET = "/memory/forget"
FORGET_PERSON = "/memory/forget-person"
SHOWN = 50  # records listed (``memory show``'s default)
MAX_SHOWN = 1_000
SEARCHED = 10  # ``memory search``'s default k
MAX_QUERY_CHARS = 500
MAX_NOTICE_CHARS = 300
RECORD_ID_CHARS = 32  # uuid4 hex: the page names a record by its whole id
STRIP_HOURS = 24  # the day's strip: the last 24 hours


def _bad(line: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=line + "\n")


def _store(context: ConsoleContext) -> MemoryStore:
    return MemoryStore(context.db, context.clock.now)


async def _imp(context: ConsoleContext, name: str) -> ImpConfig:
    try:
        return await in_thread(context.imps.get, name)
    except ImpError as exc:
        raise web.HTTPNotFound(text=str(exc).splitlines()[0] + "\n") from exc


def _scope(text: str) -> str:
    try:
        return parse_scope(text)
    except ScopeNameError as exc:
        raise _bad(f"scope {exc}") from exc


def _record_id(text: str) -> str:
    given = text.strip().lower()
    if len(given) != RECORD_ID_CHARS or any(ch not in "0123456789abcdef" for ch in given):
        raise _bad(
            f"record must be a record's id, {RECORD_ID_CHARS} hexadecimal characters (got {text[:40]!r})"
        )
    return given


def _person(text: str) -> str:
    try:
        return check_person(text)
    except PersonInvalid as exc:
        raise _bad(f"the person {exc}") from exc


def _field(form: Mapping[str, object], name: str) -> str:
    value = form.get(name, "")
    return value if isinstance(value, str) else ""


def page_url(imp: str, scope: str | None = None, **more: str) -> str:
    query = {"imp": imp, **({"scope": scope} if scope else {}), **{k: v for k, v in more.items() if v}}
    return f"{PAGE.path}?{urlencode(query)}"


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def counted(forgotten: Forgotten) -> str:
    """``3 memories, 5 moments, 1 conversation``: what forgetting a person takes (or took)."""
    return ", ".join([
        _plural(forgotten.records, "memory", "memories"), _plural(forgotten.episodes, "moment", "moments"),
        _plural(forgotten.conversations, "conversation", "conversations"),
    ])  # fmt: skip


# ------------------------------------------------------------------ the day's strip (server-side SVG)


@dataclass(frozen=True)
class Strip:
    """The last ``STRIP_HOURS`` as a bar: the awake span and the marks, each at a fraction (0 to 1) of its width."""

    start: datetime
    awake: tuple[float, float] | None
    marks: tuple[tuple[float, str], ...]  # (where, kind: reflection or night)


def strip_of(today: imp_day.Day, now: datetime) -> Strip:
    start = now - timedelta(hours=STRIP_HOURS)
    span = (now - start).total_seconds()

    def where(at: datetime) -> float:
        return min(1.0, max(0.0, (at - start).total_seconds() / span))

    awake = None
    clock = today.clock
    if clock is not None and clock.woke_at is not None:
        ended = (
            now if clock.awake or clock.slept_at is None or clock.slept_at < clock.woke_at else clock.slept_at
        )
        if ended > start:
            awake = (where(clock.woke_at), where(ended))
    marks = tuple(
        (where(event.at), event.kind)
        for event in today.events
        if event.kind in ("reflection", "night") and event.at >= start
    )
    return Strip(start, awake, marks)


# ------------------------------------------------------------------ the page


@PAGE.routes.get(PAGE.path)
async def memory_page(request: web.Request) -> web.Response:
    context = context_of(request)
    name = request.query.get("imp", "").strip()
    done = request.query.get("done", "")[:MAX_NOTICE_CHARS]
    if not name:
        imps = await in_thread(context.imps.names)
        return render(request, "memory.html", title="Memory", imps=imps, config=None, done=done)
    config = await _imp(context, name)
    store = _store(context)
    stats = await context.db.run(store.stats, config.name)
    chosen = request.query.get("scope", "").strip()
    values: dict[str, Any] = {
        "imps": None, "config": config, "stats": stats, "scope": None, "done": done, "page_url": page_url,
    }  # fmt: skip
    if not chosen:
        return render(request, "memory.html", title=f"Memory · {config.name}", **values)
    scope = _scope(chosen)
    shown = request.query.get("n", str(SHOWN)).strip()
    if not shown.isdigit() or not 1 <= int(shown) <= MAX_SHOWN:
        raise _bad(f"n must be a whole number from 1 to {MAX_SHOWN} (got {shown[:40]!r})")
    query = " ".join(request.query.get("q", "").split())
    if len(query) > MAX_QUERY_CHARS:
        raise _bad(f"a search is at most {MAX_QUERY_CHARS} characters (got {len(query)})")
    now = context.clock.now()
    found, problem = None, None
    if query:
        try:
            vector = await query_vector.embed_async(config, context.db, query, context.clock)
            found = await context.db.run(
                lambda: store.search(config.name, vector, (), SEARCHED, scopes=[scope])
            )
        except query_vector.NoVector as exc:
            problem = str(exc)
    records = await context.db.run(lambda: store.show(config.name, scope=scope, limit=int(shown)))
    held = await context.db.run(store.slot_view, config.name, scope)
    rules = await context.db.run(store.rules, config.name)
    today = await context.db.run(imp_day.day, context.db, config.name, scope, now)
    values |= {
        "scope": scope, "records": records, "shown": int(shown), "query": query, "found": found, "problem": problem,
        "held": [entry for _, entry in held], "rules": rules, "day": today, "strip": strip_of(today, now),
        "now": now, "max_query": MAX_QUERY_CHARS, "window_days": imp_day.DAY_WINDOW.days, "active": laws.is_active,
    }  # fmt: skip
    return render(request, "memory.html", title=f"Memory · {config.name} · {scope}", **values)


# ------------------------------------------------------------------ Forget one record


@PAGE.routes.get(FORGET)
async def forget_record_question(request: web.Request) -> web.Response:
    context = context_of(request)
    config = await _imp(context, request.query.get("imp", "").strip())
    scope = _scope(request.query.get("scope", "").strip())
    record_id = _record_id(request.query.get("record", ""))
    store = _store(context)
    found = await context.db.run(lambda: store.records_by_id(config.name, record_id, scope, limit=1))
    if not found:
        raise web.HTTPNotFound(text=f"{config.name} has no record {record_id} in {scope}\n")
    return render(
        request, "memory_forget.html", title=f"Forget a memory of {config.name}?", config=config, scope=scope,
        record=found[0], person=None, page_url=page_url,
    )  # fmt: skip


@PAGE.routes.post(FORGET)
async def forget_record(request: web.Request) -> web.StreamResponse:
    context = context_of(request)
    form = await request.post()
    config = await _imp(context, _field(form, "imp").strip())
    scope = _scope(_field(form, "scope").strip())
    record_id = _record_id(_field(form, "record"))
    gone = await context.db.run(_store(context).forget_record, config.name, scope, record_id)
    if gone["records"]:
        done = (
            f"{config.name} forgot record {record_id[:12]}: {_plural(gone['records'], 'record', 'records')}, "
            f"{_plural(gone['episodes'], 'episode', 'episodes')}."
        )
    else:
        done = f"{config.name}'s record {record_id[:12]} was already gone; nothing was forgotten."
    raise web.HTTPSeeOther(page_url(config.name, scope, done=done))


# ------------------------------------------------------------------ Forget everything about a person


def _whom(store: MemoryStore, context: ConsoleContext, imp: str, person: str) -> Person:
    return identify(
        store, History(context.db, context.clock), imp, person
    )  # blocking: on the database's thread


@PAGE.routes.get(FORGET_PERSON)
async def forget_person_question(request: web.Request) -> web.Response:
    context = context_of(request)
    config = await _imp(context, request.query.get("imp", "").strip())
    scope = request.query.get("scope", "").strip()
    back = _scope(scope) if scope else None
    person = _person(request.query.get("person", ""))
    store = _store(context)
    whom = await context.db.run(_whom, store, context, config.name, person)
    coming = await context.db.run(store.person_preview, config.name, whom.ids, whom.names)
    return render(
        request, "memory_forget.html", title=f"Forget a person for {config.name}?", config=config, scope=back,
        record=None, person=whom, person_arg=shlex.quote(whom.asked), coming=counted(coming),
        kept=author_only_note(whom.author_only) if whom.author_only else None, page_url=page_url,
    )  # fmt: skip


@PAGE.routes.post(FORGET_PERSON)
async def forget_person(request: web.Request) -> web.StreamResponse:
    context = context_of(request)
    form = await request.post()
    config = await _imp(context, _field(form, "imp").strip())
    scope = _field(form, "scope").strip()
    back = _scope(scope) if scope else None
    person = _person(_field(form, "person"))
    store = _store(context)
    whom = await context.db.run(_whom, store, context, config.name, person)
    forgotten = await context.db.run(store.forget_person, config.name, whom.ids, whom.names)
    done = (
        f"{config.name} forgot the person you named: {counted(forgotten)} "
        f"({forgotten.by_id} found by id, {forgotten.by_name} by name)"
        + (
            "; records that only mention a name too short or too common to match were kept."
            if forgotten.author_only
            else "."
        )
    )
    raise web.HTTPSeeOther(page_url(config.name, back, done=done))
