"""The process's metrics (docs/metrics.md): one ``CollectorRegistry`` the host owns, the metrics on it, and the thin
calls the parts of the host make where an event really happens.

Counters and histograms are counted as things happen (``turn_finished``, ``model_call``…). The gauges of what a
process holds now — its boxes and its leases — are read when ``/metrics`` is scraped, from the parts that hold
them (``counting_boxes``, ``counting_leases``): a gauge that is read off the live state never drifts from it.

Tests read deltas (``sample`` before and after), or take a fresh registry (``fresh``), so no test depends on what
another one counted.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
)
from prometheus_client import (
    Counter as PromCounter,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from impyard.metrics.labels import BOX_STATES, OTHER, START_KINDS, TOKEN_KINDS, clipped, known, lease_kind

log = logging.getLogger("impyard.metrics")
T = TypeVar("T")
S = TypeVar("S")

# A turn's seconds: a quick silent judgement is well under a second, a slow local model a minute or more.
TURN_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# The stages a box announces (``turn.stage``, box/protocol/models.py ``Stage``), and ``turn``: the whole turn.
TURN_STAGES = frozenset({"context", "tools", "decision", "render", "send", "post", "failed", "turn"})
TURN_OUTCOMES = frozenset({"sent", "silent", "pending", "failed"})
SURFACES = frozenset({"discord", "terminal", "log"})
CALL_OUTCOMES = frozenset(
    {
        "allowed",
        "denied",
        "rate_limited",
        "budget_exhausted",
        "unreachable",
        "timeout",
        "interrupted",
        "error",
    }
)
MICROS_PER_USD = 1_000_000

disable_created_metrics()  # no ``*_created`` series: Prometheus has no use for them, and they double the text


class BoxCensus(Protocol):
    """A part that holds boxes (the session manager, the task supervisor): each live box's imp and state."""

    def box_states(self) -> Iterable[tuple[str, str]]: ...


class LeaseCensus(Protocol):
    """A part that holds leases (a lease keeper): the names of those it holds now, and may still act under."""

    def leases_held(self) -> Iterable[str]: ...


# The live parts the gauges are read from (whatever registry is current): added and removed under the lock, since a
# scrape may read them from another thread.
_SOURCES_LOCK = threading.Lock()
_BOX_SOURCES: list[BoxCensus] = []
_LEASE_SOURCES: list[LeaseCensus] = []


def _read(census: Callable[[], Iterable[T]]) -> list[T]:
    """What a live part says of itself now; nothing when it cannot say (a scrape never fails for one part)."""
    try:
        return list(census())
    except Exception:  # noqa: BLE001 - a gauge left out is logged, the rest of /metrics still answers
        log.exception("a metrics census failed")
        return []


class _Census(Collector):
    """``impyard_boxes`` and ``impyard_leases_held``, read off the live parts at each scrape."""

    def collect(self) -> Iterator[Metric]:
        with _SOURCES_LOCK:
            box_sources, lease_sources = list(_BOX_SOURCES), list(_LEASE_SOURCES)
        boxes: Counter[tuple[str, str]] = Counter()
        for boxer in box_sources:
            for imp, state in _read(boxer.box_states):
                boxes[(clipped(imp), known(state, BOX_STATES))] += 1
        family = GaugeMetricFamily(
            "impyard_boxes", "Boxes this process runs now, by imp and state.", labels=["imp", "state"]
        )
        for (imp, state), count in sorted(boxes.items()):
            family.add_metric([imp, state], count)
        yield family
        held: Counter[str] = Counter()
        for holder in lease_sources:
            for name in _read(holder.leases_held):
                held[lease_kind(name)] += 1
        family = GaugeMetricFamily(
            "impyard_leases_held",
            "Leases this process holds now and may act under, by kind.",
            labels=["kind"],
        )
        for kind, count in sorted(held.items()):
            family.add_metric([kind], count)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("impyard_boxes", "", labels=["imp", "state"])
        yield GaugeMetricFamily("impyard_leases_held", "", labels=["kind"])


