"""``impyard memory``: the operator's verbs on an imp's memory, kept in the host's database (issue 23).

``show``, ``rules``, ``slot``, ``stats``, ``forget``, ``copy`` and ``delete`` (issue 15) read, copy and
delete rows; ``search`` and ``remember`` need a vector of the text, made the way the imp's boxes make theirs
so the two compare (mechanism 30; ``impyard.query_vector``, which the console's search uses too): with
``[memory] embedder = "gateway"`` (the default) the text goes
through this host's gateway like any box's call — judged by the policy (purpose ``embedding``), metered
against the imp's budget and audited, on the session channel ``operator:cli`` — and with ``"hashing"`` the
local 64-dimension embedder makes it, with no call at all.
Every refusal is one line that says what to do; a refused command changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from typing import Any

import click
from rich.markup import escape

from box.common import laws
from box.protocol.memory import (
    MAX_CONCLUSION_CHARS,
    MAX_K,
    DispositionView,
    RecordView,
    SlotEntry,
)
from impyard import query_vector
from impyard.cli.errors import CliError
from impyard.cli.output import Col, Output, output_options
from impyard.clock import SystemClock
from impyard.conversation.history import History
from impyard.durations import DurationError, format_duration, parse_duration
from impyard.imps.config import ImpConfig, ImpError
from impyard.imps.store import ImpStore
from impyard.memory import identities
from impyard.memory.errors import MemoryInvalid
from impyard.memory.forgetting import Forgotten
from impyard.memory.identities import PersonInvalid, author_only_note, identify
from impyard.memory.scopes import SCOPE_FORMS, TERMINAL, ScopeNameError, parse_scope
from impyard.memory.stats import MemoryStats
from impyard.memory.store import MemoryStore
from impyard.storage.db import Database, DatabaseError, open_database

MAX_AGE = 100 * 365 * 24  # hours: --age up to a hundred years
MAX_SHOWN = 1_000
SCOPE_RULE = SCOPE_FORMS  # issue 32 #4: channel:<channel id> is a private channel's own scope

MEMORY_COLUMNS = (
    Col("record", no_wrap=True), "scope", Col("last felt", no_wrap=True), "author", "feels", "felt", "conclusion",
)  # fmt: skip


RULE_COLUMNS = ("rule", Col("weight", no_wrap=True), Col("count", no_wrap=True), Col("state", no_wrap=True),
                Col("learned", no_wrap=True), Col("id", no_wrap=True))  # fmt: skip
SLOT_COLUMNS = (Col("scope", no_wrap=True), Col("kind", no_wrap=True), "statement", Col("intensity", no_wrap=True),
                Col("activated", no_wrap=True), Col("record", no_wrap=True))  # fmt: skip
WHEN_LEARNED = (
    "a rule is learned when someone leaves a conversation with it (half an hour without a word from them, "
    "or /quit in impyard chat), from how that conversation felt"
)


@click.group("memory")
def memory_group() -> None:
    """An imp's memory: show, search, give and forget what it remembers (kept in the host's database).

    \b
    Example:
      impyard memory show pip --person carol
      impyard memory search pip "the picnic"
      impyard memory remember pip "I grew up by the sea." --valence 0.6 --intensity 0.7 --age 8760h
      impyard memory forget pip --person carol
      impyard memory forget pip --record 3f9a0c1d2e4b
      impyard memory rules pip
      impyard memory slot pip --scope terminal
      impyard memory stats pip
      impyard memory copy pip pip2
      impyard memory delete pip2
    """


# ------------------------------------------------------------------ input checks (one line each, before anything)


def check_scope(scope: str | None) -> str | None:
    if scope is None:
        return None
    try:
        return parse_scope(scope)
    except ScopeNameError as exc:
        raise CliError(f"--scope {exc}") from None


def check_person(person: str) -> str:
    try:
        return identities.check_person(person)
    except PersonInvalid as exc:
        raise CliError(f"--person {exc}") from None


def check_unit(value: float, option: str, low: float, high: float) -> float:
    if not math.isfinite(value) or not low <= value <= high:
        raise CliError(f"{option} must be a number from {low:g} to {high:g} (got {value:g})")
    return value


def age_hours(text: str) -> float:
    try:
        hours = parse_duration(text, what="--age").total_seconds() / 3600
    except DurationError as exc:
        raise CliError(str(exc)) from None
    if hours > MAX_AGE:
        raise CliError(f"--age {text[:40]!r} is more than a hundred years: give at most {MAX_AGE}h")
    return hours


def check_event(event: str) -> str:
    text = event.strip()
    if not text or len(text) > MAX_CONCLUSION_CHARS:
        raise CliError(f"the event must be 1 to {MAX_CONCLUSION_CHARS} characters of text (got {len(text)})")
    return text


def imp_config(name: str) -> ImpConfig:
    try:
        return ImpStore().get(name)
    except ImpError as exc:
        raise CliError(str(exc).splitlines()[0]) from exc


@contextmanager
def memory_store() -> Iterator[tuple[MemoryStore, Database]]:
    """The home's memory store (the host database, migrated); a database problem is a one-line error."""
    try:
        db = open_database()
    except DatabaseError as exc:
        raise CliError(str(exc)) from exc
    try:
        yield MemoryStore(db, SystemClock().now), db
    except MemoryInvalid as exc:
        raise CliError(str(exc)) from exc
    finally:
        db.close()


