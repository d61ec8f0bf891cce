"""Approvals: the held posts waiting for a decision, with their text, target and deadline, and Approve / Deny.

The same store and rules as ``impyard approvals`` (``GateStore.latest`` / ``decide`` / ``expire_due``): the console
decides as the host operator, ``operator:<account>`` like the CLI (``operator_approver``), and a gate is decided
exactly once — of the console and a Discord button pressed at the same moment one wins, the other is told who
decided first. The console has no surface: an approved gate is sent by the running host whose surface reaches its
channel (``impyard serve`` for Discord, ``impyard chat`` for the terminal), once, by its gate pump.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from aiohttp import web
from pydantic import ValidationError

from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.console.context import ConsoleContext, context_of
from impyard.console.page import Page
from impyard.console.render import fragment, render
from impyard.gateway.audit import AuditLog
from impyard.gateway.gates import (
    Gate,
    GateError,
    GateStore,
    already_decided,
    decision_line,
    is_gate_id,
    operator_approver,
    time_left,
    who_may_decide,
)

PAGE = Page("Approvals", "/approvals")
DECIDE = PAGE.path + "/decide"
DECIDED = PAGE.path + "/decided"  # the "decided recently" list alone, refreshed in place
PENDING_SHOWN = 100  # as `impyard approvals ls`
DECIDED_SHOWN = 20
MAX_NOTE_CHARS = 500  # as the Discord `/approvals` note
PREVIEW_CHARS = 160
DECISIONS = {"approve": True, "deny": False}
OUTCOMES = (
    "decided",
    "already",
)  # what the redirect after a decision says happened (the line is the store's)
UNREADABLE = (
    "(its frozen payload is not a post this host can read: `impyard approvals show GATE --json` prints it)"
)
SENDERS = {"discord": "impyard serve", "terminal": "impyard chat", "task": "the supervisor"}


@dataclass(frozen=True)
class GateView:
    """A gate as the page shows it: the store's gate with what the channel store and the clock add."""

    gate: Gate
    target: str  # "#general (1001)", or the bare id where the channel store does not know the channel
    session: str
    surface: str | None
    left: str
    files: tuple[str, ...]
    content: str
    kind: str  # reply | staff | other
    preview: str
    deciders: str

    @property
    def waiting_for(self) -> str:
        """Who sends an approved gate (the console has no surface)."""
        sender = SENDERS.get(self.surface or "")
        return (
            f"the running {sender} host" if sender else "the running host whose surface reaches its channel"
        )


def _channel(channel_id: str, info: ChannelInfo | None) -> str:
    if info is None or not info.name:
        return channel_id
    return f"#{info.name} ({channel_id})" if info.kind == "guild" else f"{info.name} ({channel_id})"


def _views(context: ConsoleContext, gates: list[Gate], now: datetime) -> list[GateView]:
    channels = ChannelStore(context.db, context.clock)
    known = {c: channels.info(c) for c in {g.target for g in gates} | {g.session_channel for g in gates}}
    views = []
    for gate in gates:
        kind: str
        try:
            send = gate.send
            content, files, kind = send.content, tuple(f.filename for f in send.files), send.kind
        except ValidationError:  # one unreadable row is marked, never the end of the page
            content, files, kind = UNREADABLE, (), "unreadable"
        flat = content.replace("\n", " ")
        info = known[gate.target]
        views.append(
            GateView(
                gate=gate, target=_channel(gate.target, info),
                session=_channel(gate.session_channel, known[gate.session_channel]),
                surface=info.surface if info is not None else None, left=time_left(gate, now),
                files=files, content=content, kind=kind,
                preview=flat[:PREVIEW_CHARS] + ("…" if len(flat) > PREVIEW_CHARS else ""),
                deciders=who_may_decide(gate),
            )
        )  # fmt: skip
    return views


def _store(context: ConsoleContext) -> GateStore:
    """The CLI's gate store: decisions audited (secrets redacted) in the decision's transaction."""
    return GateStore(context.db, context.clock, AuditLog(context.db, context.clock))


