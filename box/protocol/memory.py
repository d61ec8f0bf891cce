"""The ``memory.*`` requests: the box thinks, the host keeps (docs/memory.md; issue 23).

The memory engine runs in the box, its store lives in the host's database. A box reaches the
store only through these requests, and **no request names a scope**: the host decided the
session's scopes before the box started (``box.init`` tells the box, for what it may say), and
applies them itself to every request in one query layer. A box can therefore ask for nothing
past its session's scopes, however it words the request.

Everything here is bounded: vector length, texts, ``k``, records per request, episodes per
record, the size of a conversation's saved state, and (on the host) requests per turn.
A vector must be finite: NaN or infinity is refused like any malformed param.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from box.protocol.base import FromBox, FromHost, Id, Name

MAX_VECTOR_DIMS = 4_096
MAX_K = 50
MAX_EPISODES_PER_RECORD = 10
MAX_RECORD_IDS = 50
MAX_NAMES = 16
MAX_NAME_CHARS = 64
MAX_FEELING_CHARS = 300
MAX_CONCLUSION_CHARS = 2_000
MAX_EPISODE_CHARS = 16_000  # an as-it-happened text; the box cuts a longer exchange before it asks
MAX_TOLD_CHARS = 4_000
MAX_RESTORES = 20
MAX_CONVERSATION_STATE_BYTES = 262_144  # one conversation's focus, living record and summary
MAX_MEMORY_REQUESTS_PER_TURN = 64  # the host refuses the 65th memory.* request of one turn

RecordKind = Literal["lived", "construct"]
BOTH_KINDS: tuple[RecordKind, ...] = ("lived", "construct")
LIVED_ONLY: tuple[RecordKind, ...] = ("lived",)
ConstructKind = Literal["thought", "belief", "decision", "goal", "dream"]
Origin = Literal["lived", "given", "kept"]  # kept: a lasting moment, never forgotten by age (issue 32)


def _finite(vector: list[float]) -> list[float]:
    if not all(math.isfinite(x) for x in vector):
        raise ValueError("a vector must hold finite numbers only (no NaN or infinity)")
    return vector


Vector = Annotated[list[float], Field(min_length=1, max_length=MAX_VECTOR_DIMS), AfterValidator(_finite)]
PersonName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
Intensity = Annotated[float, Field(ge=0.0, le=1.0)]
Valence = Annotated[float, Field(ge=-1.0, le=1.0)]


# ---------------------------------------------------------------- what the host sends back


class EpisodeView(FromHost):
    """One thing that happened (mechanism 116): it belongs to exactly one record."""

    id: Id
    record_id: Id
    author: Name  # who spoke: a person's name, or "Self" for a given record
    author_id: str | None = None
    message_id: str | None = None
    as_happened: str  # mechanism 62: "X said: … / <imp> replied: …"
    told: str | None = None  # mechanism 61: retold in the third person past
    channel_id: str = ""
    happened_at: datetime


class RecordView(FromHost):
    """A record as the box sees it: stored intensity and the strength felt now, computed by the host's laws."""

    id: Id
    kind: RecordKind = "lived"
    construct_kind: ConstructKind | None = None
    origin: Origin = "lived"
    author: Name
    author_id: str | None = None
    feeling: str
    conclusion: str
    valence: float
    intensity: float  # stored (mechanism 112 compares this one)
    felt: float  # felt now (mechanism 67)
    happened_at: datetime
    last_felt: datetime
    statement: str | None = None  # a construct's statement (mechanism 83), shown "I believe: <statement>"
    score: float | None = (
        None  # memory.search only: cosine × (0.75 + 0.25 felt) (+ name bonus), or the hit episode's
    )
    hit_episode: Id | None = None  # memory.search only: the episode that beat its record (mechanism 16)
    episodes: list[EpisodeView] = Field(default_factory=list)  # newest first; a search's best-matching first
    vector: list[float] | None = None  # only when asked (rumination collapse compares vectors)


class RecordsResult(FromHost):
    records: list[RecordView] = Field(default_factory=list)
    total: int = 0  # records of every kind in the scopes this session reads (mechanism 3)


class EpisodesResult(FromHost):
    episodes: list[EpisodeView] = Field(default_factory=list)


class EncodeResult(FromHost):
    record_id: Id
    episode_id: Id


class RestoreResult(FromHost):
    restored: int = 0  # how many of the named records exist in this session's scopes and were re-felt