def embed(config: ImpConfig, db: Database, text: str) -> list[float]:
    """The vector of ``text`` by the imp's configured embedder (``impyard.query_vector``), or a CliError."""
    try:
        return query_vector.embed(config, db, text)
    except query_vector.NoVector as exc:
        raise CliError(str(exc)) from exc


# ------------------------------------------------------------------ output


def record_json(view: RecordView) -> dict[str, Any]:
    value = view.model_dump(mode="json", exclude={"vector"})
    return {"scope": getattr(view, "scope", None), **value}


def _ago(when: datetime, now: datetime) -> str:
    delta = now - when
    return f"{format_duration(delta)} ago" if delta.total_seconds() >= 1 else "now"


def _feels(view: RecordView) -> str:
    sign = "+" if view.valence > 0 else ""
    return f"{sign}{view.valence:.2f}/{view.intensity:.2f}"


def show_records(out: Output, views: Sequence[RecordView], *, empty: str, title: str) -> None:
    """The store's operator views (``StoredRecord``: each with its scope) as a table, or JSON."""
    now = SystemClock().now()
    rows = []
    for view in views:
        feeling = f"{escape(view.feeling)} " if view.feeling else ""
        text = " ".join(view.conclusion.split())
        text = text[:120] + ("…" if len(text) > 120 else "")
        rows.append(
            (
                view.id[:12], escape(getattr(view, "scope", "?")), _ago(view.last_felt, now),
                escape(view.author) + (f" [dim]({view.origin})[/]" if view.origin in ("given", "kept") else ""),
                f"{feeling}{_feels(view)}", f"{view.felt:.2f}" + (f" [dim]score {view.score:.2f}[/]" if view.score is not None else ""),
                escape(text),
            )
        )  # fmt: skip
    out.listing(
        [record_json(view) for view in views], columns=MEMORY_COLUMNS, rows=rows, empty=empty, title=title,
        min_width=140,
    )  # fmt: skip


# ------------------------------------------------------------------ the verbs


@memory_group.command("show")
@click.argument("imp")
@click.option("--person", help="Only records by or about this person (a name or a Discord id).")
@click.option("--scope", help=f"Only this scope: {SCOPE_RULE}.")
@click.option("-n", "limit", type=click.IntRange(1, MAX_SHOWN), default=50, show_default=True,
              help="How many (most recently felt first).")  # fmt: skip
