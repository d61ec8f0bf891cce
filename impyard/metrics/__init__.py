"""The fleet's metrics and health (issue 34, docs/metrics.md): one Prometheus registry per process, the thin calls
the parts of the host make where things happen (``registry``), what a label may say (``labels``), and the
``/metrics``, ``/healthz`` and ``/readyz`` server a long-running process opens (``http``: ``serve_health``,
``ReadyCheck``).

May import: foundations only (``impyard.errors``…): every package above may count into it, and it knows none of
them. What holds live state (boxes, leases) registers itself (``counting_boxes``, ``counting_leases``).
"""

from impyard.metrics.registry import (
    BoxCensus,
    LeaseCensus,
    Metrics,
    box_started,
    counting_boxes,
    counting_leases,
    current,
    exposition,
    fresh,
    model_call,
    model_tokens,
    refused,
    sample,
    spent,
    stage_seconds,
    turn_finished,
)

__all__ = [
    "BoxCensus",
    "LeaseCensus",
    "Metrics",
    "box_started",
    "counting_boxes",
    "counting_leases",
    "current",
    "exposition",
    "fresh",
    "model_call",
    "model_tokens",
    "refused",
    "sample",
    "spent",
    "stage_seconds",
    "turn_finished",
]