class ConversationState(FromHost):
    """A conversation's saved state (focus, living record, summary, turns), or null when there is none yet."""

    state: dict[str, Any] | None = None
    updated_at: datetime | None = None


# ---------------------------------------------------------------- what the box asks


class _Reading(FromBox):
    kinds: list[RecordKind] = Field(default_factory=lambda: list(BOTH_KINDS), min_length=1, max_length=2)
    episodes: int = Field(default=3, ge=0, le=MAX_EPISODES_PER_RECORD)  # newest episodes loaded per record
    with_vectors: bool = False


class SearchParams(_Reading):
    """``memory.search``: rank by cosine × (0.75 + 0.25 × felt strength), +name bonus for a record or episode
    naming one of ``names`` as a whole word (case-insensitive) where the name discriminates; an episode that
    beats its record replaces the record's score; each record's ``episodes`` are its best-matching first
    (mechanisms 14-17 as docs/memory.md applies them, issue 32). Records and episodes whose vector has another
    length are never scored (30)."""

    vector: Vector
    names: list[PersonName] = Field(default_factory=list, max_length=MAX_NAMES)
    k: int = Field(default=10, ge=1, le=MAX_K)


class RecentParams(_Reading):
    """``memory.recent``: the ``k`` most recently felt records (mechanisms 32, 92, 115)."""

    kinds: list[RecordKind] = Field(default_factory=lambda: list(LIVED_ONLY), min_length=1, max_length=2)
    k: int = Field(default=5, ge=1, le=MAX_K)


class AboutParams(_Reading):
    """``memory.about``: records authored by ``person`` (exact name) or mentioning them (whole word,
    case-insensitive), by stored intensity, strongest first (mechanism 28, aboutPerson)."""

    person: PersonName
    k: int = Field(default=6, ge=1, le=MAX_K)
    exclude: list[Id] = Field(default_factory=list, max_length=200)  # e.g. the focus (mechanism 25)


class ConstructsParams(FromBox):
    """``memory.constructs``: the ``k`` most recently felt constructs of one kind (mechanism 27, ownOfKind)."""

    construct_kind: ConstructKind
    k: int = Field(default=3, ge=1, le=MAX_K)
    episodes: int = Field(default=0, ge=0, le=MAX_EPISODES_PER_RECORD)


class EpisodesParams(FromBox):
    """``memory.episodes``: each named record's newest ``per_record`` episodes, newest first."""

    record_ids: list[Id] = Field(min_length=1, max_length=MAX_RECORD_IDS)
    per_record: int = Field(default=3, ge=1, le=MAX_EPISODES_PER_RECORD)


class NewRecord(FromBox):
    """A record the moment opens (mechanism 64). Its vector is the embedding of its conclusion (63)."""

    kind: RecordKind = "lived"
    construct_kind: ConstructKind | None = None
    author: PersonName
    author_id: Id | None = None
    feeling: Annotated[str, Field(max_length=MAX_FEELING_CHARS)]
    conclusion: Annotated[str, Field(max_length=MAX_CONCLUSION_CHARS)]
    valence: Valence
    intensity: Intensity
    vector: Vector | None = (
        None  # None when the embedding failed: the record is kept, never recalled by meaning
    )
    lasting: bool = False  # issue 32: something lasting about someone; stored with origin "kept"

    @model_validator(mode="after")
    def _construct_has_kind(self) -> NewRecord:
        if (self.kind == "construct") != (self.construct_kind is not None):
            raise ValueError("a construct names its kind, and only a construct does")
        if self.lasting and self.kind != "lived":
            raise ValueError("only a lived moment may be lasting")
        return self


class NewEpisode(FromBox):
    author: PersonName
    author_id: Id | None = None
    message_id: Id | None = None  # the message it answers: deleting that message forgets this episode
    as_happened: Annotated[str, Field(min_length=1, max_length=MAX_EPISODE_CHARS)]
    told: Annotated[str, Field(max_length=MAX_TOLD_CHARS)] | None = None
    vector: Vector | None = None  # embedding of as_happened (mechanism 62)


class Restore(FromBox):
    """Re-feel a record toward ``toward`` (mechanisms 65, 66, 69, 70); the host applies the law at its now."""

    record_id: Id
    toward: Intensity


class EncodeParams(FromBox):
    """``memory.encode``: keep one moment. Exactly one of ``record`` (open a new record) and ``join`` (add the
    episode to the conversation's living record); then the named records are re-felt, atomically."""

    record: NewRecord | None = None
    join: Id | None = None
    episode: NewEpisode
    restore: list[Restore] = Field(default_factory=list, max_length=MAX_RESTORES)

    @model_validator(mode="after")
    def _one_target(self) -> EncodeParams:
        if (self.record is None) == (self.join is None):
            raise ValueError(
                "memory.encode takes exactly one of record (a new one) and join (an existing id)"
            )
        return self