@output_options
def show_command(imp: str, person: str | None, scope: str | None, limit: int, out: Output) -> None:
    """What IMP remembers, most recently felt first: feeling, valence/intensity, felt strength now.

    \b
    Examples:
      impyard memory show pip
      impyard memory show pip --person carol --scope guild:123456789012345678 --json
    """
    config = imp_config(imp)
    who = check_person(person) if person is not None else None
    where = check_scope(scope)
    with memory_store() as (store, _):
        views = store.show(config.name, person=who, scope=where, limit=limit)
    selection = "".join([f" by or about {who!r}" if who else "", f" in {where}" if where else ""])
    show_records(out, views, empty=f"{config.name} remembers nothing{selection}.",
                 title=f"What {config.name} remembers{escape(selection)}")  # fmt: skip


@memory_group.command("rules")
@click.argument("imp")
@output_options
def rules_command(imp: str, out: Output) -> None:
    """What IMP has learned: its rules of conduct, strongest first (mechanisms 90-98).

    \b
    A rule is "when <situation> → <act>", learned when someone leaves a
    conversation; its weight is how it felt (-1 to 1; hurt pulls twice as
    hard), its count how often it was learned again. A rule weakened to
    |weight| 0.05 or less is dormant: kept, never brought to mind. Rules are
    the imp's own, shared by every scope, and name no one. Example:
      impyard memory rules pip --json
    """
    config = imp_config(imp)
    with memory_store() as (store, _):
        rules = store.rules(config.name)
    now = SystemClock().now()
    rows = [
        (
            escape(rule.rule), f"{rule.weight:+.2f}", str(rule.count), _state(rule), _ago(rule.updated_at, now),
            rule.id[:12],
        )
        for rule in rules
    ]  # fmt: skip
    out.listing(
        [rule_json(rule) for rule in rules], columns=RULE_COLUMNS, rows=rows,
        empty=f"{config.name} has learned nothing yet: {WHEN_LEARNED}.", title=f"What {config.name} has learned",
    )  # fmt: skip


def _state(rule: DispositionView) -> str:
    return "active" if laws.is_active(rule.weight) else "dormant"


def rule_json(rule: DispositionView) -> dict[str, Any]:
    return {**rule.model_dump(mode="json"), "state": _state(rule)}


@memory_group.command("slot")
@click.argument("imp")
@click.option("--scope", help=f"Only this scope: {SCOPE_RULE}.")
@output_options
def slot_command(imp: str, scope: str | None, out: Output) -> None:
    """What IMP holds in mind: its own thoughts, beliefs and intentions, per scope (mechanisms 84-89).

    \b
    Each scope keeps at most 3: one decision, goal or dream, and thoughts or
    beliefs; one not brought to mind for 7 days leaves (it stays in memory).
    The imp sees them in every reply in that scope. Example:
      impyard memory slot pip --scope guild:123456789012345678
    """
    config = imp_config(imp)
    where = check_scope(scope)
    with memory_store() as (store, _):
        held = store.slot_view(config.name, where)
    now = SystemClock().now()
    rows = [
        (
            escape(in_scope), entry.record.construct_kind or "?", escape(_statement(entry.record)),
            f"{entry.record.intensity:.2f}", _ago(entry.activated_at, now), entry.record.id[:12],
        )
        for in_scope, entry in held
    ]  # fmt: skip
    selection = f" in {where}" if where else ""
    out.listing(
        [slot_json(in_scope, entry) for in_scope, entry in held], columns=SLOT_COLUMNS, rows=rows,
        empty=f"{config.name} holds nothing in mind{selection}: its thoughts come when it reflects.",
        title=f"What {config.name} holds in mind{escape(selection)}",
    )  # fmt: skip


def _statement(view: RecordView) -> str:
    text = " ".join((view.statement or view.conclusion).split())
    return text[:160] + ("…" if len(text) > 160 else "")


def slot_json(scope: str, entry: SlotEntry) -> dict[str, Any]:
    return {
        "scope": scope,
        "activated_at": entry.activated_at.isoformat(),
        "record": record_json(entry.record),
    }


