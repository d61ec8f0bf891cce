"""The host's vector cache and recall scoring (issue 23; seed 002, "Embedder and recall scoring").

One ``ScopeMatrix`` per (imp, scope, dims): the record vectors of that scope and length as a float32
matrix (exactly the stored float16 values), the arrays the felt strength needs (intensity, valence,
last felt), the texts the name bonus reads (as written: a name counts only written as one, issue 32), and
the same for the episodes whose record is in the matrix. Felt strength is computed from those arrays at
query time, so fading moves with the clock while the matrix stays as it is (mechanism 67).

The cache stays in step with writes from any process through ``memory_generations``: every write bumps
the scope's ``version``, every delete its ``deletes`` as well. An entry whose version moved loads only the
rows written since (their ``gen`` is above the entry's version: new ones appended, re-felt ones updated);
an entry whose ``deletes`` moved is loaded again whole. ``VectorCache(max_bytes)`` keeps the entries least
recently used first out: after each use it evicts until the kept entries fit, and an entry that alone is
larger than the bound is scored and then dropped, so the cache never holds more than ``max_bytes``.

Scoring (mechanisms 14-17, 30), for a query vector of length d over the matrices of length d only:

1. record score = cosine × the recall weight of its felt strength now (``laws.recall_weight``:
   0.75 + 0.25 × felt — ours, issue 32: fading breaks ties instead of outweighing meaning), +0.5
   (``name_bonus``) when the record text names one of the names as a whole word, written as a name
   (``laws.mentions``, the rule the box applies too; the text: a construct's statement, then the conclusion) — only for a
   name that discriminates in that scope (``laws.name_discriminates``: it names at most half of the records);
2. every episode of a scored record: cosine × its record's recall weight, +0.5 when its as-it-happened text
   names a name that discriminates among the episodes; the best episode replaces its record's score when it beats it, and is the hit episode;
3. the top k, highest first; each names its record's best-matching episodes (``Hit.matched``), which the
   store loads before the newest (issue 32: a long record shows the turns the words are about).
"""

from __future__ import annotations

import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from box.common.laws import DAY_S, DEFAULTS, Params, mention_names, mention_patterns, name_discriminates
from impyard.memory.vectors import Floats, normalised, top_k, unpack_many

DEFAULT_CACHE_BYTES = 512 * 1024 * 1024
NAME_SCAN_CHARS = 1_000_000  # issue 32 #5: text one request's names are looked for in, past the word index
_MERGE_AFTER_SEGMENTS = 16  # word index segments kept apart before they are merged into one again
_LIST_SLOT = 8  # a list's pointer to each kept object
_DICT_ENTRY = 104  # a dict's share for one more key (its entry, its index slot, and the growth it keeps free)
_WORD = re.compile(r"\w+")  # the laws' word characters (mention_patterns' \w)

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
    """``box.common.laws.felt_strength`` over arrays (mechanisms 67-68); the tests hold the two equal."""
    tau = params.fade_tau_days * np.where(valence < 0, params.fade_negative_slowdown, 1.0)
    t_days = np.maximum(0.0, now_s - last_felt_s) / DAY_S
    return intensity * (params.fade_floor + (1.0 - params.fade_floor) * np.exp(-t_days / tau))


def recall_weight_now(felt: npt.NDArray[np.float64], params: Params = DEFAULTS) -> npt.NDArray[np.float64]:
    """``box.common.laws.recall_weight`` over arrays: what fading multiplies a cosine by (issue 32)."""
    w = min(1.0, max(0.0, params.recall_felt_weight))
    return (1.0 - w) + w * felt


# ------------------------------------------------------------------ rows as loaded for the cache (``cache_rows``)


@dataclass
class RecordRows:
    """Records of one (imp, scope, dims), as ``cache_rows.CacheRows`` loads them for the cache."""

    ids: list[str] = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)  # float16 vectors of the entry's length (vectors.pack)
    intensity: list[float] = field(default_factory=list)
    valence: list[float] = field(default_factory=list)
    last_felt_s: list[float] = field(default_factory=list)
    construct: list[bool] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # as written: a construct's statement, then the conclusion


@dataclass
class EpisodeRows:
    ids: list[str] = field(default_factory=list)
    record_ids: list[str] = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # the as-it-happened text as written


@dataclass(frozen=True)
class Generation:
    version: int = 0
    deletes: int = 0


