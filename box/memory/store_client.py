"""The box's side of the memory store: one async method per ``memory.*`` request (docs/memory.md).

The store lives in the host's database; the box asks through the protocol peer and never names a
scope (the host applies the session's scopes itself). Anything that goes wrong on the way — the host
refuses (``RpcError``), the pipe is gone (``PeerClosed``), the request cannot even be formed — is one
``StoreUnavailable``: the turn then answers without memory and says so in the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from box.protocol import PeerClosed, RpcError
from box.protocol.memory import (
    AboutParams,
    ConsolidateParams,
    ConsolidateResult,
    ConstructKind,
    ConstructParams,
    ConstructResult,
    ConstructsParams,
    ConversationGetParams,
    ConversationPutParams,
    ConversationState,
    DispositionsParams,
    DispositionsResult,
    DispositionView,
    EncodeParams,
    EncodeResult,
    EpisodesParams,
    EpisodesResult,
    EpisodeView,
    ForgetParams,
    ForgetResult,
    Group,
    LearnParams,
    LearnResult,
    NightParams,
    RecentParams,
    RecordKind,
    RecordsResult,
    Restore,
    RestoreParams,
    RestoreResult,
    SearchParams,
    SlotEntry,
    SlotParams,
    SlotRefreshParams,
    SlotResult,
)


class StoreUnavailable(Exception):
    """The host's memory store did not answer a ``memory.*`` request."""


class Requester(Protocol):
    """What the store client needs of the protocol peer."""

    async def request(self, method: str, params: BaseModel, *, timeout: float | None = None) -> BaseModel: ...


class StoreClient:
    def __init__(self, peer: Requester) -> None:
        self.peer = peer

    async def _ask(self, method: str, build: Any, **fields: Any) -> BaseModel:
        try:
            params = build(**fields)
            return await self.peer.request(method, params)
        except (RpcError, PeerClosed, ValidationError) as exc:
            raise StoreUnavailable(f"{method}: {exc}"[:500]) from exc

    async def search(
        self,
        vector: list[float],
        names: Sequence[str] = (),
        *,
        k: int = 10,
        episodes: int = 3,
        kinds: Sequence[RecordKind] = ("lived", "construct"),
        with_vectors: bool = False,
    ) -> RecordsResult:
        result = await self._ask(
            "memory.search", SearchParams, vector=list(vector), names=list(names)[:16], k=k,
            episodes=episodes, kinds=list(kinds), with_vectors=with_vectors,
        )  # fmt: skip
        assert isinstance(result, RecordsResult)
        return result

    async def recent(
        self, *, k: int = 5, episodes: int = 3, kinds: Sequence[RecordKind] = ("lived",)
    ) -> RecordsResult:
        result = await self._ask("memory.recent", RecentParams, k=k, episodes=episodes, kinds=list(kinds))
        assert isinstance(result, RecordsResult)
        return result

    async def about(
        self, person: str, *, k: int = 6, exclude: Sequence[str] = (), episodes: int = 3
    ) -> RecordsResult:
        result = await self._ask(
            "memory.about",
            AboutParams,
            person=person[:64],
            k=k,
            exclude=list(exclude)[:200],
            episodes=episodes,
        )
        assert isinstance(result, RecordsResult)
        return result

    async def constructs(self, kind: ConstructKind, *, k: int = 3) -> RecordsResult:
        result = await self._ask("memory.constructs", ConstructsParams, construct_kind=kind, k=k)
        assert isinstance(result, RecordsResult)
        return result

    async def episodes(self, record_ids: Sequence[str], *, per_record: int = 3) -> list[EpisodeView]:
        if not record_ids:
            return []
        result = await self._ask(
            "memory.episodes", EpisodesParams, record_ids=list(record_ids)[:50], per_record=per_record
        )
        assert isinstance(result, EpisodesResult)
        return result.episodes

    async def encode(self, params: EncodeParams) -> EncodeResult:
        result = await self._ask("memory.encode", lambda: params)
        assert isinstance(result, EncodeResult)
        return result

    async def restore(self, items: Sequence[Restore]) -> int:
        if not items:
            return 0
        result = await self._ask("memory.restore", RestoreParams, items=list(items)[:20])
        assert isinstance(result, RestoreResult)
        return result.restored

    async def conversation_get(self, person: str) -> ConversationState:
        result = await self._ask("memory.conversation.get", ConversationGetParams, person=person)
        assert isinstance(result, ConversationState)
        return result

    async def conversation_put(self, person: str, state: dict[str, Any]) -> None:
        await self._ask("memory.conversation.put", ConversationPutParams, person=person, state=state)

    # ------------------------------------------------------------ issue 14: constructs, slot, dispositions

    async def construct(self, params: ConstructParams) -> ConstructResult:
        """Form (or recur, or reinforce) a construct in the session's writes scope (mechanisms 74-82)."""
        result = await self._ask("memory.construct", lambda: params)
        assert isinstance(result, ConstructResult)
        return result

    async def slot(self) -> list[SlotEntry]:
        """The slot of the session's writes scope as loaded (mechanisms 87-88), oldest activation first."""
        result = await self._ask("memory.slot", SlotParams)
        assert isinstance(result, SlotResult)
        return result.entries

    async def slot_refresh(self, record_ids: Sequence[str]) -> list[SlotEntry]:
        """Held constructs brought to mind again get a new activation time (mechanism 86)."""
        if not record_ids:
            return await self.slot()
        result = await self._ask("memory.slot.refresh", SlotRefreshParams, record_ids=list(record_ids)[:32])
        assert isinstance(result, SlotResult)
        return result.entries

    async def dispositions(self, *, k: int = 100, active_only: bool = False) -> list[DispositionView]:
        """The ``k`` strongest learned rules by |weight| (mechanisms 94, 98-99)."""
        result = await self._ask("memory.dispositions", DispositionsParams, k=k, active_only=active_only)
        assert isinstance(result, DispositionsResult)
        return result.rules

    async def learn(
        self,
        rule: str,
        weight: float,
        *,
        same: str | None = None,
        contradicts: str | None = None,
        avoidance_weight: float = 2.0,
    ) -> LearnResult:
        """Keep a learned rule: counted, replaced or added; a contradicted one weakened (mechanisms 95-97)."""
        result = await self._ask(
            "memory.dispositions.learn", LearnParams, rule=rule, weight=weight, same=same,
            contradicts=contradicts, avoidance_weight=avoidance_weight,
        )  # fmt: skip
        assert isinstance(result, LearnResult)
        return result

    # ------------------------------------------------------------ issue 15: the night

    async def night(self, since: datetime, *, k: int = 200, episodes: int = 6) -> RecordsResult:
        """The writes scope's records since ``since`` (the imp's waking), newest first (mechanism 107)."""
        result = await self._ask("memory.night", NightParams, since=since, k=k, episodes=episodes)
        assert isinstance(result, RecordsResult)
        return result

    async def consolidate(self, groups: Sequence[tuple[str, Sequence[str]]]) -> ConsolidateResult:
        """Fold each (anchor, members) group; the host checks every rule again (mechanisms 108-111, 113)."""
        result = await self._ask(
            "memory.consolidate",
            ConsolidateParams,
            groups=[Group(anchor=a, members=list(m)) for a, m in groups if m][:50],
        )
        assert isinstance(result, ConsolidateResult)
        return result

    async def forget(self) -> ForgetResult:
        """The forgetting curve over the writes scope (mechanisms 112-113)."""
        result = await self._ask("memory.forget", ForgetParams)
        assert isinstance(result, ForgetResult)
        return result
