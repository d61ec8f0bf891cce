"""Table tests for the wake rule and respond-vs-judge framing (seed 004 §1-3)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from impyard.conversation.framing import RecentAuthor, decide_framing
from impyard.conversation.wake import WakeFacts, decide_wake

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("facts", "wake", "reason"),
    [
        (WakeFacts(is_dm=True, mode="mention"), True, "dm"),
        (WakeFacts(is_dm=True, mode="all"), True, "dm"),
        (WakeFacts(is_dm=False, mode="all"), True, "mode_all"),
        (WakeFacts(is_dm=False, mode="mention"), False, "ambient"),
        (WakeFacts(is_dm=False, mode="mention", mentions_imp=True), True, "mention"),
        (WakeFacts(is_dm=False, mode="mention", mentions_imp_role=True), True, "mention"),
        (WakeFacts(is_dm=False, mode="mention", replies_to_imp=True), True, "mention"),
        # @everyone / @here never count as a mention of the imp (docs/architecture.md).
        (WakeFacts(is_dm=False, mode="mention", mentions_everyone=True), False, "ambient"),
        (WakeFacts(is_dm=False, mode="all", mentions_everyone=True), True, "mode_all"),
        # Bots and the imp's own messages never reach the wake rule: Conversations.route drops them
        # (tests/test_conversation.py, test_bots_and_imps_never_wake_and_are_not_stored).
    ],
)
def test_wake_rule(facts: WakeFacts, wake: bool, reason: str) -> None:
    decision = decide_wake(facts)
    assert (decision.wake, decision.reason) == (wake, reason)


def humans(*names: str, minutes_ago: int = 1) -> list[RecentAuthor]:
    return [RecentAuthor(name, name, False, NOW - timedelta(minutes=minutes_ago)) for name in names]


@pytest.mark.parametrize(
    ("kind", "addressed", "recent", "mode", "reason", "count"),
    [
        ("dm", True, humans("ann"), "respond", "dm", 1),
        ("dm", True, humans("ann", "bob", "cid"), "respond", "dm", 3),  # a DM is 1:1 whatever the history
        ("terminal", True, humans("ann"), "respond", "dm", 1),
        ("guild", False, [], "respond", "one_to_one", 0),
        ("guild", False, humans("ann"), "respond", "one_to_one", 1),
        ("guild", False, humans("ann", "ann", "ann"), "respond", "one_to_one", 1),
        ("guild", False, humans("ann", "bob"), "judge", "group", 2),
        ("guild", True, humans("ann", "bob"), "judge", "mention", 2),
        ("guild", False, humans("a", "b", "c", "d", "e"), "judge", "group", 5),
        # The imp itself and bots are not participants.
        (
            "guild",
            False,
            humans("ann", "imp") + [RecentAuthor("bot", "bot", True, NOW)],
            "respond",
            "one_to_one",
            1,
        ),
        # Authors older than the window do not count.
        ("guild", False, humans("old", minutes_ago=31) + humans("ann"), "respond", "one_to_one", 1),
    ],
)
def test_framing(
    kind: str, addressed: bool, recent: list[RecentAuthor], mode: str, reason: str, count: int
) -> None:
    framing = decide_framing(channel_kind=kind, addressed=addressed, recent=recent, imp_id="imp", now=NOW)
    assert (framing.mode, framing.reason, len(framing.participants)) == (mode, reason, count)


def test_framing_counts_only_the_last_messages_of_the_window() -> None:
    recent = humans("bob") + humans("ann") * 50
    assert (
        decide_framing(channel_kind="guild", addressed=False, recent=recent, imp_id="imp", now=NOW).mode
        == "respond"
    )
    assert (
        decide_framing(
            channel_kind="guild", addressed=False, recent=recent, imp_id="imp", now=NOW, max_messages=51
        ).mode
        == "judge"
    )
