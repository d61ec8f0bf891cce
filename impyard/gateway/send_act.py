"""``discord.send``: the gateway's act that posts through the host's surface (docs/security.md).

judge → rate limit → trust (auto, or a gate: ``trust``, ``gates``) → whether this host's surface reaches the
channel → the post, through the surface the host built (an imp's own posts join the channel history there:
``impyard.conversation.history_surface``). The act fills in the request's audit row; the core writes it. An
approved gate comes back here (``deliver_gate``) to be posted, exactly once (the core claims it).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

from pydantic import BaseModel
from sqlalchemy.engine import Connection

from box.protocol import ErrorCode, RpcError
from box.protocol.models import DiscordSendParams, DiscordSendResult
from impyard.backends.base import BoxSpec
from impyard.channels.store import ChannelInfo, channel_is_trusted
from impyard.gateway.act import Act, Decision, Request, denied, enforce
from impyard.gateway.core import GateCallback
from impyard.gateway.gates import Gate
from impyard.gateway.judge import decode_file
from impyard.gateway.surfaces import OutgoingFile, Post, Surface, SurfaceError, surface_of
from impyard.gateway.trust import decide_trust

log = logging.getLogger("impyard.gateway")

SEND_ACT = "discord.send"


def post_of(params: DiscordSendParams, imp: str) -> Post:
    """A box's ``discord.send`` as the surface posts it (its files decoded)."""
    files = tuple(OutgoingFile(item.filename, decode_file(item.data_b64)) for item in params.files)
    return Post(params.channel_id, params.content, params.reply_to, files, params.kind, imp)


@dataclass(frozen=True)
class _SendFacts:
    """What a ``discord.send`` decision reads of the database (one read transaction): the session channel's trust,
    the clean approvals of this imp for the target, and the target channel as known (None: unknown, or not
    needed)."""

    own_trusted: bool
    clean_approvals: int
    target: ChannelInfo | None