class Loader:
    """What the cache needs loaded (``cache_rows.CacheRows`` over the database): a scope's generation, and the rows
    of one (imp, scope, dims), all or written after ``since``. The cache calls it; it never calls back."""

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
    """Texts by row, as written, and which rows name someone (mechanism 15), with a bounded cost per request.

    A name counts only written as a name (``laws.mentions``, issue 32 #9): a letters-only name of a cased
    script where its first letter is a capital ("Will is here") or right after an ``@``; any other name in any
    case. Issue 32 #5: the name work of one search is bounded whatever names a box sends. Each row's words (its
    ``\\w+`` runs, the same ``\\w`` as the laws' whole-word check) are hashed once, when the row is first asked
    about, into sorted segments of (key, row) pairs: every word under its lowercased form, and a word written as
    a name (a capital first, or right after an ``@`` that no word character touches) under a second key as
    well. A name that is one word is then a lookup of the key its kind of name needs (the laws' patterns
    match a name only where no word character touches it, so its word runs are whole words of the text). Every
    other name — several words, or none ("c++", "mary ann", "%") — is looked for only in the rows that hold
    all its words, with the laws' own patterns, within ``NAME_SCAN_CHARS`` of text a request: past it, the
    request's remaining names name no one (only a box that asks for many names of several common words, or
    of none, meets it; a person's name is one word or a rare pair).

    ``nbytes`` is what the texts really hold: each row's ``sys.getsizeof`` (4 bytes a character once one
    character needs them: an emoji text is counted as it is kept) and the index's arrays.
    """

    def __init__(self) -> None:
        self.rows: list[str] = []
        self._row_bytes = 0
        self._segments: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]] = []  # sorted by key
        self._indexed = 0  # rows [0, _indexed) are in the segments

    @property
    def nbytes(self) -> int:
        index = sum(int(hashes.nbytes) + int(rows.nbytes) for hashes, rows in self._segments)
        return self._row_bytes + _LIST_SLOT * len(self.rows) + index

    def extend(self, texts: Sequence[str]) -> None:
        self.rows.extend(texts)
        self._row_bytes += sum(sys.getsizeof(t) for t in texts)

    def replace(self, row: int, text: str) -> None:
        if self.rows[row] != text:
            self._row_bytes += sys.getsizeof(text) - sys.getsizeof(self.rows[row])
            self.rows[row] = text
            self._segments, self._indexed = [], 0  # its words changed: indexed again when next asked

    def _index(self) -> None:
        """Key the words of the rows not indexed yet into a new segment; merge once there are many."""
        if self._indexed < len(self.rows):
            hashes: list[int] = []
            owners: list[int] = []
            for row in range(self._indexed, len(self.rows)):
                keys = set(_word_keys(self.rows[row]))
                hashes.extend(keys)
                owners.extend([row] * len(keys))
            self._segments.append(_sorted_pairs(np.asarray(hashes, np.int64), np.asarray(owners, np.int32)))
            self._indexed = len(self.rows)
        if len(self._segments) > _MERGE_AFTER_SEGMENTS:
            self._segments = [
                _sorted_pairs(
                    np.concatenate([hashes for hashes, _ in self._segments]),
                    np.concatenate([rows for _, rows in self._segments]),
                )
            ]

    def _rows_with(self, key: int) -> npt.NDArray[np.bool_]:
        """A row mask: the rows that have a word under ``key`` (``_any_key`` / ``_name_key``)."""
        mask = np.zeros(len(self.rows), dtype=bool)
        for hashes, rows in self._segments:
            low = int(np.searchsorted(hashes, key, side="left"))
            high = int(np.searchsorted(hashes, key, side="right"))
            if high > low:
                mask[rows[low:high]] = True
        return mask

    def naming(self, names: Sequence[str], budget: list[int] | None = None) -> npt.NDArray[np.bool_]:
        """A row mask: the rows whose text names any of ``names`` (``laws.mention_names``: lowercased), as
        ``laws.mentions`` decides it. A one-word name by a 64-bit keyed hash (Python's ``hash``: salted per
        process, so no box can aim at a collision); any other name by the laws' own patterns over the rows
        that hold all its words, within ``NAME_SCAN_CHARS`` of text a request (see the class doc): ``budget``,
        one request's characters left, shared by every call of that request (spent in place)."""
        mask = np.zeros(len(self.rows), dtype=bool)
        if not names or not self.rows:
            return mask
        self._index()
        if budget is None:
            budget = [NAME_SCAN_CHARS]
        for name in names:
            words = list(dict.fromkeys(_WORD.findall(name)))
            if words == [name]:  # one word: exactly the rows that have it, written as its kind of name needs
                mask |= self._rows_with(_name_key(name) if _needs_capital(name) else _any_key(name))
                continue
            holding = np.ones(len(self.rows), dtype=bool)
            for word in words:
                holding &= self._rows_with(_any_key(word))
            patterns = mention_patterns([name])  # several words, or none: the laws' patterns over those rows
            for row in np.flatnonzero(holding & ~mask):
                text = self.rows[row]
                budget[0] -= len(text) * len(patterns)  # each pattern is one pass over the text
                if budget[0] < 0:
                    return mask  # the request's name work is spent: the rest names no one this time
                if any(pattern.search(text) is not None for pattern in patterns):
                    mask[row] = True
        return mask


