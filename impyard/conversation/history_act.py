"""``history.*``: the gateway's act that keeps a box's own responder lines (issue 22; docs/architecture.md).

A box reads and writes only its own channel's lines (the pipe is the identity: no request names one), at a
bounded rate. The store is ``ResponderHistory``; the gateway's core writes the audit: a load is audited with the
commit that ends its turn (one row a turn, like ``memory.*``), the commit's row inside the commit's own
transaction (``Gateway.row_in``: the lines and the row that speaks of them commit together), and loads no commit
followed when the box ends (``closed``).
"""

from __future__ import annotations

import time
from typing import ClassVar

from pydantic import BaseModel
from sqlalchemy.engine import Connection

from box.protocol.history import (
    HistoryCommitParams,
    HistoryCommitResult,
    HistoryLoadParams,
    HistoryLoadResult,
)
from impyard.backends.base import BoxSpec
from impyard.conversation.responder_history import ResponderHistory, line_views
from impyard.gateway.act import Act, Request, denied, refusal
from impyard.gateway.audit import AuditRecord

HISTORY_RULE = "history-own-channel"  # issue 22: a box reads and writes only its own channel's lines
HISTORY_RATE_RULE = "history-requests"
HISTORY_REQUESTS_PER_MINUTE = 120  # per box: a turn makes two (one load, one commit), an event one


class HistoryAct(Act):
    """Serves ``history.load`` and ``history.commit`` from ``history``."""

    methods: ClassVar[frozenset[str]] = frozenset({"history.load", "history.commit"})

    def __init__(self, history: ResponderHistory) -> None:
        self.history = history
        self._loads: dict[str, int] = {}  # per box (run id): loads not yet audited with a commit

    async def handle(self, request: Request) -> BaseModel:
        self._allowed(request.spec, request.record)
        if isinstance(request.params, HistoryLoadParams):
            return await self._load(request.spec, request.record)
        assert isinstance(request.params, HistoryCommitParams)
        return await self._commit(request.spec, request.params, request.record)

    def _allowed(self, spec: BoxSpec, record: AuditRecord) -> None:
        """The box's own channel only, and a bounded rate."""
        record.rule = HISTORY_RULE
        if self.gateway.rates.take(("history", spec.run_id), HISTORY_REQUESTS_PER_MINUTE) is not None:
            reason = f"at most {HISTORY_REQUESTS_PER_MINUTE} history requests a minute"
            raise refusal(denied(HISTORY_RATE_RULE, reason), record)

    async def _load(self, spec: BoxSpec, record: AuditRecord) -> HistoryLoadResult:
        """A read of the box's own lines; its row is the next commit's (or the box's end's)."""
        lines = await self.gateway.db.quick(self.history.load, spec.imp, spec.channel_id)
        self._loads[spec.run_id] = self._loads.get(spec.run_id, 0) + 1
        record.verdict, record.deferred = "allowed", True  # no row of its own: counted in the commit's
        return HistoryLoadResult(lines=line_views(lines))

    async def _commit(
        self, spec: BoxSpec, params: HistoryCommitParams, record: AuditRecord
    ) -> HistoryCommitResult:
        loads = self._loads.get(spec.run_id, 0)
        started = time.perf_counter()

        def audited(
            conn: Connection, stored: int
        ) -> None:  # the gateway's row joins the commit's transaction
            record.verdict, record.purpose = "allowed", params.outcome or ""
            record.reason = f"{stored} of {len(params.lines)} lines new, in its own channel"
            record.detail = f"loads since the last commit: {loads}"
            record.started = started
            self.gateway.row_in(conn, record)

        stored = await self.gateway.db.quick(
            lambda: self.history.commit(spec.imp, spec.channel_id, params.lines, params.outcome, also=audited)
        )
        record.deferred = True  # written above, with the lines it speaks of
        self._loads.pop(spec.run_id, None)
        return HistoryCommitResult(stored=stored)

    def closed(self, spec: BoxSpec) -> AuditRecord | None:
        """The box ended: its loads that no commit followed (a failed turn reads, never writes), as one row."""
        loads = self._loads.pop(spec.run_id, 0)
        if not loads:
            return None
        return AuditRecord(
            imp=spec.imp, method="history.load", verdict="allowed", run_id=spec.run_id, channel_id=spec.channel_id,
            rule=HISTORY_RULE, reason=f"{loads} loads of its own channel, no commit after them",
        )  # fmt: skip
