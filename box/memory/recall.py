"""Recall: what comes to mind, composed in the box from the host's ranked search (mechanisms 14-31).

The host scores (cosine × the weight of the felt strength, the name bonus where a name discriminates, the
episodes that match best, top k, the length check: 14-17, 30; issue 32's departures in docs/memory.md);
this module does the rest (seed 002, "Involuntary recall", "Deliberate recall", "Plain recall";
subtle points 2, 4, 5):

* **involuntary** — embed the words, search, collapse rumination (18), let candidates felt at ≥ 0.5
  pass (19), ask the association filter about the rest with room max(1, 4 − passed) (20, 21), then
  drop what is already in the focus (22). No filter call when nothing is below the floor. Issue 33: the
  filter is not shown the weak candidates already in the focus (this conversation's own records, its
  living one first of all): the seed dropped them after the call, so they cost tokens and decided nothing;
  with none left below the floor there is no filter call at all.
* **deliberate** — a search the imp makes (23): search, collapse, keep only records of a person the query
  names (24; none left: empty, no filter call), then the filter with room 4 (plus one for each candidate
  already in the focus). What the filter keeps that is in the focus does not come to mind again (22), but
  it is found: ``Recalled.in_view`` (issue 32, finding 6 — a search never reports "no memory" of what the
  imp holds in view).
  A name is a person the imp knows or an explicit ``@mention`` (issue 32; ``laws.query_names``), not any
  capital.
* **plain** (29), **about_person** (28), **own_of_kind** (27), **knows** (25) — the primitives of the
  probes and of arrival (issue II).

A failed embedding makes recall empty for that turn (never a failed reply); a store that does not
answer raises ``StoreUnavailable`` for the engine to handle.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from box.common.laws import DEFAULTS, Params, collapse, mentions, names_in, query_names
from box.memory.store_client import StoreClient
from box.protocol.memory import ConstructKind, RecordView

RECALL_EPISODES = 3  # seed 002: recall loads 3 episodes per candidate (issue 32: the best-matching first)
FILTER_FALLBACK_KEEP = 3  # mechanism 20: an unreadable filter answer keeps the first 3
DELIBERATE_ROOM = 4  # seed 002, "Deliberate recall": the filter with room 4
OWN_OF_KIND = 3  # mechanism 27


class Embedder(Protocol):
    async def embed(self, text: str) -> list[float] | None: ...


@dataclass(frozen=True)
class FilterVerdict:
    """The association filter's answer (mechanisms 20, 21): indices into the candidates it was shown."""

    keep: list[int]
    asks_for_memory: bool = False
    asks_for_own: ConstructKind | None = None


class AssociationFilter(Protocol):
    async def choose(self, words: str, candidates: Sequence[RecordView], room: int) -> FilterVerdict | None:
        """The filter call (temperature 0.2); None when its answer cannot be read."""
        ...


@dataclass
class Recalled:
    """What one recall brought to mind, best first, and what the filter read in the words."""

    records: list[RecordView] = field(default_factory=list)
    asks_for_memory: bool = False  # mechanism 21
    asks_for_own: ConstructKind | None = None  # mechanism 21
    filter_called: bool = False  # subtle point 2: False when nothing was below the floor
    embedded: bool = True  # False: the embedding failed, so nothing could be recalled
    # A deliberate search only: what it found that is already in this conversation's focus. Such a record
    # does not come to mind again (22), but the search found it and says so (issue 32, finding 6).
    in_view: list[RecordView] = field(default_factory=list)

    @property
    def lived(self) -> list[RecordView]:
        return [r for r in self.records if r.kind == "lived"]

    @property
    def constructs(self) -> list[RecordView]:
        return [r for r in self.records if r.kind == "construct"]


def collapse_rumination(candidates: Sequence[RecordView]) -> list[RecordView]:
    """Mechanism 18: one candidate per recurring feeling, the best-scoring one."""
    return collapse(
        candidates,
        feeling=lambda r: r.feeling,
        conclusion=lambda r: r.conclusion,
        vector=lambda r: r.vector,
        score=lambda r: r.score if r.score is not None else r.felt,
    )


def restricted_to(candidates: Sequence[RecordView], names: Sequence[str]) -> list[RecordView]:
    """Mechanism 24 (subtle point 4): records authored by one of ``names`` (exact) or mentioning one."""
    exact = set(names)
    return [r for r in candidates if r.author in exact or mentions(_record_text(r), list(names))]


def _record_text(record: RecordView) -> str:
    """What a record says, for the names test (24): a construct's statement counts, as the host's name
    bonus counts it (seed 002: statement + conclusion; a belief naming Rex was never found by "Rex")."""
    events = " ".join(f"{ep.as_happened} {ep.told or ''}" for ep in record.episodes)
    return f"{record.statement or ''} {record.conclusion} {events}"


def _kept(candidates: Sequence[RecordView], verdict: FilterVerdict | None) -> list[RecordView]:
    if verdict is None:
        return list(candidates[:FILTER_FALLBACK_KEEP])  # mechanism 20: the fallback
    chosen = dict.fromkeys(i for i in verdict.keep if 0 <= i < len(candidates))  # not cut to the room (2)
    return [candidates[i] for i in chosen]