@memory_group.command("search")
@click.argument("imp")
@click.argument("text")
@click.option(
    "--scope", "scopes", multiple=True, help="Search only this scope (repeatable; default: every scope)."
)
@click.option("-k", "k", type=click.IntRange(1, MAX_K), default=10, show_default=True, help="How many.")
@output_options
def search_command(imp: str, text: str, scopes: tuple[str, ...], k: int, out: Output) -> None:
    """Search IMP's memory by meaning: cosine, with felt strength breaking near ties, as its recall ranks (no
    association filter).

    \b
    The text is embedded with the imp's [memory] embedder: through the gateway
    (purpose embedding: judged, metered and audited like a box's call; with
    embedder = "local" computed by this host, at no cost), or locally with
    embedder = "hashing". Example:
      impyard memory search pip "the picnic by the lake"
    """
    config = imp_config(imp)
    if not text.strip():
        raise CliError('give the text to search for, e.g. impyard memory search pip "the picnic"')
    where = [check_scope(scope) or "" for scope in scopes]
    with memory_store() as (store, db):
        views = store.search(config.name, embed(config, db, text), (), k, scopes=where or None)
    show_records(out, views, empty=f"Nothing in {config.name}'s memory comes to mind for that.",
                 title=f"{config.name} recalls")  # fmt: skip


@memory_group.command("remember")
@click.argument("imp")
@click.argument("event")
@click.option("--valence", type=float, required=True, help="How good (1) or bad (-1) it was: -1 to 1.")
@click.option("--intensity", type=float, required=True, help="How strongly it was felt: 0 to 1.")
@click.option(
    "--age", default="0s", show_default=True, help="How long ago it happened, e.g. 720h, 30d, 1h30m."
)
@click.option("--scope", default=TERMINAL, show_default=True,
              help=f"The scope it is kept in ({SCOPE_RULE}); only sessions that read it recall it.")  # fmt: skip
@output_options
def remember_command(
    imp: str, event: str, valence: float, intensity: float, age: str, scope: str, out: Output
) -> None:
    """Give IMP a memory from its past (mechanism 115): author Self, origin given, fading from its date.

    \b
    It is recalled like a lived one, tagged "from your past", and never
    forgotten in sleep (it still fades). Example:
      impyard memory remember pip "A storm sank my first boat." --valence -0.7 --intensity 0.8 --age 720h
    """
    config = imp_config(imp)
    text = check_event(event)
    check_unit(valence, "--valence", -1.0, 1.0)
    check_unit(intensity, "--intensity", 0.0, 1.0)
    hours = age_hours(age)
    where = check_scope(scope) or TERMINAL
    with memory_store() as (store, db):
        vector = embed(config, db, text)
        record_id = store.remember(config.name, where, text, valence, intensity, hours, vector)
    out.show(
        {"record": record_id, "imp": config.name, "scope": where, "age_hours": hours, "dims": len(vector)},
        f"{config.name} remembers it ({where}, {format_duration(hours * 3600) + ' ago' if hours else 'now'}): "
        f"record {record_id}",
    )