def _any_key(word: str) -> int:
    """The index key of a word in any case (``word`` lowercased, as ``laws.mention_names`` gives names)."""
    return hash(("any", word))


def _name_key(word: str) -> int:
    """The index key of a word written as a name: a capital first, or right after an ``@``."""
    return hash(("name", word))


def _needs_capital(name: str) -> bool:
    """Whether a one-word name (lowercased) counts only written as a name (``laws.mentions``): letters only,
    of a script with case. Any other ("carol_99", "中村") counts in any case."""
    first = name[0]
    return name.isalpha() and first.lower() != first.upper() and len(first.upper()) == 1


def _word_keys(text: str) -> Iterator[int]:
    """The index keys of the words of ``text`` (see ``_Texts``)."""
    for match in _WORD.finditer(text):
        word = match.group()
        lowered = word.lower()
        yield _any_key(lowered)
        start = match.start()
        after_at = start > 0 and text[start - 1] == "@" and (start < 2 or not _WORD.match(text[start - 2]))
        if word[0].isupper() or after_at:
            yield _name_key(lowered)


def _sorted_pairs(
    hashes: npt.NDArray[np.int64], rows: npt.NDArray[np.int32]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    order = np.argsort(hashes, kind="stable")
    return hashes[order], rows[order]


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
                self._id_bytes += sys.getsizeof(records.ids[i]) + _LIST_SLOT + _DICT_ENTRY  # list, dict
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
                self._id_bytes += sys.getsizeof(episodes.ids[i]) + _LIST_SLOT + _DICT_ENTRY
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
        named, episodes_named = self._discriminating(names, allowed, owner, params)
        if named is not None:
            scores += np.float32(params.name_bonus) * named  # mechanism 15
        scores[~allowed] = -np.inf
        records = top_k(scores, k)
        if not m:
            return [Hit(self.record_ids[r], float(scores[r])) for r in records if np.isfinite(scores[r])]
        episode_scores = self._episode_vectors.view @ query * weight[owner]  # mechanism 16: its record's felt
        if episodes_named is not None:
            episode_scores += np.float32(params.name_bonus) * episodes_named
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
    ) -> tuple[npt.NDArray[np.bool_] | None, npt.NDArray[np.bool_] | None]:
        """The records and the episodes that earn the name bonus (None: none), by the names that earn it in this
        scope (``laws.name_discriminates``), among the records and among the episodes apart: a name earns it
        among the records of the kinds asked while it names at most half of them (once there are more than one
        search takes), and among their episodes likewise. Apart, because a name may be on every record and on
        few episodes or the other way round (the person's name is written as a name in a record's conclusion,
        "Jo told me", and as they spell it in an episode, "jo said"): counted together, it would lift every
        record of one side over every episode of the other. Each name is looked for once, all of them within one
        request's ``NAME_SCAN_CHARS`` (issue 32 #5)."""
        if not names:
            return None, None
        episodes_allowed = allowed[owner]
        record_rows, episode_rows = int(allowed.sum()), int(episodes_allowed.sum())
        budget = [NAME_SCAN_CHARS]
        records_named = np.zeros(len(self.record_ids), dtype=bool)
        episodes_named = np.zeros(len(self.episode_ids), dtype=bool)
        for name in names:
            in_records = self._texts.naming([name], budget)
            in_episodes = self._episode_texts.naming([name], budget)
            if name_discriminates(int((in_records & allowed).sum()), record_rows, params):
                records_named |= in_records
            if name_discriminates(int((in_episodes & episodes_allowed).sum()), episode_rows, params):
                episodes_named |= in_episodes
        return (records_named if records_named.any() else None), (
            episodes_named if episodes_named.any() else None
        )

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