async def plain_search(
    store: StoreClient, embedder: Embedder, query: str, params: Params = DEFAULTS
) -> list[RecordView]:
    """Mechanism 29: a plain search — the nearest records to ``query``, unfiltered, the focus not excluded,
    each with ``RECALL_EPISODES`` episodes (they stay: subtle point 5). Nothing when the embedding fails.
    Arrival's search (``Recall.plain``) and reflection's search_more (mechanism 80) are this one search."""
    vector = await embedder.embed(query)
    if vector is None:
        return []
    result = await store.search(vector, [], k=params.recall_candidates, episodes=RECALL_EPISODES)
    return result.records


class Recall:
    def __init__(
        self,
        store: StoreClient,
        embedder: Embedder,
        association_filter: AssociationFilter,
        params: Params = DEFAULTS,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.filter = association_filter
        self.params = params

    async def _search(self, vector: list[float], names: Sequence[str]) -> list[RecordView]:
        result = await self.store.search(
            vector, names, k=self.params.recall_candidates, episodes=RECALL_EPISODES, with_vectors=True
        )  # mechanisms 14-17, 30: scored by the host
        return collapse_rumination(result.records)  # mechanism 18

    async def involuntary(
        self,
        words: str,
        person: str | None,
        exclude: Collection[str],
        vector: list[float] | None,
        known: Sequence[str] = (),
    ) -> Recalled:
        """What the words bring to mind unasked. ``vector`` is the words' embedding (None: it failed);
        ``known``: the people the imp knows here, whose names in the words count as names (15, issue 32)."""
        if vector is None:
            return Recalled(embedded=False)
        candidates = await self._search(vector, names_in(words, person, known))
        floor = self.params.strength_passes_filter
        passed = [c for c in candidates if c.felt >= floor]  # mechanism 19
        rest = [c for c in candidates if c.felt < floor and c.id not in exclude]  # 22 before 20 (issue 33)
        recalled = Recalled()
        kept: list[RecordView] = []
        if rest:  # subtle point 2: no call when nothing is below the floor
            room = max(1, self.params.filter_keep - len(passed))  # mechanism 20
            verdict = await self.filter.choose(words, rest, room)
            recalled.filter_called = True
            kept = _kept(rest, verdict)
            if verdict is not None:
                recalled.asks_for_memory = verdict.asks_for_memory
                recalled.asks_for_own = verdict.asks_for_own
        recalled.records = [r for r in passed + kept if r.id not in exclude]  # mechanism 22
        return recalled

    async def deliberate(
        self,
        query: str,
        person: str | None,
        exclude: Collection[str],
        known: Sequence[str] = (),
        vector: list[float] | None = None,
    ) -> Recalled:
        """Mechanisms 23-24: a search the imp asked for; only what the filter keeps is found.

        ``exclude`` is the focus (22): a kept record in it does not come to mind again (``records``), but it
        is reported as found in view (``in_view``), never dropped into "nothing found" (issue 32, finding
        6: two turns after "my dog is called Rex", "do you remember my dog's name?" found nothing while the
        record sat in the imp's state). Candidates in the focus widen the filter's room by one each, so
        they never crowd out a memory from before this conversation. ``vector``: the query's embedding when
        the caller has it already (the moment probe's words, embedded for recall: issue 33).
        """
        if vector is None:
            vector = await self.embedder.embed(query)
        if vector is None:
            return Recalled(embedded=False)
        candidates = await self._search(vector, names_in(query, person, known))
        names = query_names(query, person, known)
        if names:
            candidates = restricted_to(candidates, names)  # mechanism 24
        if not candidates:
            return Recalled()  # empty, and no filter call
        in_focus = sum(1 for c in candidates if c.id in exclude)
        verdict = await self.filter.choose(query, candidates, DELIBERATE_ROOM + in_focus)
        kept = _kept(candidates, verdict)
        return Recalled(
            records=[r for r in kept if r.id not in exclude],  # mechanism 22
            in_view=[r for r in kept if r.id in exclude],
            filter_called=True,
        )

    async def plain(self, query: str) -> list[RecordView]:
        """Mechanism 29: the nearest records, unfiltered, focus not excluded (``plain_search``)."""
        return await plain_search(self.store, self.embedder, query, self.params)

    async def about_person(self, person: str) -> list[RecordView]:
        """Mechanism 28: the strongest records (raw intensity) by or about the person; no similarity, no filter."""
        result = await self.store.about(person, k=self.params.arrival_associations, episodes=RECALL_EPISODES)
        return result.records

    async def own_of_kind(self, kind: ConstructKind) -> list[RecordView]:
        """Mechanism 27: the 3 most recently felt constructs of one kind."""
        return (await self.store.constructs(kind, k=OWN_OF_KIND)).records

    async def knows(self, person: str, exclude: Collection[str]) -> bool:
        """Mechanism 25: is there any record with or about the person outside this conversation?"""
        result = await self.store.about(person, k=1, exclude=list(exclude), episodes=0)
        return bool(result.records)
