"""Short-path rules: archive a message without a model call (SPEC-001 ENV-05). A pure function.

A rule is a ``(channel_regex, user_regex)`` pair (Python ``re``, searched, so anchor with
``^…$`` for a whole match). The channel regex is tried on the channel's name and its id,
the user regex on the author's name and id; a rule matches when both match. A pattern that
does not compile matches nothing (the host validates them when it loads imp.toml).
"""

from __future__ import annotations

import re
from collections.abc import Sequence


def _search(pattern: str, *values: str) -> bool:
    try:
        compiled = re.compile(pattern)
    except re.error:
        return False
    return any(compiled.search(value) for value in values if value is not None)


def short_path_matches(
    rules: Sequence[tuple[str, str]], *, channel_name: str, channel_id: str, author_name: str, author_id: str
) -> bool:
    return any(
        _search(channel_re, channel_name, channel_id) and _search(user_re, author_name, author_id)
        for channel_re, user_re in rules
    )