class RestoreParams(FromBox):
    """``memory.restore``: re-feel records without a new episode (mechanisms 75, 76 of issue II use it too)."""

    items: list[Restore] = Field(min_length=1, max_length=MAX_RESTORES)


class ConversationGetParams(FromBox):
    """``memory.conversation.get``: the saved state of this channel's conversation with one person."""

    person: Id


class ConversationPutParams(FromBox):
    """``memory.conversation.put``: save it (focus, living record, summary), at most 256 KiB of JSON."""

    person: Id
    state: dict[Annotated[str, Field(max_length=64)], Any]


# ---------------------------------------------------------------- host -> box additions


class SessionMemory(FromHost):
    """What ``box.init`` tells a box about its session's memory: the scope it writes and the scopes it reads.

    For the box's own use (what it may say it knows); the host applies the same scopes to every request.
    """

    writes: str
    reads: list[str] = Field(default_factory=list)


class PresenceEntry(FromHost):
    """Mechanism 10: another live conversation of this imp, in a scope this session may read."""

    person: Name
    channel: Name = ""  # "#general", "a direct message" is never listed in a guild session
    joined_at: datetime
    last_input_at: datetime
    turns: int = 0


# ---------------------------------------------------------------- issue 14: constructs, the slot, dispositions

MAX_STATEMENT_CHARS = 2_000
MAX_SLOT_SIZE = 8  # the host keeps DEFAULTS.slot_size (3); the bound is for what a box may name
MAX_RULE_CHARS = 300  # a learned rule: "when <situation> → <act>", at most 20 words (mechanism 90)
MAX_DISPOSITIONS_SHOWN = 200
SMALLEST_WEIGHT = 0.1  # mechanism 93: a learned weight is at least this far from zero


class SlotEntry(FromHost):
    """One construct held in the accessibility slot (mechanisms 84-89) and when it was last activated."""

    record: RecordView
    activated_at: datetime


class SlotResult(FromHost):
    """The slot of the session's writes scope, oldest activation first (mechanism 88)."""

    entries: list[SlotEntry] = Field(default_factory=list)


class ConstructParams(FromBox):
    """``memory.construct``: form a construct in the session's writes scope (mechanisms 74-77, 81-83).

    The host compares it with the constructs **of the same kind** in that scope (cosine ≥ 0.90 of ``vector``):
    a recurring thought is not written and the old one is re-felt toward ``intensity`` (75); a duplicate
    belief, decision, goal or dream is not written and the old one gains +0.1 intensity (max 1), last felt
    now (82). With ``slot`` the construct (new or old) is then activated in the slot (74, 81, 84-86).
    Its author is "Self"; its vector is the embedding of statement + conclusion (63).
    """

    construct_kind: ConstructKind
    statement: Annotated[str, Field(min_length=1, max_length=MAX_STATEMENT_CHARS)]
    feeling: Annotated[str, Field(max_length=MAX_FEELING_CHARS)] = ""
    conclusion: Annotated[str, Field(max_length=MAX_CONCLUSION_CHARS)] = ""
    valence: Valence = 0.0
    intensity: Intensity = 0.5
    vector: Vector | None = None  # None: nothing to compare with, a new construct is written
    slot: bool = True


class ConstructResult(FromHost):
    record_id: Id
    created: bool  # False: an earlier one of the same kind recurred (75) or was reinforced (82)
    previous: str | None = None  # the earlier one's statement when it recurred (subtle point 11)
    slot: list[SlotEntry] = Field(default_factory=list)  # the slot after the activation


class SlotParams(FromBox):
    """``memory.slot``: the slot as loaded (87: not activated for 7 days, or deleted, leaves it)."""


class SlotRefreshParams(FromBox):
    """``memory.slot.refresh``: held constructs brought to mind again get a new activation time (86);
    ids not held are ignored."""

    record_ids: list[Id] = Field(min_length=1, max_length=MAX_SLOT_SIZE * 4)


class DispositionView(FromHost):
    """A learned rule (mechanisms 90-98): the imp's character, shared by every scope, naming no one."""

    id: Id
    rule: str
    weight: float
    count: int = 1
    updated_at: datetime