@dataclass(eq=False)
class Metrics:
    """Every metric of impyard, on ``registry``."""

    registry: CollectorRegistry
    turns: PromCounter
    turn_seconds: Histogram
    model_calls: PromCounter
    model_tokens: PromCounter
    spend: PromCounter
    refusals: PromCounter
    box_starts: PromCounter
    census: _Census

    @classmethod
    def on(cls, registry: CollectorRegistry, *, process: bool = True) -> Metrics:
        """The metrics on a new ``registry``; ``process``: with the process's own (CPU, memory, GC)."""
        if process:
            for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                registry.register(collector)
        census = _Census()
        registry.register(census)
        return cls(
            registry=registry,
            turns=PromCounter(
                "impyard_turns", "Turns ended, by imp, surface and outcome.", ["imp", "surface", "outcome"],
                registry=registry,
            ),
            turn_seconds=Histogram(
                "impyard_turn_seconds", "Seconds spent in each stage of a turn (stage=turn: the whole turn).",
                ["stage"], buckets=TURN_BUCKETS_S, registry=registry,
            ),
            model_calls=PromCounter(
                "impyard_model_calls", "model.request calls, by imp, purpose, model and outcome.",
                ["imp", "purpose", "model", "outcome"], registry=registry,
            ),
            model_tokens=PromCounter(
                "impyard_model_tokens", "Tokens the upstream reported, by imp, purpose and kind (cached: of input).",
                ["imp", "purpose", "kind"], registry=registry,
            ),
            spend=PromCounter(
                "impyard_spend_usd", "USD charged to the ledger (settled model calls), by imp.", ["imp"],
                registry=registry,
            ),
            refusals=PromCounter(
                "impyard_refusals", "Box requests the gateway refused, by the rule that refused them.", ["rule"],
                registry=registry,
            ),
            box_starts=PromCounter(
                "impyard_box_starts", "Turns and tasks by how their box came: cold (started), spare, warm (running).",
                ["runtime", "kind"], registry=registry,
            ),
            census=census,
        )  # fmt: skip


_current = Metrics.on(CollectorRegistry(auto_describe=True))


def current() -> Metrics:
    """The process's metrics (the registry ``/metrics`` serves)."""
    return _current


def fresh(*, process: bool = False) -> Metrics:
    """Replace the process's metrics by new ones on a new registry (tests); the parts counted live
    (``counting_boxes``, ``counting_leases``) count in it too."""
    global _current
    _current = Metrics.on(CollectorRegistry(auto_describe=True), process=process)
    return _current


def exposition() -> bytes:
    """``/metrics``: the registry in Prometheus' text format."""
    return generate_latest(_current.registry)


def sample(name: str, **labels: str) -> float:
    """One sample's value now (0 when it has none yet): ``sample("impyard_turns_total", imp="pip", ...)``."""
    value = _current.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# ------------------------------------------------------------------ the calls the parts make


def turn_finished(imp: str, surface: str, outcome: str, seconds: float | None) -> None:
    """A turn ended with ``outcome`` (``DeliverResult.outcome``); ``seconds``: the whole turn, when it ran."""
    _current.turns.labels(clipped(imp), known(surface, SURFACES), known(outcome, TURN_OUTCOMES)).inc()
    if seconds is not None:
        _current.turn_seconds.labels("turn").observe(max(0.0, seconds))


def stage_seconds(stage: str, seconds: float) -> None:
    """A turn spent ``seconds`` in ``stage`` (from its ``turn.stage`` to the next, or to the turn's end)."""
    _current.turn_seconds.labels(known(stage, TURN_STAGES)).observe(max(0.0, seconds))


def model_call(imp: str, purpose: str, model: str, outcome: str) -> None:
    """One ``model.request`` ended (``outcome``: its audit verdict). ``purpose`` and ``model`` are bounded by
    the caller (``labels.known``): the policy's purposes and priced models, else ``other``."""
    _current.model_calls.labels(
        clipped(imp), clipped(purpose), clipped(model), known(outcome, CALL_OUTCOMES)
    ).inc()


def model_tokens(imp: str, purpose: str, *, input: int = 0, output: int = 0, cached: int = 0) -> None:
    """The tokens the upstream reported for one call."""
    for kind, count in (("input", input), ("output", output), ("cached", cached)):
        if count > 0:
            _current.model_tokens.labels(clipped(imp), clipped(purpose), known(kind, TOKEN_KINDS)).inc(count)


def spent(imp: str, micros: int) -> None:
    """The ledger charged ``micros`` micro-USD to ``imp`` (a settled reservation)."""
    if micros > 0:
        _current.spend.labels(clipped(imp)).inc(micros / MICROS_PER_USD)


def refused(rule: str) -> None:
    """The gateway refused a box's request by ``rule`` (a policy rule's name or the gateway's own: budget, lease…)."""
    _current.refusals.labels(clipped(rule or OTHER)).inc()


def box_started(runtime: str, kind: str) -> None:
    """A turn or task got its box: ``cold`` (a box started for it), ``spare`` (a box started ahead, issue 37),
    ``warm`` (a box already running served it)."""
    _current.box_starts.labels(clipped(runtime), known(kind, START_KINDS)).inc()


@contextmanager
def _listed(sources: list[S], source: S) -> Iterator[None]:
    with _SOURCES_LOCK:
        sources.append(source)
    try:
        yield
    finally:
        with _SOURCES_LOCK:
            if source in sources:
                sources.remove(source)


def counting_boxes(source: BoxCensus) -> AbstractContextManager[None]:
    """``source``'s boxes count in ``impyard_boxes`` for the block."""
    return _listed(_BOX_SOURCES, source)


def counting_leases(source: LeaseCensus) -> AbstractContextManager[None]:
    """``source``'s leases count in ``impyard_leases_held`` for the block."""
    return _listed(_LEASE_SOURCES, source)