@memory_group.command("forget")
@click.argument("imp")
@click.option("--person", help="A name or a Discord id: everything by or about them, in every scope.")
@click.option(
    "--record", "record", help="One record's id (or the first 8+ characters of it, as `show` lists)."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output_options
def forget_command(imp: str, person: str | None, record: str | None, yes: bool, out: Output) -> None:
    """Forget everything by or about a person, in every scope of IMP (records, episodes, conversations), or one
    record with its episodes.

    \b
    The person is matched by Discord id and by every name the host's history
    knows for them: what was written under the id or a name, and what
    mentions a name as a whole word, literally — but a name of under 3
    letters or a common word ("Al", "the") only as who wrote it. The answer
    says how many were found by id and by name. Cannot be undone. Examples:
      impyard memory forget pip --person carol
      impyard memory forget pip --record 3f9a0c1d2e4b
    """
    config = imp_config(imp)
    if (person is None) == (record is None):
        raise CliError(
            "give --person NAME_OR_ID or --record ID (one of them), e.g. impyard memory forget pip --person carol"
        )
    if record is not None:
        _forget_record(config.name, record, yes, out)
        return
    assert person is not None
    who = check_person(person)
    with memory_store() as (store, db):
        whom = identify(store, History(db, SystemClock()), config.name, who)
        if not yes:
            coming = store.person_preview(config.name, whom.ids, whom.names)
            click.confirm(
                f"Forget everything {config.name} remembers by or about {whom.described}, in every scope "
                f"({_forgotten_counts(coming)})?"
                + (f" ({author_only_note(whom.author_only)})" if whom.author_only else "") + " This cannot be undone.",
                abort=True, err=True,
            )  # fmt: skip
        forgotten = store.forget_person(config.name, whom.ids, whom.names)
    out.show(
        {"imp": config.name, "person": who, "names": list(whom.names), "ids": list(whom.known_ids), **asdict(forgotten)},
        f"{config.name} forgot {whom.described}: {forgotten.records} records, {forgotten.episodes} episodes, "
        f"{forgotten.conversations} conversations ({forgotten.by_id} found by id, {forgotten.by_name} by name)"
        + (f"; {author_only_note(forgotten.author_only)}." if forgotten.author_only else "."),
    )  # fmt: skip


RECORD_ID_MIN = 8  # characters of a record id that name it (``show`` lists 12)


def _forget_record(imp: str, record: str, yes: bool, out: Output) -> None:
    given = record.strip().lower()
    if not RECORD_ID_MIN <= len(given) <= 32 or any(ch not in "0123456789abcdef" for ch in given):
        raise CliError(
            f"--record must be a record's id, {RECORD_ID_MIN} to 32 hexadecimal characters as impyard memory show "
            f"lists it (got {record[:40]!r})"
        )
    with memory_store() as (store, _):
        found = store.records_by_id(imp, given, limit=2, episodes=0)
        if not found:
            raise CliError(f"{imp} has no record {given}: impyard memory show {imp} lists its records")
        if len(found) > 1:
            raise CliError(f"{given} starts more than one of {imp}'s record ids: give more of it")
        view = found[0]
        scope = str(getattr(view, "scope", ""))
        if not yes:
            click.confirm(
                f"Forget {imp}'s record {view.id} in {scope} ({_brief(view)}) with its episodes? "
                "This cannot be undone.",
                abort=True, err=True,
            )  # fmt: skip
        gone = store.forget_record(imp, scope, view.id)
    out.show(
        {"imp": imp, "record": view.id, "scope": scope, **gone},
        f"{imp} forgot record {view.id} in {scope}: {_n(gone['records'], 'record', 'records')}, "
        f"{_n(gone['episodes'], 'episode', 'episodes')}."
        if gone["records"] else f"{imp}'s record {view.id} was already gone; nothing was forgotten.",
    )  # fmt: skip


def _brief(view: RecordView) -> str:
    text = " ".join((view.statement or view.conclusion).split())
    return repr(text[:60] + ("…" if len(text) > 60 else ""))


def _forgotten_counts(forgotten: Forgotten) -> str:
    return ", ".join([
        _n(forgotten.records, "memory", "memories"), _n(forgotten.episodes, "moment", "moments"),
        _n(forgotten.conversations, "conversation", "conversations"),
    ])  # fmt: skip


# ------------------------------------------------------------------ copy, delete, stats (issue 15: mechanism 118)

SCOPE_STATS_COLUMNS = (Col("scope", no_wrap=True), Col("records", no_wrap=True), Col("episodes", no_wrap=True),
                       Col("constructs", no_wrap=True), Col("given", no_wrap=True),
                       Col("conversations", no_wrap=True), Col("slot", no_wrap=True))  # fmt: skip


def _size(n: int) -> str:
    """A size in bytes for people: 812 bytes, 4.0 KiB, 1.5 MiB, 2.3 GiB."""
    if n < 1024:
        return f"{n} bytes"
    value, units = n / 1024, ["KiB", "MiB", "GiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.1f} {units[0]}"


def _new_imp(name: str) -> ImpConfig:
    """The copy's imp: it must exist already (a copy gives memories, not a persona or settings)."""
    try:
        return ImpStore().get(name)
    except ImpError as exc:
        first = str(exc).splitlines()[0].rstrip(".")
        how = "" if "imp add" in first else f"; create it first with impyard imp add {name}"
        raise CliError(f"{first}{how}, then copy into it") from exc


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


@memory_group.command("copy")
@click.argument("src")
@click.argument("new")
@output_options
def copy_command(src: str, new: str, out: Output) -> None:
    """Copy everything SRC remembers to NEW, an imp with no memory yet (mechanism 118).

    \b
    Records and their moments, saved conversations, what it holds in mind
    and its learned rules are copied, each into the same scope, with new ids;
    SRC is not changed. NEW must exist (impyard imp add NEW) and remember
    nothing yet (impyard memory delete NEW empties it). Its day starts
    asleep, like any new imp's. Example:
      impyard imp add pip2 --persona-file pip.md && impyard memory copy pip pip2
    """
    source = imp_config(src)
    target = _new_imp(new)
    if source.name == target.name:
        raise CliError("SRC and NEW are the same imp: name another imp to copy into")
    with memory_store() as (store, _):
        if not store.has_memory(source.name):
            raise CliError(f"{source.name} remembers nothing yet: there is nothing to copy")
        if store.has_memory(target.name):
            raise CliError(
                f"{target.name} already remembers something: a copy goes only into an empty memory "
                f"(impyard memory delete {target.name} empties it)"
            )
        counts = store.copy_imp(source.name, target.name)
    notes = []
    if not target.memory.enabled:
        notes.append(f"{target.name}'s memory is off: impyard imp set {target.name} memory.enabled=true")
    mine, theirs = (
        ImpStore().box_memory(source),
        ImpStore().box_memory(target),
    )  # as their boxes embed (issue 33)
    if (mine.embedder, mine.embedding_model, mine.dimensions) != (theirs.embedder, theirs.embedding_model,
                                                                  theirs.dimensions):  # fmt: skip
        notes.append(
            f"{target.name} embeds differently from {source.name} ([memory] embedder, embedding_model, "
            "dimensions): it recalls the copies by meaning only with the same settings"
        )
    out.show(
        {"src": source.name, "new": target.name, **counts, "notes": notes},
        f"{target.name} now remembers what {source.name} does: {_counted(counts)}."
        + "".join(f"\nNote: {note}." for note in notes),
    )


@memory_group.command("delete")
@click.argument("imp")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output_options
def delete_command(imp: str, yes: bool, out: Output) -> None:
    """Delete everything IMP remembers, in every scope (mechanism 118). Cannot be undone.

    \b
    Records and their moments, saved conversations, what it holds in mind,
    learned rules, pending departures and its day's clock; the imp itself
    (imp.toml, persona) stays, and starts again with an empty memory. Works
    for an imp removed without --purge too. Examples:
      impyard memory delete pip
      impyard memory delete pip --yes   # for scripts
    """
    try:
        name = ImpStore().get(imp).name
        missing: str | None = None
    except ImpError as exc:
        name, missing = imp, str(exc).splitlines()[0]
    with memory_store() as (store, _):
        if not store.has_memory(name):
            if missing is not None:
                raise CliError(missing)
            out.show(
                {"imp": name, "deleted": False}, f"{name} remembers nothing; there is nothing to delete."
            )
            return
        stats = store.stats(name)
        if not yes:
            records = sum(scope.records for scope in stats.scopes)
            click.confirm(
                f"Delete everything {name} remembers: {_n(records, 'memory', 'memories')} in "
                f"{_n(len(stats.scopes), 'scope', 'scopes')}, {_n(stats.rules, 'learned rule', 'learned rules')}? "
                "This cannot be undone.",
                abort=True, err=True,
            )  # fmt: skip
        gone = store.forget_imp(name)
    out.show(
        {"imp": name, "deleted": True, **gone},
        f"{name} remembers nothing now: deleted {_counted(gone)}.",
    )


@memory_group.command("stats")
@click.argument("imp")
@output_options
def stats_command(imp: str, out: Output) -> None:
    """How much IMP remembers, per scope, and how its day stands (awake or asleep).

    \b
    Per scope: records (its memories), episodes (the moments in them),
    constructs (its own thoughts, beliefs, intentions), given records,
    saved conversations and what it holds in mind. Then its learned rules,
    when it woke or fell asleep, its last reflection, sleep and consolidation
    (the supervisor's clock: impyard supervise), and the size of the host
    database that keeps every imp's memory. Example:
      impyard memory stats pip --json
    """
    config = imp_config(imp)
    with memory_store() as (store, _):
        stats = store.stats(config.name)
    if out.as_json:
        out.json(stats_json(stats))
        return
    now = SystemClock().now()
    clock = stats.clock
    lines = [f"{config.name}'s memory" + ("" if config.memory.enabled else " (memory is off)")]
    if clock is None:
        lines.append("Day: not seen by the supervisor's clock yet (impyard supervise runs it).")
    else:
        since = clock.woke_at if clock.awake else clock.slept_at
        state = "awake" if clock.awake else "asleep"
        lines.append(f"Day: {state}" + (f" since {_ago(since, now)}" if since else "")
                     + (f"; last activity {_ago(clock.last_activity_at, now)}" if clock.last_activity_at else ""))  # fmt: skip
        lines.append(
            "Last reflection: " + _when_text(clock.last_reflection_at, now)
            + "; last sleep: " + _when_text(clock.last_sleep_at, now)
            + "; last consolidation: " + _when_text(clock.last_consolidation_at, now)
        )  # fmt: skip
    lines.append(f"Learned rules: {stats.rules} ({stats.active_rules} active), shared by every scope.")
    lines.append(f"Host database: {_size(stats.database_bytes)} on disk (every imp's memory and the rest).")
    click.echo("\n".join(lines))
    if not stats.scopes:
        click.echo(f"{config.name} remembers nothing yet.")
        return
    rows = [
        (escape(s.scope), str(s.records), str(s.episodes), str(s.constructs), str(s.given), str(s.conversations),
         str(s.slot))
        for s in stats.scopes
    ]  # fmt: skip
    out.table(SCOPE_STATS_COLUMNS, rows, title=f"What {config.name} keeps, per scope")


def _counted(counts: dict[str, int]) -> str:
    return ", ".join([
        _n(counts["records"], "memory", "memories"), _n(counts["episodes"], "moment", "moments"),
        _n(counts["conversations"], "conversation", "conversations"), f"{counts['slots']} held in mind",
        _n(counts["rules"], "learned rule", "learned rules"),
    ])  # fmt: skip


def _when_text(when: datetime | None, now: datetime) -> str:
    return _ago(when, now) if when is not None else "never"


def stats_json(stats: MemoryStats) -> dict[str, Any]:
    clock = stats.clock
    return {
        "imp": stats.imp,
        "scopes": [asdict(scope) for scope in stats.scopes],
        "totals": {
            key: sum(getattr(scope, key) for scope in stats.scopes)
            for key in ("records", "episodes", "constructs", "given", "conversations", "slot")
        },
        "rules": stats.rules,
        "active_rules": stats.active_rules,
        "clock": None if clock is None else {
            "state": "awake" if clock.awake else "asleep",
            **{key: (value.isoformat() if value else None) for key, value in asdict(clock).items() if key != "awake"},
        },
        "database_bytes": stats.database_bytes,
    }  # fmt: skip


from impyard.cli import memory_night  # noqa: E402, F401  (registers `impyard memory night` on this group)