class DispositionsParams(FromBox):
    """``memory.dispositions``: the ``k`` strongest rules by |weight| (94: dormant ones included;
    ``active_only`` for selection, 98-99: only |weight| > 0.05)."""

    k: int = Field(default=100, ge=1, le=MAX_DISPOSITIONS_SHOWN)
    active_only: bool = False


class DispositionsResult(FromHost):
    rules: list[DispositionView] = Field(default_factory=list)


class LearnParams(FromBox):
    """``memory.dispositions.learn``: keep a learned rule (mechanisms 95-97), atomically on the host.

    ``same``: that rule is counted once more, and takes this text and weight only if this one pulls harder
    (pull = |w| × avoidance_weight for w < 0, |w| otherwise). Else ``contradicts``: that rule's weight moves
    toward 0 by |weight| without crossing it, and this rule is added. Else it is added.
    """

    rule: Annotated[str, Field(min_length=1, max_length=MAX_RULE_CHARS)]
    weight: Annotated[float, Field(ge=-1.0, le=1.0)]
    same: Id | None = None
    contradicts: Id | None = None
    avoidance_weight: float = Field(default=2.0, ge=1.0, le=10.0)

    @model_validator(mode="after")
    def _weight_not_small(self) -> LearnParams:
        if abs(self.weight) < SMALLEST_WEIGHT - 1e-9:
            raise ValueError(f"a learned weight is at least {SMALLEST_WEIGHT} from zero (mechanism 93)")
        return self


class LearnResult(FromHost):
    id: Id  # the rule counted, replaced or added
    action: Literal["added", "counted", "replaced"]
    weakened: Id | None = None  # the contradicted rule (97)


# ---------------------------------------------------------------- issue 15: the night (sleep, consolidation, forgetting)

MAX_NIGHT_RECORDS = 200  # records one consolidation plan may see (the newest since waking)
MAX_GROUPS = 50
MAX_MEMBERS = 50


class NightParams(FromBox):
    """``memory.night``: the records of the session's **writes scope** that happened at or after ``since``
    (the imp's waking: mechanism 107, subtle point 16), newest first, at most ``k``, each with ``episodes``
    episodes (the sleep lists 6). Constructs and given records come too (marked by ``kind``/``origin``:
    protected, never absorbed)."""

    since: datetime
    k: int = Field(default=MAX_NIGHT_RECORDS, ge=1, le=MAX_NIGHT_RECORDS)
    episodes: int = Field(default=6, ge=0, le=MAX_EPISODES_PER_RECORD)


class Group(FromBox):
    """One group of a consolidation plan: ``members`` are folded into ``anchor`` (mechanisms 108-110)."""

    anchor: Id
    members: list[Id] = Field(min_length=1, max_length=MAX_MEMBERS)


class ConsolidateParams(FromBox):
    """``memory.consolidate``: fold groups of records of the writes scope, atomically (mechanisms 108-111, 113).

    The host checks every group again, whatever the box says (subtle point 16): the anchor exists in the
    writes scope, is not a construct, and has stored intensity ≥ 0.4 (a given record may be one); a member
    exists there, is not protected (a construct or a given record), is not the anchor, is not stronger than
    the anchor and was not absorbed already. A group left with no member is skipped. For each group the
    members' episodes are re-filed under the anchor (none is lost, 109), the anchor's intensity becomes
    1 − Π(1 − I) over the anchor and its members (110), and the members are deleted. No text changes (111).
    """

    groups: list[Group] = Field(default_factory=list, max_length=MAX_GROUPS)


class ConsolidateResult(FromHost):
    groups: int = 0  # groups applied
    absorbed: int = 0  # records folded into an anchor (and deleted)
    episodes: int = 0  # episodes re-filed
    refused: int = 0  # members (or whole groups) the checks refused


class ForgetParams(FromBox):
    """``memory.forget``: the forgetting curve over the writes scope (mechanisms 112-113): a record whose
    stored intensity is below the threshold for its age since it was last felt is deleted with its episodes;
    constructs and given records never are."""


class ForgetResult(FromHost):
    forgotten: int = 0
    episodes: int = 0


MEMORY_METHOD_NAMES = (
    "memory.search",
    "memory.recent",
    "memory.about",
    "memory.constructs",
    "memory.episodes",
    "memory.encode",
    "memory.restore",
    "memory.conversation.get",
    "memory.conversation.put",
    "memory.construct",
    "memory.slot",
    "memory.slot.refresh",
    "memory.dispositions",
    "memory.dispositions.learn",
    "memory.night",
    "memory.consolidate",
    "memory.forget",
)
