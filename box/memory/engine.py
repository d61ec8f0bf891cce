"""The memory engine in the turn (issue 23): ``ChatMemory`` behind the ``MemoryEngine`` seam.

ContextBuilding (``begin``): load this person's conversation, count the turn, then — concurrently — the
summary cadence (44) beside the words' embedding, the recent records, the search and the filter (14-24,
32); compose the State (32-37) and the ``### Memory`` block (1-13, 37-43).

ToolExecution (``next_hop`` after each draft): one action hop (49) searches, or reflects mid-turn
(50-52), and recomposes the State (36) for another reply call. Issue 33: the probes (25-27) run in
ContextBuilding, before the first reply call — what they need is known there (no record of the person;
the filter read a question about the past or about the imp's own mind) — so no draft is written only to
be thrown away; a turn makes at most 2 reply calls.

Issue 14 (memory II): the slot is loaded at every turn (88) and shown under YOUR OWN THOUGHTS (89); the
learned rules are selected beside recall (99) and shown to the reply only (100); a new conversation opens
with the person's arrival (101-102); ``depart`` runs a departure as a task (103): the context saved, the
conversation left, one quiet reflection, then disposition learning (90-98).

PostSend (``commit``, after delivery is confirmed): the appraisal (57-59) bent by the temperament (60),
the event and its vectors (61-63), joining or opening a record (64-66), the focus (31, 41) and the
conversation saved.

A store that does not answer never fails a reply: at the start the turn goes on without memory, in a hop
the draft stands, at the end the moment is not kept — each with a log line to the host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import anyio

from box.common.busy import ModelCaller
from box.common.envelope import Envelope
from box.common.laws import DEFAULTS, Params, Temperament
from box.memory import NO_TURN, CommittedTurn, MemoryTurn, TurnFacts
from box.memory import contexts as ctx
from box.memory.arrival import Arrival, Arrived
from box.memory.association_filter import ModelFilter
from box.memory.calls import TEMPERATURE_APPRAISAL, CallLog, MemoryModel
from box.memory.contexts import ReplyView, Scene, SearchNote
from box.memory.conversation import Conversation
from box.memory.dispositions import Learner, ModelSelector, carried_lines
from box.memory.embedder import GatewayEmbedder, HashingEmbedder
from box.memory.focus import authored_by, cut, moment_entry
from box.memory.moment import SCHEMA as APPRAISAL_SCHEMA
from box.memory.moment import Felt, encoding, event_text, joins, read_appraisal, reply_moment, searched_text
from box.memory.prompts import Prompts, packaged_prompts
from box.memory.recall import Embedder, Recall, Recalled
from box.memory.reflection import Reflector, Seed
from box.memory.state import State, compose
from box.memory.store_client import StoreClient, StoreUnavailable
from box.memory.summary import Summariser
from box.protocol.memory import BOTH_KINDS, EpisodeView, RecordView, SlotEntry
from box.protocol.models import BoxInitParams, MemorySettings

log = logging.getLogger("box.memory")

HostLog = Callable[[str, str], Awaitable[None]]  # (level, message)

MAX_REPLY_CALLS = 4  # mechanism 49
CARRIED_WINDOW = 12  # mechanism 92: carried lines come from the 12 most recently felt records
SEED_CHARS = 2_000  # a mid-turn seed's exchange before the reflection's own cut (51: 300 shown)
MOMENT_PROBE_WORDS = 70  # seed 002: moment-probe words cut to 70
STATE_EPISODES = 5  # episodesPerFeeling: the State's entries are reloaded with 5 (subtle point 5)
TURN_BUDGET_S = 100.0  # without a ceiling from the host: before its default 120 s turn ceiling (121)
TURN_BUDGET_SHARE = 0.85  # of the host's turn ceiling: the reply still has time after a busy backoff
UNKNOWN_PROBE = "{person} — who is this person, what do we have in common"  # mechanism 25


class DispositionSelector(Protocol):
    """The disposition-selection seam (mechanism 99; issue "Memory engine II" fills it): which learned rules
    fit this situation. It runs beside recall and the summary, off the reply's critical path."""

    async def select(self, turn: ChatTurn) -> list[str]: ...