class SendAct(Act):
    """Serves ``discord.send`` through ``surface``; ``surfaces``: where that surface posts
    (``impyard.gateway.surfaces.surface_of`` names; None = everywhere); ``on_gate``: told of every gate opened
    (the Discord surface posts an approval card)."""

    methods: ClassVar[frozenset[str]] = frozenset({SEND_ACT})
    gated: ClassVar[frozenset[str]] = frozenset({SEND_ACT})

    def __init__(
        self,
        surface: Surface,
        *,
        surfaces: Collection[str] | None = None,
        on_gate: GateCallback | None = None,
    ) -> None:
        self.surface = surface
        self.surfaces = frozenset(surfaces) if surfaces is not None else None
        self.on_gate = on_gate

    async def dry_run(self, spec: BoxSpec, method: str, params: BaseModel) -> Decision | None:
        if not isinstance(params, DiscordSendParams):
            return None
        return await self._decide_send(spec, params, commit=False)

    async def deliver_gate(self, gate: Gate) -> list[str]:
        return await self._deliver(post_of(gate.send, gate.imp))

    async def _decide_send(self, spec: BoxSpec, params: DiscordSendParams, *, commit: bool) -> Decision:
        """judge → rate limit → trust (auto, or a gate) → whether this host reaches the channel.
        ``commit`` takes the rate-meter event (the live send)."""
        verdict = self.gateway.judge_send(spec, params)
        if not verdict.allowed:
            return denied(verdict.rule, verdict.reason)
        assert verdict.matched is not None
        rule = verdict.matched
        limited = self.gateway.rate(rule, (spec.imp, params.channel_id), commit=commit)
        if limited is not None:
            return limited
        seen = await self.gateway.db.quick(self._send_facts, spec, params.channel_id)  # one read (issue 18)
        trust = decide_trust(
            target_is_own=params.channel_id == spec.channel_id,
            own_trusted=seen.own_trusted,
            rule_trust=rule.trust,
            settings=self.gateway.policy.trust_for(SEND_ACT),
            clean_approvals=seen.clean_approvals,
        )
        if trust.mode == "gate":
            return Decision("gated", rule.name, "allowed", trust=trust)
        unreachable = self._unreachable_refusal(params.channel_id, seen.target)
        if unreachable is not None:
            return Decision("unreachable", rule.name, unreachable.message, unreachable, trust=trust)
        return Decision("allowed", rule.name, "allowed", trust=trust)

    def _send_facts(self, spec: BoxSpec, target: str) -> _SendFacts:
        """Blocking: what a send's decision reads of the database, in one read transaction (issue 18)."""

        def read(conn: Connection) -> _SendFacts:
            channels = self.gateway.channels
            own = channels.info(spec.channel_id, conn=conn)
            # A post into its own channel (nearly every one) reads that row once (issue 36: a round trip fewer).
            seen = own if target == spec.channel_id else channels.info(target, conn=conn)
            return _SendFacts(
                own_trusted=channel_is_trusted(own),
                clean_approvals=self.gateway.earned.count(spec.imp, SEND_ACT, target, conn=conn),
                target=seen if self.surfaces is not None else None,
            )

        return self.gateway.db.read(read)

    async def handle(self, request: Request) -> DiscordSendResult:
        spec, params, record = request.spec, request.params, request.record
        assert isinstance(params, DiscordSendParams)
        record.purpose = params.kind
        record.detail = f"to {params.channel_id}, {len(params.content)} chars, {len(params.files)} files"
        decision = await self._decide_send(spec, params, commit=True)
        if decision.trust is not None:
            record.detail += f"; trust: {decision.trust.why}"
        enforce(decision, record)
        if decision.verdict == "gated":
            assert decision.trust is not None
            reason = decision.trust.why
            payload = params.model_dump(mode="json")
            deadline = timedelta(hours=self.gateway.policy.gates.deadline_hours)

            def open_gate() -> Gate:  # one trip (issue 18): both channels read, the gate opened
                own = self.gateway.channels.info(spec.channel_id)
                # Admins of the guild the post lands in decide it (issue 11 #5); a channel the host never saw has none.
                target = (
                    own
                    if params.channel_id == spec.channel_id
                    else self.gateway.channels.info(params.channel_id)
                )
                return self.gateway.gates.open(
                    imp=spec.imp,
                    run_id=spec.run_id,
                    session_channel=spec.channel_id,
                    origin_guild=own.guild_id if own else None,
                    target_guild=target.guild_id if target else None,
                    act=SEND_ACT,
                    target=params.channel_id,
                    payload=payload,
                    reason=reason,
                    deadline=deadline,
                )

            gate = await self.gateway.db.run(open_gate)
            record.verdict, record.gate_id = "gated", gate.id
            await self._gate_opened(gate)
            return DiscordSendResult(status="pending", gate_id=gate.id)
        try:
            message_ids = await self._deliver(post_of(params, spec.imp))
        except RpcError:
            record.verdict = "unreachable"
            raise
        record.verdict = "allowed"
        record.detail += f"; message ids {message_ids}"
        return DiscordSendResult(status="delivered", message_ids=message_ids)

    async def reaches(self, channel_id: str) -> bool:
        """Whether this host's surface posts in ``channel_id`` (a supervisor without Discord does not)."""
        if self.surfaces is None:
            return True
        return self._reaches(channel_id, await self.gateway.db.run(self.gateway.channels.info, channel_id))

    def _reaches(self, channel_id: str, info: ChannelInfo | None) -> bool:
        """``reaches``, given what the host knows of the channel (``info``)."""
        return (
            self.surfaces is None or surface_of(channel_id, info.surface if info else None) in self.surfaces
        )

    def _unreachable_refusal(self, channel_id: str, info: ChannelInfo | None) -> RpcError | None:
        """The refusal of a post into a channel this host's surface does not reach; None when it does."""
        if self._reaches(channel_id, info):
            return None
        where = surface_of(channel_id)
        reason = (
            f"channel {channel_id} is on {where}, which this host does not reach "
            f"(it posts on {', '.join(sorted(self.surfaces or ())) or 'nothing'})"
        )
        hint = "; run the task under `impyard serve --supervise`" if where == "discord" else ""
        return RpcError(
            ErrorCode.UPSTREAM_UNREACHABLE,
            f"the message could not be delivered: {reason}{hint}",
            {"reason": reason},
        )

    async def _deliver(self, post: Post) -> list[str]:
        """Post through the surface; a post it cannot deliver is the box's UPSTREAM_UNREACHABLE."""
        try:
            return await self.surface.send(post)
        except SurfaceError as exc:
            raise RpcError(
                ErrorCode.UPSTREAM_UNREACHABLE,
                f"the message could not be delivered: {exc}",
                {"reason": str(exc)},
            ) from None

    async def _gate_opened(self, gate: Gate) -> None:
        """Tell the surface (an approval card); the gate stands in the database whatever happens here."""
        if self.on_gate is None:
            return
        try:
            await self.on_gate(gate)
        except Exception:  # noqa: BLE001 - a card that cannot be posted never fails the box's request
            log.exception("announcing gate %s failed; it waits in `impyard approvals ls`", gate.id)
