"""The State: what the imp feels now (mechanisms 32-38; subtle point 1).

The pool is the most recently felt lived records plus this turn's associations, an association
replacing a recent record with the same id (33). Constructs are never felt (35). The pool is admitted
strongest first while the felt mass stays within the budget — a greedy skip, not a stop (32); the
associations left out go to the focus as evoked (34). The engine recomposes the State before every
reply call (36). For the reply, records that are one recurring feeling show once, the most intense
with how often it recurred (37), and each shown feeling gets an index the reply can name (38).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from box.common.laws import DEFAULTS, Params, admit, rumination_clusters
from box.protocol.memory import RecordView


@dataclass(frozen=True)
class Feeling:
    """One shown State entry: the representative of a recurring feeling (37) and its index (38)."""

    index: int
    record: RecordView
    recurred: int  # how many State records are this one feeling (1: it did not recur)


@dataclass
class State:
    entries: list[RecordView] = field(default_factory=list)  # admitted, strongest felt first
    left_out: list[RecordView] = field(default_factory=list)  # associations the budget left out (34)
    associated: set[str] = field(default_factory=set)  # ids of admitted entries that came by recall

    def ids(self) -> set[str]:
        return {r.id for r in self.entries}

    def recalled(self) -> list[RecordView]:
        """The recalled records that made it into the State (mechanism 58 shows them to the appraisal)."""
        return [r for r in self.entries if r.id in self.associated]

    def feelings(self) -> list[Feeling]:
        """Mechanisms 37-38: one indexed line per recurring feeling, the most intense representing it."""
        clusters = rumination_clusters(
            self.entries,
            feeling=lambda r: r.feeling,
            conclusion=lambda r: r.conclusion,
            vector=lambda r: r.vector,
        )
        shown: list[Feeling] = []
        for cluster in clusters:
            strongest = max(cluster, key=lambda r: r.intensity)
            shown.append(Feeling(index=len(shown) + 1, record=strongest, recurred=len(cluster)))
        return shown


def compose(
    recent: Sequence[RecordView], associations: Sequence[RecordView], params: Params = DEFAULTS
) -> State:
    """Mechanism 32: the State out of the recent lived records and this turn's associations."""
    pool: dict[str, RecordView] = {r.id: r for r in recent if r.kind == "lived"}  # 35: never a construct
    associated = {r.id for r in associations if r.kind == "lived"}
    for record in associations:
        if record.kind == "lived":
            pool[record.id] = record  # mechanism 33: freshly evoked counts as felt now
    admitted, skipped = admit([(rid, r.felt) for rid, r in pool.items()], params.state_mass_budget)
    return State(
        entries=[pool[rid] for rid in admitted],
        left_out=[pool[rid] for rid in skipped if rid in associated],  # mechanism 34: only associations
        associated={rid for rid in admitted if rid in associated},
    )
