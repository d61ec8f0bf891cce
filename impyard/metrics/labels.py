"""What a label of impyard's metrics may say (docs/metrics.md): pure rules, so every value is bounded.

A label never carries a person's id, a channel id or message text, and its values are a small set: an imp's name
(the operator names imps), a rule's name (the policy names rules), a model the price table lists, a purpose, an
outcome, a stage. A value from a box or an upstream that is not in its known set becomes ``other``, and every
value is clipped to ``MAX_LABEL_CHARS`` of a safe alphabet, so a box that makes up names cannot grow the series.
"""

from __future__ import annotations

import re
from collections.abc import Collection

MAX_LABEL_CHARS = 64
OTHER = "other"  # what a value outside its known set is counted as
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/-]")

# The lease kinds a host holds (``impyard.storage.leases``): shard:I/N, channel:<id>, task:<task>/<run>,
# host:<hostname>/<pid>; anything else (a supervisor's own, a console's) by its prefix when it is one of these.
LEASE_KINDS = frozenset({"shard", "channel", "task", "host", "supervisor", "console"})
BOX_STATES = frozenset({"starting", "idle", "busy", "task", "spare"})  # spare: issue 37
START_KINDS = frozenset({"cold", "spare", "warm"})
TOKEN_KINDS = frozenset({"input", "output", "cached"})


def clipped(value: str) -> str:
    """``value`` in the safe alphabet (anything else an underscore), at most ``MAX_LABEL_CHARS``; never empty."""
    text = _UNSAFE.sub("_", value)[:MAX_LABEL_CHARS]
    return text or OTHER


def known(value: str | None, allowed: Collection[str]) -> str:
    """``value`` when it is one of ``allowed`` (a set the operator or the code wrote), else ``other``."""
    return clipped(value) if value is not None and value in allowed else OTHER


def lease_kind(name: str) -> str:
    """The kind of a lease from its name (``shard:0/2`` → ``shard``): its prefix, never the id after it."""
    prefix = name.split(":", 1)[0]
    return prefix if prefix in LEASE_KINDS else OTHER
