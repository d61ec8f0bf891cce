"""The host's vector cache and recall scoring (issue 23; seed 002, "Embedder and recall scoring").

One ``ScopeMatrix`` per (imp, scope, dims): the record vectors of that scope and length as a float32
matrix (exactly the stored float16 values), the arrays the felt strength needs (intensity, valence,
last felt), the lowercased texts the name bonus reads, and the same for the episodes whose record is in
the matrix. Felt strength is computed from those arrays at query time, so fading moves with the clock
while the matrix stays as it is (mechanism 67).

The cache stays in step with writes from any process through ``memory_generations``: every write bumps
the scope's ``version``, every delete its ``deletes`` as well. An entry whose version moved loads only the
rows written since (their ``gen`` is above the entry's version: new ones appended, re-felt ones updated);
an entry whose ``deletes`` moved is loaded again whole. ``VectorCache(max_bytes)`` keeps the entries least
recently used first out: after each use it evicts until the kept entries fit, and an entry that alone is
larger than the bound is scored and then dropped, so the cache never holds more than ``max_bytes``.

Scoring (mechanisms 14-17, 30), for a query vector of length d over the matrices of length d only:

1. record score = cosine × the recall weight of its felt strength now (``laws.recall_weight``:
   0.75 + 0.25 × felt — ours, issue 32: fading breaks ties instead of outweighing meaning), +0.5
   (``name_bonus``) when the record text names one of the names as a whole word, case-insensitive
   (``laws.mentions``, the rule the box applies too; the text: see ``record_text`` in store.py) — only for a
   name that discriminates in that scope (``laws.name_discriminates``: it names at most half of the rows);
2. every episode of a scored record: cosine × its record's recall weight, +0.5 when its as-it-happened text
   names such a name; the best episode replaces its record's score when it beats it, and is the hit episode;
3. the top k, highest first; each names its record's best-matching episodes (``Hit.matched``), which the
   store loads before the newest (issue 32: a long record shows the turns the words are about).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from box.memory.laws import DAY_S, DEFAULTS, Params, mention_names, mention_pattern, name_discriminates
from impyard.memory.vectors import Floats, normalised, top_k, unpack_many

DEFAULT_CACHE_BYTES = 512 * 1024 * 1024
_COMPACT_AFTER_CHUNKS = 16  # text chunks kept apart before they are joined into one again
_NAME_MASKS = 32  # names whose row masks an entry keeps
_STR_OVERHEAD = sys.getsizeof("")  # what a str costs besides its characters

CacheKey = tuple[str, str, int]  # (imp, scope, dims)
_T = TypeVar("_T")


# ------------------------------------------------------------------ felt strength, vectorised


def felt_now(
    intensity: npt.NDArray[np.float64],
    valence: npt.NDArray[np.float64],
    last_felt_s: npt.NDArray[np.float64],
    now_s: float,
    params: Params = DEFAULTS,
) -> npt.NDArray[np.float64]:
    """``box.memory.laws.felt_strength`` over arrays (mechanisms 67-68); the tests hold the two equal."""
    tau = params.fade_tau_days * np.where(valence < 0, params.fade_negative_slowdown, 1.0)
    t_days = np.maximum(0.0, now_s - last_felt_s) / DAY_S
    return intensity * (params.fade_floor + (1.0 - params.fade_floor) * np.exp(-t_days / tau))


def recall_weight_now(felt: npt.NDArray[np.float64], params: Params = DEFAULTS) -> npt.NDArray[np.float64]:
    """``box.memory.laws.recall_weight`` over arrays: what fading multiplies a cosine by (issue 32)."""
    w = min(1.0, max(0.0, params.recall_felt_weight))
    return (1.0 - w) + w * felt


# ------------------------------------------------------------------ rows as loaded from the store


@dataclass
class RecordRows:
    """Records of one (imp, scope, dims), as the store loads them for the cache."""

    ids: list[str] = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)  # float16 vectors of the entry's length (vectors.pack)
    intensity: list[float] = field(default_factory=list)
    valence: list[float] = field(default_factory=list)
    last_felt_s: list[float] = field(default_factory=list)
    construct: list[bool] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # lowercased record text


@dataclass
class EpisodeRows:
    ids: list[str] = field(default_factory=list)
    record_ids: list[str] = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # lowercased as-it-happened text


@dataclass(frozen=True)
class Generation:
    version: int = 0
    deletes: int = 0


class Loader:
    """What the cache needs from the store: rows of one (imp, scope, dims), all or written after ``since``."""

    def generation(self, imp: str, scope: str) -> Generation:
        raise NotImplementedError

    def rows(self, imp: str, scope: str, dims: int, since: int | None) -> tuple[RecordRows, EpisodeRows]:
        raise NotImplementedError


# ------------------------------------------------------------------ growable columns


class _Column:
    """A numpy array that grows by doubling (appends are amortised O(1)); ``view`` is the filled part."""

    def __init__(self, dtype: npt.DTypeLike, width: int = 0) -> None:
        self.width = width
        shape = (0, width) if width else (0,)
        self.data: npt.NDArray[Any] = np.zeros(shape, dtype=dtype)
        self.size = 0

    def extend(self, values: npt.ArrayLike) -> None:
        values = np.asarray(values, dtype=self.data.dtype)
        count = len(values)
        if not count:
            return
        need = self.size + count
        if need > len(self.data):
            capacity = max(need, 2 * len(self.data), 16)
            grown = np.zeros((capacity, self.width) if self.width else (capacity,), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : need] = values
        self.size = need

    @property
    def view(self) -> npt.NDArray[Any]:
        return self.data[: self.size]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


class _Texts:
    """Lowercased texts by row, and which rows name someone (mechanism 15).

    The texts are kept joined in chunks (one per load, compacted now and then), so finding a name is one
    regex pass over a string. The mask of each name asked lately is kept and extended to new rows only:
    a conversation's person is named in every search of it, and is matched once per write, not per query.
    """

    def __init__(self) -> None:
        self.rows: list[str] = []
        self._chunks: list[tuple[int, str, npt.NDArray[np.int64]]] = []  # (first row, joined, starts)
        self._masks: OrderedDict[str, npt.NDArray[np.bool_]] = (
            OrderedDict()
        )  # name -> mask of its rows so far
        self._text_bytes = 0

    @property
    def nbytes(self) -> int:
        return self._text_bytes + sum(int(mask.nbytes) for mask in self._masks.values())

    def extend(self, texts: Sequence[str]) -> None:
        if not texts:
            return
        self._chunks.append(self._chunk(len(self.rows), texts))
        self.rows.extend(texts)
        self._text_bytes += sum(_STR_OVERHEAD + len(t) for t in texts) * 2  # the row and its chunk copy
        if len(self._chunks) > _COMPACT_AFTER_CHUNKS:
            self._chunks = [self._chunk(0, self.rows)]

    def replace(self, row: int, text: str) -> None:
        if self.rows[row] != text:
            self._text_bytes += (len(text) - len(self.rows[row])) * 2
            self.rows[row] = text
            self._chunks = [self._chunk(0, self.rows)]
            self._masks.clear()

    @staticmethod
    def _chunk(first: int, texts: Sequence[str]) -> tuple[int, str, npt.NDArray[np.int64]]:
        lengths = np.fromiter((len(t) + 1 for t in texts), dtype=np.int64, count=len(texts))
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        return first, "\x00".join(texts), starts

    def naming(self, names: Sequence[str]) -> npt.NDArray[np.bool_]:
        """A row mask: the rows whose text names any of ``names`` (``laws.mention_names``: lowercased)."""
        mask = np.zeros(len(self.rows), dtype=bool)
        for name in names:
            mask |= self._mask(name)
        return mask

    def _mask(self, name: str) -> npt.NDArray[np.bool_]:
        known = self._masks.pop(name, np.zeros(0, dtype=bool))
        if len(known) < len(self.rows):
            pattern = mention_pattern([name])  # the laws' own rule, over the lowercased rows at once
            assert pattern is not None
            fresh = np.zeros(len(self.rows), dtype=bool)
            fresh[: len(known)] = known
            for first, joined, starts in self._chunks:
                if first + len(starts) <= len(known):
                    continue  # rows already matched for this name
                positions = [m.start() for m in pattern.finditer(joined)]
                if positions:
                    fresh[
                        first
                        + np.searchsorted(starts, np.asarray(positions, dtype=np.int64), side="right")
                        - 1
                    ] = True
            known = fresh
        self._masks[name] = known
        while len(self._masks) > _NAME_MASKS:
            self._masks.popitem(last=False)
        return known


# ------------------------------------------------------------------ one cache entry


class ScopeMatrix:
    """The vectors of one (imp, scope, dims) and what scoring them needs; see the module doc."""

    def __init__(self, key: CacheKey, generation: Generation) -> None:
        self.key = key
        self.version = generation.version
        self.deletes = generation.deletes
        dims = key[2]
        self.lock = threading.Lock()
        self.record_ids: list[str] = []
        self._row_of: dict[str, int] = {}
        self._vectors = _Column(np.float32, dims)
        self._intensity = _Column(np.float64)
        self._valence = _Column(np.float64)
        self._last_felt = _Column(np.float64)
        self._construct = _Column(np.bool_)
        self._texts = _Texts()
        self.episode_ids: list[str] = []
        self._episode_of: dict[str, int] = {}
        self._episode_vectors = _Column(np.float32, dims)
        self._episode_record = _Column(np.int64)  # the row of the episode's record
        self._episode_texts = _Texts()
        self._id_bytes = 0

    def __len__(self) -> int:
        return len(self.record_ids)

    @property
    def episodes(self) -> int:
        return len(self.episode_ids)

    @property
    def nbytes(self) -> int:
        columns = (self._vectors, self._intensity, self._valence, self._last_felt, self._construct,
                   self._episode_vectors, self._episode_record)  # fmt: skip
        return (
            sum(c.nbytes for c in columns) + self._texts.nbytes + self._episode_texts.nbytes + self._id_bytes
        )

    def apply(self, records: RecordRows, episodes: EpisodeRows) -> None:
        """Insert new rows, update re-felt ones (by id); episodes whose record is not here are skipped."""
        new = [i for i, rid in enumerate(records.ids) if rid not in self._row_of]
        for i, rid in enumerate(records.ids):
            row = self._row_of.get(rid)
            if row is not None:
                self._intensity.data[row] = records.intensity[i]
                self._last_felt.data[row] = records.last_felt_s[i]
                self._texts.replace(row, records.texts[i])
        if new:
            first = len(self.record_ids)
            for offset, i in enumerate(new):
                self._row_of[records.ids[i]] = first + offset
                self.record_ids.append(records.ids[i])
                self._id_bytes += _STR_OVERHEAD + len(records.ids[i]) + 64  # + the dict entry
            self._vectors.extend(unpack_many(self.key[2], [records.blobs[i] for i in new]))
            self._intensity.extend([records.intensity[i] for i in new])
            self._valence.extend([records.valence[i] for i in new])
            self._last_felt.extend([records.last_felt_s[i] for i in new])
            self._construct.extend([records.construct[i] for i in new])
            self._texts.extend([records.texts[i] for i in new])
        fresh = [
            i
            for i, eid in enumerate(episodes.ids)
            if eid not in self._episode_of and episodes.record_ids[i] in self._row_of
        ]
        if fresh:
            first = len(self.episode_ids)
            for offset, i in enumerate(fresh):
                self._episode_of[episodes.ids[i]] = first + offset
                self.episode_ids.append(episodes.ids[i])
                self._id_bytes += _STR_OVERHEAD + len(episodes.ids[i]) + 64
            self._episode_vectors.extend(unpack_many(self.key[2], [episodes.blobs[i] for i in fresh]))
            self._episode_record.extend([self._row_of[episodes.record_ids[i]] for i in fresh])
            self._episode_texts.extend([episodes.texts[i] for i in fresh])

    def score(
        self,
        query: Floats,
        names: Sequence[str],
        k: int,
        kinds: Sequence[str],
        now_s: float,
        params: Params = DEFAULTS,
        per_record: int = 0,
    ) -> list[Hit]:
        """This matrix's best ``k`` records for ``query`` (already normalised, of this matrix's length).

        A record's final score is the best of its own score and its episodes' (mechanism 16), so the top k
        records are the first k distinct records in the merged, descending list of record and episode
        scores. Only the best few episodes are ranked (doubling until the answer is exact), never all.
        ``per_record``: each hit also names up to that many of its record's episodes that match the query
        best, best first (``Hit.matched``; issue 32: a long record shows the turns the words are about).
        """
        n = len(self.record_ids)
        if n == 0:
            return []
        felt = felt_now(self._intensity.view, self._valence.view, self._last_felt.view, now_s, params)
        weight = recall_weight_now(felt, params).astype(np.float32)  # mechanism 14, as we weigh fading
        scores = self._vectors.view @ query * weight  # mechanism 14
        construct = self._construct.view
        allowed = np.ones(n, dtype=bool)
        if "construct" not in kinds:
            allowed &= ~construct
        if "lived" not in kinds:
            allowed &= construct
        m = len(self.episode_ids)
        owner = self._episode_record.view
        bonus_names = self._discriminating(names, allowed, owner, params) if names else []
        if bonus_names:
            scores += np.float32(params.name_bonus) * self._texts.naming(bonus_names)  # mechanism 15
        scores[~allowed] = -np.inf
        records = top_k(scores, k)
        if not m:
            return [Hit(self.record_ids[r], float(scores[r])) for r in records if np.isfinite(scores[r])]
        episode_scores = self._episode_vectors.view @ query * weight[owner]  # mechanism 16: its record's felt
        if bonus_names:
            episode_scores += np.float32(params.name_bonus) * self._episode_texts.naming(bonus_names)
        episode_scores[~allowed[owner]] = -np.inf
        take = min(m, 4 * k)
        while True:
            episodes = top_k(episode_scores, take)
            # records before episodes at equal scores: an episode must *beat* its record to replace it
            items = sorted(
                [(-float(scores[r]), 0, int(r), -1) for r in records]
                + [(-float(episode_scores[e]), 1, int(owner[e]), int(e)) for e in episodes]
            )
            chosen: dict[int, tuple[float, int]] = {}
            for negative, _, row, episode in items:
                if not np.isfinite(negative) or len(chosen) == k:
                    break
                if row not in chosen:  # its first item is its best: its final score (16)
                    beats = episode >= 0 and -negative > float(scores[row])
                    chosen[row] = (-negative, episode if beats else -1)
            lowest_episode = float(episode_scores[episodes[-1]])
            complete = take == m or not np.isfinite(lowest_episode)
            if complete or (len(chosen) == k and min(s for s, _ in chosen.values()) >= lowest_episode):
                break
            take = min(m, take * 2)
        matched = self._matched(chosen, owner, episode_scores, per_record)
        return [
            Hit(
                self.record_ids[row],
                score,
                self.episode_ids[episode] if episode >= 0 else None,
                tuple(self.episode_ids[e] for e in matched.get(row, ())),
            )
            for row, (score, episode) in chosen.items()
        ]

    def _discriminating(
        self,
        names: Sequence[str],
        allowed: npt.NDArray[np.bool_],
        owner: npt.NDArray[np.int64],
        params: Params,
    ) -> list[str]:
        """The names that earn the bonus in this scope (``laws.name_discriminates``): those that mention at
        most half of the rows searched (records and episodes of the kinds asked), once there are more rows
        than one search takes."""
        episodes_allowed = allowed[owner]
        rows = int(allowed.sum()) + int(episodes_allowed.sum())
        kept = []
        for name in names:
            named = int((self._texts.naming([name]) & allowed).sum())
            named += int((self._episode_texts.naming([name]) & episodes_allowed).sum())
            if name_discriminates(named, rows, params):
                kept.append(name)
        return kept

    @staticmethod
    def _matched(
        chosen: dict[int, tuple[float, int]],
        owner: npt.NDArray[np.int64],
        episode_scores: npt.NDArray[np.float32],
        per_record: int,
    ) -> dict[int, list[int]]:
        """Each chosen record's ``per_record`` best-scoring episodes, best first (the newer row on a tie)."""
        if per_record <= 0 or not chosen:
            return {}
        rows = np.fromiter(chosen, dtype=np.int64, count=len(chosen))
        mine = np.nonzero(np.isin(owner, rows) & np.isfinite(episode_scores))[0]
        if not mine.size:
            return {}
        order = mine[
            np.lexsort((-mine, -episode_scores[mine], owner[mine]))
        ]  # by record, best (then newest) first
        found: dict[int, list[int]] = {}
        for e in order.tolist():
            best = found.setdefault(int(owner[e]), [])
            if len(best) < per_record:
                best.append(e)
        return found