def _decided(context: ConsoleContext) -> list[GateView]:
    return _views(context, _store(context).decided_recently(DECIDED_SHOWN), context.clock.now())


def _page(context: ConsoleContext) -> tuple[list[GateView], list[GateView]]:
    store = _store(context)
    # As `impyard approvals ls`: a gate past its deadline is recorded expired first (every host's gate pump does
    # the same every two seconds), so no gate is offered that can no longer be decided.
    store.expire_due()
    pending = _views(context, store.latest(("pending",), PENDING_SHOWN), context.clock.now())
    return pending, _decided(context)


def _notice(context: ConsoleContext, gate_id: str, outcome: str) -> tuple[str, bool] | None:
    """The one-line outcome after a decision (line, is_bad), made from the gate as the store has it now."""
    if not is_gate_id(gate_id) or outcome not in OUTCOMES:
        return None
    try:
        gate = _store(context).get(gate_id)
    except GateError:
        return None
    mine = gate.decided_by == operator_approver(context.operator).label
    if outcome == "decided" and mine and gate.state != "expired":
        return decision_line(gate), False
    return already_decided(gate), True


@PAGE.routes.get(PAGE.path)
async def approvals_page(request: web.Request) -> web.Response:
    context = context_of(request)
    pending, decided = await context.db.run(_page, context)
    gate_id, outcome = request.query.get("gate", "")[:64], request.query.get("outcome", "")[:16]
    notice = await context.db.run(_notice, context, gate_id, outcome) if gate_id else None
    return render(
        request, "approvals.html", title="Approvals", pending=pending, decided=decided, notice=notice,
        operator=operator_approver(context.operator).label, more=len(pending) >= PENDING_SHOWN,
        max_note=MAX_NOTE_CHARS, decided_url=DECIDED,
    )  # fmt: skip


@PAGE.routes.get(DECIDED)
async def decided_fragment(request: web.Request) -> web.Response:
    context = context_of(request)
    return fragment(request, "approvals_decided.html", decided=await context.db.run(_decided, context))


def _field(form: object, name: str) -> str:
    value = form.get(name, "")  # type: ignore[attr-defined]
    return value if isinstance(value, str) else ""  # a file where text belongs counts as nothing


def _refused(status: type[web.HTTPException], line: str) -> web.HTTPException:
    return status(text=line + "\n", content_type="text/plain")


@PAGE.routes.post(DECIDE)
async def decide(request: web.Request) -> web.StreamResponse:
    """Approve or deny one gate as the operator, then back to the page with the outcome (post/redirect/get)."""
    context = context_of(request)
    form = await request.post()
    gate_id, decision, note = (
        _field(form, "gate").strip(),
        _field(form, "decision"),
        _field(form, "note").strip(),
    )
    if not is_gate_id(gate_id):
        raise _refused(
            web.HTTPBadRequest,
            f"{gate_id[:40]!r} is not a gate id: g- and hex digits, as the Approvals page and "
            "`impyard approvals ls` show them",
        )
    if decision not in DECISIONS:
        raise _refused(web.HTTPBadRequest, "the decision must be approve or deny")
    if len(note) > MAX_NOTE_CHARS or not note.isprintable():
        raise _refused(
            web.HTTPBadRequest, f"a note is one line of at most {MAX_NOTE_CHARS} printable characters"
        )
    store, approver = _store(context), operator_approver(context.operator)
    try:
        await context.db.run(lambda: store.decide(gate_id, approver, approve=DECISIONS[decision], note=note))
        outcome = "decided"
    except GateError as exc:
        if exc.kind == "not_found":
            raise _refused(
                web.HTTPNotFound, f"no gate {gate_id}: the Approvals page lists the pending ones"
            ) from None
        if exc.kind not in ("not_pending", "expired"):
            raise _refused(web.HTTPConflict, str(exc)) from None
        outcome = "already"  # someone decided first (a Discord button, the CLI), or its deadline passed
    raise web.HTTPSeeOther(f"{PAGE.path}?{urlencode({'gate': gate_id, 'outcome': outcome})}")
