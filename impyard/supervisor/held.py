"""Why a queued task is held (issue 19 #6): its imp's config is broken, so it waits — it is never failed for it.

A typo in ``imp.toml`` is the operator's to fix, not the task's fault: the task keeps its tries, shows this
reason as its outcome (``impyard task ls`` / ``task show``) and runs once the file reads again.
"""

from __future__ import annotations

from impyard.imps.store import ImpConfigError

BLOCKED_PREFIX = "blocked"
MAX_REASON_CHARS = 300


def blocked_reason(error: ImpConfigError) -> str:
    """One line: what is broken (file, line, key) and that the task runs once it is fixed."""
    first = str(error).splitlines()[0] if str(error) else "the imp's config cannot be read"
    more = len(error.problems) - 1
    also = f" (and {more} more)" if more > 0 else ""
    return f"{BLOCKED_PREFIX}: {first[:MAX_REASON_CHARS]}{also} — it runs once the file is fixed"