@dataclass(frozen=True)
class Hit:
    record_id: str
    score: float
    hit_episode: str | None = None
    matched: tuple[str, ...] = ()  # the record's episodes that match the query best, best first (issue 32)


# ------------------------------------------------------------------ the cache


class VectorCache:
    """Bounded LRU of ``ScopeMatrix`` entries (thread-safe: boxes are served from worker threads)."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("the vector cache bound is a number of bytes >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[CacheKey, ScopeMatrix] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0  # whole loads (a new entry, or a delete elsewhere)
        self.refreshes = 0  # incremental loads (writes elsewhere)
        self.evictions = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept entries (what the benchmark reports beside RSS)."""
        with self._lock:
            return sum(entry.nbytes for entry in self._entries.values())

    def keys(self) -> list[CacheKey]:
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def search(
        self,
        loader: Loader,
        imp: str,
        scopes: Sequence[str],
        query: Sequence[float],
        names: Sequence[str],
        k: int,
        kinds: Sequence[str],
        now_s: float,
        params: Params = DEFAULTS,
        per_record: int = 0,
    ) -> list[Hit]:
        """The top ``k`` records of ``imp`` over ``scopes`` for ``query`` (mechanisms 14-17, 30); each hit names
        its ``per_record`` best-matching episodes."""
        unit = normalised(query)
        dims = int(unit.size)
        cleaned = mention_names(list(names))
        hits: list[Hit] = []
        for scope in dict.fromkeys(scopes):
            hits.extend(
                self._use(
                    (imp, scope, dims),
                    loader,
                    lambda e: e.score(unit, cleaned, k, kinds, now_s, params, per_record),  # fmt: skip
                )
            )
        hits.sort(key=lambda h: (-h.score, h.record_id))
        return hits[:k]

    def entry(self, loader: Loader, key: CacheKey) -> ScopeMatrix:
        """The entry for ``key``, in step with the store (for tests and the benchmark)."""
        return self._use(key, loader, lambda e: e)

    def _use(self, key: CacheKey, loader: Loader, work: Callable[[ScopeMatrix], _T]) -> _T:
        imp, scope, dims = key
        generation = loader.generation(imp, scope)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None or entry.deletes != generation.deletes:
            entry = ScopeMatrix(key, generation)
            with entry.lock:
                entry.apply(*loader.rows(imp, scope, dims, None))
            self.loads += 1
            with self._lock:
                self._entries[key] = entry
                self._entries.move_to_end(key)
        with entry.lock:
            if entry.version < generation.version:
                entry.apply(*loader.rows(imp, scope, dims, entry.version))
                entry.version = generation.version
                self.refreshes += 1
            result = work(entry)
        self._fit(key)
        return result

    def _fit(self, last: CacheKey) -> None:
        """Evict least recently used entries until the kept ones fit; the bound is never exceeded."""
        with self._lock:
            total = sum(entry.nbytes for entry in self._entries.values())
            while total > self.max_bytes and self._entries:
                key, entry = next(iter(self._entries.items()))
                if key == last and len(self._entries) > 1:
                    self._entries.move_to_end(key)  # evict others first; this one goes last
                    continue
                del self._entries[key]
                total -= entry.nbytes
                self.evictions += 1
