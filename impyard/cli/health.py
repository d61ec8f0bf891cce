"""The options every long-running command takes for its metrics and health endpoints (docs/metrics.md)."""

from __future__ import annotations

import click

from impyard.metrics.http import DEFAULT_HOST


def metrics_options(command: click.decorators.FC) -> click.decorators.FC:
    """``--metrics-port`` and ``--metrics-host``, the same on every long-running command (docs/metrics.md)."""
    command = click.option(
        "--metrics-host", default=DEFAULT_HOST, show_default=True, metavar="HOST",
        help="Where --metrics-port listens (0.0.0.0: every interface; keep it behind a firewall).",
    )(command)  # fmt: skip
    return click.option(
        "--metrics-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
        help="Serve /metrics (Prometheus), /healthz and /readyz on this port (0: a free one, logged).",
    )(command)  # fmt: skip