class NoDispositions:
    """No rule is ever selected and no call is made (an ablation; the engine's default is ``ModelSelector``)."""

    async def select(self, turn: ChatTurn) -> list[str]:
        return []


class DepartureFailed(Exception):
    """A departure could not run (the store did not answer); the task fails and says why."""


async def concurrently(*works: Callable[[], Awaitable[None]]) -> None:
    """Run ``works`` side by side; a store that does not answer in one of them is raised once all are done."""
    failures: list[StoreUnavailable] = []

    async def guarded(work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except StoreUnavailable as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        for work in works:
            tg.start_soon(guarded, work)
    if failures:
        raise failures[0]


def temperament_of(settings: MemorySettings) -> Temperament:
    return Temperament(settings.valence_bias, settings.intensity_amplification, settings.avoidance_weight)


class ChatMemory:
    """The engine of one box session. One turn at a time (the box serialises turns)."""

    def __init__(
        self,
        *,
        init: BoxInitParams,
        store: StoreClient,
        client: ModelCaller,
        state_dir: Path | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        host_log: HostLog | None = None,
        embedder: Embedder | None = None,
        prompts: Prompts | None = None,
        params: Params = DEFAULTS,
        dispositions: DispositionSelector | None = None,
    ) -> None:
        self.init = init
        self.settings = settings = init.imp.memory
        self.store = store
        self.now: datetime = init.now  # mechanism 122: the host's clock, moved by every delivery
        self._started = time.monotonic()
        self.model = MemoryModel(
            client, settings, init.imp.responder.model,
            call_log=CallLog.in_state_dir(state_dir, settings) if state_dir is not None else None,
            sleep=sleep, clock=lambda: self.now, deadline=self.deadline, server=init.imp.responder.server,
        )  # fmt: skip
        self.embedder: Embedder = embedder or (
            HashingEmbedder()
            if settings.embedder == "hashing"
            else GatewayEmbedder(self.model, settings.embedding_model, settings.dimensions)
        )
        self.prompts = prompts or packaged_prompts()
        self.params = params
        self.temperament = temperament_of(settings)
        self._host_log = host_log
        self.filter = ModelFilter(
            self.model, self.prompts, init.imp.name, settings.timezone, lambda: self.now
        )
        self.recall = Recall(store, self.embedder, self.filter, params)
        self.summariser = Summariser(
            self.model, self.prompts, init.imp.name, settings.timezone, lambda: self.now, params
        )
        self.reflector = Reflector(
            model=self.model, store=store, embedder=self.embedder, prompts=self.prompts, imp=init.imp.name,
            timezone=settings.timezone, params=params, temperament=self.temperament, host_log=host_log,
        )  # fmt: skip
        self.arrival = Arrival(
            model=self.model, recall=self.recall, prompts=self.prompts, imp=init.imp.name,
            temperament=self.temperament,
        )  # fmt: skip
        self.dispositions: DispositionSelector = dispositions or ModelSelector(
            self.model, store, self.prompts, init.imp.name, params
        )
        self.learner = Learner(self.model, store, self.prompts, init.imp.name, self.temperament, params)
        self.current: ChatTurn | None = None

    def deadline(self) -> float | None:
        """Seconds left of this turn's memory budget (the busy backoff never waits past it, 121)."""
        ceiling = self.init.session.turn_ceiling_s
        budget = ceiling * TURN_BUDGET_SHARE if ceiling is not None else TURN_BUDGET_S
        return budget - (time.monotonic() - self._started)

    async def log(self, level: str, message: str) -> None:
        log.log(logging.getLevelName(level.upper()), message)
        if self._host_log is not None:
            await self._host_log(level, message[:1000])

    # ------------------------------------------------------------ the seam

    async def begin(self, facts: TurnFacts) -> MemoryTurn:
        self.current = None
        if facts.task:
            return NO_TURN  # a scheduled prompt is nobody's words: nothing to recall or keep
        self.now = facts.now
        self._started = time.monotonic()
        turn = ChatTurn(self, facts)
        try:
            await turn.prepare()
        except StoreUnavailable as exc:
            await self.log("warning", f"memory store unavailable; this turn answers without memory: {exc}")
            return NO_TURN
        self.current = turn
        return turn

    async def search(self, query: str, limit: int) -> list[str]:
        """The ``search`` tool: a deliberate search (23, 24) in the current turn."""
        turn = self.current
        if turn is None:
            return []
        try:
            found = await turn.deliberate(query)
        except StoreUnavailable as exc:
            await self.log("warning", f"memory store unavailable during a search: {exc}")
            return []
        lines = [ctx.memory_line(self.prompts, turn.reply_model, r, turn.scene) for r in found[:limit]]
        in_view = turn.searches[-1].in_view if turn.searches else ()
        lines += [  # issue 32, finding 6: what this conversation holds is found too
            self.prompts.render(
                "search.tool_in_view",
                turn.reply_model,
                line=ctx.in_view_line(self.prompts, turn.reply_model, r),
            )
            for r in in_view
        ]
        return lines[:limit]

    async def record_event(self, channel_id: str, text: str) -> None:
        return None  # channel events are history, not moments of a conversation

    # ------------------------------------------------------------ departure (mechanism 103)

    async def depart(self, *, person_id: str, now: datetime) -> str:
        """Mechanism 103, run as a ``depart`` task: no reply and no record. The departure context is rendered
        and kept for learning (91), the conversation is left (its next message is an arrival), one quiet
        reflection runs over the focus, alone, then the carried lines are taken (after it: subtle point 14)
        and a rule may be learned (90-98). Returns what happened, for the task's summary."""
        self.current = None
        self.now = now
        self._started = time.monotonic()
        try:
            return await self._depart(person_id, now)
        except StoreUnavailable as exc:
            raise DepartureFailed(f"the memory store did not answer: {exc}") from exc

    async def _depart(self, person_id: str, now: datetime) -> str:
        store, params = self.store, self.params
        saved = await Conversation.saved_state(store, person_id)
        if saved is None:
            return "no conversation with this person here: nothing to reflect on"
        if saved.departed_at is not None and (
            saved.last_input_at is None or saved.departed_at >= saved.last_input_at
        ):
            return f"{saved.person} had already left this conversation"
        conversation = Conversation(saved)
        session = self.init.session
        scene = Scene(
            imp=self.init.imp.name, person=saved.person, person_id=saved.person_id, now=now,
            timezone=self.settings.timezone, channel_kind=session.channel_kind, channel_name=session.channel_name,
            hearing="left",
        )  # fmt: skip
        recent, slot = None, list[SlotEntry]()

        async def load_recent() -> None:
            nonlocal recent
            recent = await store.recent(k=params.recent_count, episodes=STATE_EPISODES)

        async def load_slot() -> None:
            nonlocal slot
            slot = await store.slot()

        await concurrently(load_recent, load_slot)
        assert recent is not None
        view = ReplyView(
            scene=scene, state=compose(recent.records, [], params), focus=conversation.focus,
            summary=saved.summary, slot=slot, total=recent.total,
        )  # fmt: skip
        context = ctx.reply_block(self.prompts, self.model.model_for("learning"), view)  # mechanism 91
        saved.departed_at = now  # mechanism 103: the person leaves presence
        await conversation.save(store)
        thoughts = 0
        for _ in range(params.quiet_thoughts):  # mechanism 103: one quiet reflection over the focus, alone
            reflected = await self.reflector.reflect(now=now, focus=conversation.focus, scene=scene)
            thoughts += len(reflected.steps)
        window = await store.recent(k=CARRIED_WINDOW, kinds=BOTH_KINDS, episodes=0)
        carried = carried_lines(window.records)  # mechanism 92, after the reflection
        valences = [
            e.valence
            for e in conversation.focus.moments()
            if not e.arrival
            and e.feeling
            and authored_by(e.author, e.author_id, saved.person, saved.person_id)
        ]  # mechanism 93: this person's moments that carry words, the arrival excluded
        learned = await self.learner.learn(
            context=context, carried=carried, valences=valences, person=saved.person
        )
        said = f"{saved.person} left; {thoughts} thought{'s' if thoughts != 1 else ''}"
        if learned.rule is None:
            return f"{said}; nothing learned ({learned.reason or 'no rule'})"
        return f"{said}; learned ({learned.action}, weight {learned.weight:+.2f}): {learned.rule}"

    # ------------------------------------------------------------ the imp's day (mechanisms 104-114)

    async def reflect_idle(self, *, now: datetime) -> str:
        """Mechanisms 105-106, run as a ``reflect`` task: one quiet reflection with no focus and no seed, in
        the channel of the imp's latest activity. Nothing is posted and no rule is learned. Returns what
        came of it, for the task's summary."""
        from box.memory.night import idle_scene  # the imp's day: loaded by the tasks that need it

        self.current = None
        self.now = now
        self._started = time.monotonic()
        reflected = await self.reflector.reflect(now=now, scene=idle_scene(self.init, now))
        thoughts = len(reflected.steps)
        formed = [step.act for step in reflected.steps if step.formed is not None]
        said = f"a quiet reflection: {thoughts} thought{'s' if thoughts != 1 else ''}"
        if not thoughts:
            return f"{said} (none came)"
        return f"{said}; formed {', '.join(formed)}" if formed else said

    async def night(self, *, now: datetime, since: datetime, consolidate: bool) -> str:
        """Mechanisms 107-114, run as a ``sleep`` task over one scope: fold the records since ``since`` (the
        imp's waking) when ``consolidate``, then forget. Returns a one-line account; a store that does not
        answer raises ``box.memory.night.NightFailed``."""
        from box.memory.night import Night  # the imp's day: loaded by the tasks that need it

        self.current = None
        self.now = now
        self._started = time.monotonic()
        night = Night(
            model=self.model, store=self.store, prompts=self.prompts, imp=self.init.imp.name,
            timezone=self.settings.timezone, params=self.params, host_log=self._host_log,
        )  # fmt: skip
        report = await night.run(now=now, since=since, consolidate=consolidate)
        return report.account()


def _recalled_first(recalled: Sequence[EpisodeView], newest: Sequence[EpisodeView]) -> list[EpisodeView]:
    """Subtle point 5 with issue 32: a State entry shows the episodes recall found for the words first (the
    search's best matches, already loaded), then its newest, ``STATE_EPISODES`` in all; the seed reloaded only
    the newest, so what was recalled for a turn long past could not be shown."""
    ids = {e.id for e in recalled}
    return [*recalled, *(e for e in newest if e.id not in ids)][:STATE_EPISODES]


class ChatTurn:
    """One turn's memory: built in ContextBuilding, hopped in ToolExecution, kept in PostSend."""

    def __init__(self, engine: ChatMemory, facts: TurnFacts) -> None:
        self.engine = engine
        self.facts = facts
        init = engine.init
        author = facts.message.author
        self.person = (author.name or author.id)[:64]
        self.person_id = author.id
        self.words = facts.message.content
        # Issue 32 (mechanism 15): the people the imp knows here, whose names count as names in words and queries.
        self.known = [p.name for p in facts.framing.participants] + [p.person for p in facts.presence]
        self.reply_model = engine.model.model_for("reply")  # mechanism 54
        images = sum(
            1 for a in facts.message.attachments if a.content_type.startswith("image/") and a.data_b64
        )
        self.scene = Scene(
            imp=init.imp.name, person=self.person, person_id=self.person_id, now=facts.now,
            timezone=engine.settings.timezone, channel_kind=init.session.channel_kind,
            channel_name=init.session.channel_name, images=images,
        )  # fmt: skip
        self.rules: str | None = ctx.reply_rules(engine.prompts, self.reply_model)
        self.conversation: Conversation | None = None
        self.recent: list[RecordView] = []
        self.recalled = Recalled()
        self.associations: list[RecordView] = []  # lived records recalled this turn, in order (31, 32)
        self.constructs: list[RecordView] = []  # constructs that came to mind (35)
        self.slot: list[SlotEntry] = []  # what the imp holds in mind (84-89), loaded at every turn (88)
        self.arrived: Arrived | None = None  # mechanism 101: this message opens a new conversation
        self.reflections = 0  # mid-turn reflections (50)
        self.searches: list[SearchNote] = []
        self.state = State()
        self.total = 0
        self.drafts = 0
        self.hops = 0
        self.stranger_known = False  # probe 25 found no record of the person: its null is in the senses
        self.moment_probe = 0
        self.kind_probed = False
        self.refeels: list[str] = []  # mechanism 38: parsed, no effect
        self.learned: list[str] = []  # mechanism 99: the rules the selection seam found fitting
        self._episodes: dict[str, list[EpisodeView]] = {}
        self.words_vector: list[float] | None = None  # the words' embedding (recall's, then the episode's)

    # ------------------------------------------------------------ ContextBuilding

    async def prepare(self) -> None:
        store = self.engine.store
        self.conversation = conversation = await Conversation.load(
            store, self.person, self.person_id, self.facts.now, self.engine.params.presence_stale_seconds
        )
        conversation.saved.turns += 1  # subtle point 15: counted before the reply
        if conversation.saved.started_at is None:
            conversation.saved.started_at = self.facts.now
        # The summary (44), the disposition selection (99), the slot (88), an arrival (101) and whether the
        # imp knows the person (25) run beside recall: off the critical path where they can be.
        await concurrently(self._recall, self._select, self._load_slot, self._know_person)
        if self.arrived is not None:  # the arrival was a moment of its own, before these words
            for record in self.arrived.records:  # mechanism 28: what came to mind stays in view (31)
                if not conversation.focus.evoke(record) and record.kind == "construct":
                    self._came_to_mind([record])
            if self.arrived.entry is not None:
                conversation.focus.add(self.arrived.entry)  # mechanism 102: the focus only, never stored
        await self._probe_asked()
        await self.recompose()

    async def _load_slot(self) -> None:
        """Mechanism 88: the slot, loaded once; then, for a new conversation, the arrival that shows it."""
        self.slot = await self.engine.store.slot()
        if self.conversation is not None and self.conversation.arrival:
            await self._arrive()

    async def _arrive(self) -> None:
        """Mechanisms 101-102: the person's arrival, before the ordinary turn for their words."""
        arrived = await self.engine.arrival.arrive(self.scene, self.slot)
        self.arrived = arrived
        if arrived.entry is None:
            await self.engine.log("info", f"{self.person} arrived; no arrival feeling could be formed")

    async def _know_person(self) -> None:
        """Mechanism 25, before the first reply call (issue 33): with no record with or about the person outside
        this conversation, the probe's search "X — who is this person…" is in the senses with its spoken null.
        The seed let the imp draft a reply first and probed when the draft was a world act, then threw the
        draft away; the answer is the same store question asked earlier (the restricted search can only
        return such records, so it needs no embedding), and the draft that was discarded is never written."""
        assert self.conversation is not None
        if await self.engine.recall.knows(self.person, self.made_here()):
            self.conversation.saved.stranger = False  # someone told the imp about them since
            return
        self.conversation.saved.stranger = True
        self.stranger_known = True
        self.searches.append(SearchNote(UNKNOWN_PROBE.format(person=self.person), 0))

    async def _probe_asked(self) -> None:
        """Mechanisms 27 and 26, before the first reply call (issue 33): when the filter read that the words ask
        what the imp dreams, believes, decided or wants, the 3 most recently felt constructs of that kind come
        to mind; when they ask for a moment of its past, the words (cut to 70) are searched. The seed drafted
        a reply first and regenerated it after each probe; what the probes need is the filter's verdict, known
        before any draft, so the draft that was always thrown away is never written."""
        kind = self.recalled.asks_for_own
        if kind is not None:  # mechanism 27
            self.kind_probed = True
            self._came_to_mind(await self.engine.recall.own_of_kind(kind))
        if self.recalled.asks_for_memory:  # mechanism 26
            self.moment_probe = 1
            query = self.words[:MOMENT_PROBE_WORDS]
            await self.deliberate(
                query, moment=True, vector=self.words_vector if query == self.words else None
            )

    async def _summarise(self) -> None:
        assert self.conversation is not None
        try:
            await self.engine.summariser.refresh(self.conversation)
        except Exception as exc:  # the summary is a nicety: its failure keeps the old text (44)
            log.warning("summary not refreshed: %r", exc)

    async def _select(self) -> None:
        try:
            self.learned = (await self.engine.dispositions.select(self))[
                : self.engine.params.dispositions_max
            ]
        except Exception as exc:  # a rule that does not come to mind is no failed reply
            log.warning("dispositions not selected: %r", exc)

    async def _recall(self) -> None:
        """Embedding ∥ recent records, then search and filter (14-24): the reply's first two model calls."""
        vector: list[float] | None = None
        recent = None

        async def embed() -> None:
            nonlocal vector
            vector = await self.engine.embedder.embed(self.words)

        async def load_recent() -> None:
            nonlocal recent
            recent = await self.engine.store.recent(
                k=self.engine.params.recent_count, episodes=STATE_EPISODES
            )

        await concurrently(embed, load_recent)
        assert recent is not None
        self.recent, self.total = list(recent.records), recent.total
        if vector is None:
            await self.engine.log("warning", "the words could not be embedded; nothing is recalled this turn")
        self.words_vector = vector
        self.recalled = await self.engine.recall.involuntary(
            self.words, self.person, self.focus_ids(), vector, self.known
        )
        self._came_to_mind(self.recalled.records)

    def made_here(self) -> set[str]:
        """The records this conversation's own moments made: a record evoked into it (at the arrival, or by
        recall) is still one from outside it, so it still counts as knowing the person (25)."""
        if self.conversation is None:
            return set()
        return {e.record_id for e in self.conversation.focus.moments() if e.record_id is not None}

    def focus_ids(self) -> set[str]:
        return self.conversation.focus.in_view() if self.conversation is not None else set()  # 22, issue 33

    def _came_to_mind(self, records: Sequence[RecordView]) -> None:
        known = {r.id for r in self.associations} | {c.id for c in self.constructs}
        for record in records:
            if record.id in known:
                continue
            known.add(record.id)
            (self.associations if record.kind == "lived" else self.constructs).append(record)  # 35

    async def recompose(self) -> None:
        """Mechanism 36: the State rebuilt from the recent records and every association so far."""
        self.state = compose(self.recent, self.associations, self.engine.params)
        await self._reload_episodes()

    async def _reload_episodes(self) -> None:
        """Subtle point 5: only the State's entries are reloaded, with 5 episodes each."""
        recent_ids = {r.id for r in self.recent}
        wanted = [r.id for r in self.state.entries if r.id not in recent_ids and r.id not in self._episodes]
        if wanted:
            loaded = await self.engine.store.episodes(wanted, per_record=STATE_EPISODES)
            for rid in wanted:
                self._episodes[rid] = [ep for ep in loaded if ep.record_id == rid]
        self.state.entries = [
            r.model_copy(update={"episodes": _recalled_first(r.episodes, self._episodes[r.id])})
            if self._episodes.get(r.id)
            else r
            for r in self.state.entries
        ]

    def view(self) -> ReplyView:
        assert self.conversation is not None
        return ReplyView(
            scene=self.scene, state=self.state, focus=self.conversation.focus,
            summary=self.conversation.saved.summary, evoked_now=self.state.left_out, constructs=self.constructs,
            slot=self.slot,
            searches=self.searches, recalled=len(self.associations) + len(self.constructs), total=self.total,
            presence=self.facts.presence, learned=self.learned, in_history=self.facts.history_ids,
        )  # fmt: skip

    def block(self) -> str | None:
        return ctx.reply_block(self.engine.prompts, self.reply_model, self.view())

    # ------------------------------------------------------------ ToolExecution: the reply loop

    async def next_hop(self, draft: Envelope) -> bool:
        self.drafts += 1
        self._read_refeels(draft)
        if self.drafts >= MAX_REPLY_CALLS:  # mechanism 49
            return False
        try:
            return await self._decide(draft)
        except StoreUnavailable as exc:
            await self.engine.log("warning", f"memory store unavailable mid-turn; the draft stands: {exc}")
            return False

    async def _decide(self, draft: Envelope) -> bool:
        """Mechanism 49: the one self-chosen action hop. The probes (25-27) ran before the first reply call
        (issue 33), so they take no hop and need no extra allowance (subtle point 3's accounting)."""
        action = draft.action.type
        if self.hops >= self.engine.params.turn_action_hops:
            return False  # the last allowed hop: the draft's words are what is said
        if action == "search" and draft.action.text and draft.action.text.strip():
            await self.deliberate(draft.action.text.strip())
            return await self._hopped()
        if (
            action == "introspect" and self.engine.settings.introspection
        ):  # mechanism 52: off, the draft stands
            await self._introspect(draft)
            return await self._hopped()
        return False

    async def _introspect(self, draft: Envelope) -> None:
        """Mechanisms 50-51: a reflection seeded with the exchange, the draft's conclusion and the angle; what it
        formed is in the slot the next reply call shows (89)."""
        said = f"{self.person} said: {self.words}"
        about_to = draft.answer if draft.answer_needed and draft.answer else "nothing"
        seed = Seed(
            exchange=cut(f"{said}\n{self.engine.init.imp.name} was about to reply: {about_to}", SEED_CHARS),
            thought=draft.moment.conclusion if draft.moment is not None else "",
            angle=(draft.action.text or "").strip() or None,
        )
        focus = self.conversation.focus if self.conversation is not None else None
        reflected = await self.engine.reflector.reflect(
            now=self.facts.now, focus=focus, seed=seed, scene=self.scene
        )
        self.reflections += 1
        self.slot = reflected.slot

    async def _hopped(self) -> bool:
        self.hops += 1
        await self.recompose()  # mechanism 36
        return True

    async def deliberate(
        self, query: str, *, moment: bool = False, vector: list[float] | None = None
    ) -> list[RecordView]:
        """A search the imp makes (the action, a probe, the tool): a search of this turn (5) whose finds
        come to mind (36). For the moment probe, lived and construct finds are counted apart (6, 26).
        What it finds in this conversation's focus does not come to mind again (22) but is reported as
        remembered from just now, never as "nothing found" (issue 32, finding 6)."""
        found = await self.engine.recall.deliberate(
            query, self.person, self.focus_ids(), self.known, vector=vector
        )
        self._came_to_mind(found.records)
        own_only = moment and not found.lived and not found.in_view and bool(found.constructs)  # mechanism 6
        self.searches.append(
            SearchNote(query, len(found.records), own_only=own_only, in_view=tuple(found.in_view))
        )
        return found.records

    def _read_refeels(self, draft: Envelope) -> None:
        """Mechanism 38: refeels=[i] maps to that State feeling's record (parsed, no effect)."""
        if draft.moment is None:
            return
        by_index = {str(f.index): f.record.id for f in self.state.feelings()}
        self.refeels = [by_index[i.strip("[] ")] for i in draft.moment.refeels if i.strip("[] ") in by_index]

    # ------------------------------------------------------------ PostSend: the moment

    async def commit(self, turn: CommittedTurn) -> None:
        if self.engine.current is self:
            self.engine.current = None
        try:
            await self._keep(turn)
        except StoreUnavailable as exc:
            await self.engine.log("warning", f"memory store unavailable; this moment was not kept: {exc}")

    async def _keep(self, turn: CommittedTurn) -> None:
        engine, conversation = self.engine, self.conversation
        assert conversation is not None
        delivered = turn.delivered if turn.outcome == "sent" else None  # pending never claims it was seen
        as_happened = event_text(self.person, turn.said, engine.init.imp.name, delivered)  # 47, 62
        told = turn.envelope.told if delivered is not None else None  # 61
        appraised: Felt | None = None
        episode_vector: list[float] | None = None

        async def appraise() -> None:
            nonlocal appraised
            appraised = await self._appraise(as_happened)

        async def embed_event() -> None:
            nonlocal episode_vector
            searched = searched_text(turn.said, as_happened)  # mechanism 62, ours: what the person said
            if searched == self.words and self.words_vector is not None:
                episode_vector = self.words_vector  # embedded for recall at the start of the turn
            else:
                episode_vector = await engine.embedder.embed(searched)

        # Issue 33: the summary, when due, is refreshed here, beside the appraisal, after delivery — not before the
        # reply (mechanism 44 says beside recall): the reply no longer waits for it; the next turn reads it.
        await concurrently(appraise, embed_event, self._summarise)
        felt = appraised or reply_moment(turn.envelope)  # mechanism 59
        for record in self.associations:
            conversation.focus.evoke(record)  # mechanism 31
        if felt is None:
            await engine.log(
                "warning", "no feeling could be formed for this moment; it stays in the focus only"
            )
            conversation.focus.add(
                moment_entry(
                    record_id=None,
                    author=self.person,
                    author_id=self.person_id,
                    feeling="",
                    conclusion="",
                    valence=0.0,
                    intensity=0.0,
                    at=self.facts.now,
                    text=as_happened,
                    message_id=turn.message_id,
                )  # fmt: skip
            )
        else:
            felt = felt.bent(engine.temperament)  # mechanism 60
            record_id = await self._encode(felt, turn, as_happened, told, episode_vector)
            conversation.focus.add(
                moment_entry(
                    record_id=record_id,
                    author=self.person,
                    author_id=self.person_id,
                    feeling=felt.feeling,
                    conclusion=felt.conclusion,
                    valence=felt.valence,
                    intensity=felt.intensity,
                    at=self.facts.now,
                    text=as_happened,
                    message_id=turn.message_id,
                )  # fmt: skip
            )  # mechanism 41: under its own feeling
        conversation.saved.last_input_at = self.facts.now
        await conversation.save(engine.store)
        held = {entry.record.id for entry in self.slot}
        again = [c.id for c in self.constructs if c.id in held]
        if again:  # mechanism 86: a held construct brought to mind again is activated anew
            await engine.store.slot_refresh(again)

    async def _appraise(self, as_happened: str) -> Felt | None:
        """Mechanisms 57-58: no state, thoughts or rules; the focus as events; what was recalled into the State."""
        engine = self.engine
        assert self.conversation is not None
        routed = engine.model.model_for("appraisal")
        system = ctx.appraisal_system(engine.prompts, routed, engine.init.imp.name)
        user = ctx.appraisal_user(
            engine.prompts, routed, self.scene, self.conversation.focus, self.state.recalled(), as_happened,
            summary=self.conversation.saved.summary,
        )  # fmt: skip
        answer = await engine.model.chat_json(
            "appraisal", system, user, temperature=TEMPERATURE_APPRAISAL, schema=APPRAISAL_SCHEMA
        )
        return read_appraisal(answer)

    async def _encode(
        self,
        felt: Felt,
        turn: CommittedTurn,
        as_happened: str,
        told: str | None,
        episode_vector: list[float] | None,
    ) -> str:
        """Mechanisms 63-66: join the living record or open a new one; returns the record id."""
        engine, saved = self.engine, self.conversation.saved if self.conversation else None
        assert saved is not None
        living, living_valence = saved.living, saved.living_valence
        common: dict[str, Any] = {
            "person": self.person, "person_id": self.person_id, "message_id": turn.message_id,
            "as_happened": as_happened, "told": told, "episode_vector": episode_vector,
            "associations": self.associations,
        }  # fmt: skip
        if joins(felt, living, living_valence):
            try:
                result = await engine.store.encode(
                    encoding(felt, living=living, living_valence=living_valence, record_vector=None, **common)
                )
                return result.record_id
            except StoreUnavailable as exc:  # the living record may have been forgotten meanwhile
                await engine.log("info", f"could not join the living record, opening a new one: {exc}")
        record_vector = (
            await engine.embedder.embed(felt.conclusion) if felt.conclusion.strip() else None
        )  # 63
        result = await engine.store.encode(
            encoding(felt, living=None, living_valence=None, record_vector=record_vector, **common)
        )
        if not felt.lasting:  # issue 32: a kept record is no conversation's living record: none joins it
            saved.living, saved.living_valence = result.record_id, felt.valence  # mechanism 64
        return result.record_id
