"""The wake rule (seed 004 §1, docs/conversation.md): a pure function of the message's facts.

Wake iff it is a DM, or the imp is mentioned (a user mention of the imp, a
mention of its own managed role, or a reply to one of its messages — never
``@everyone``/``@here``), or the channel's mode is ``all``. Bots (other imps
included: no imp-to-imp loops) and the imp's own messages never get here:
``Conversations.route`` drops them first, for every surface (``Inbound.from_a_bot``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from impyard.channels.store import ChannelMode


@dataclass(frozen=True)
class WakeFacts:
    is_dm: bool
    mode: ChannelMode
    mentions_imp: bool = (
        False  # the imp's user is in message.mentions (not mentioned_in(): that counts @everyone)
    )
    mentions_imp_role: bool = False  # the imp's own managed role is mentioned
    replies_to_imp: bool = False  # the message replies to one of the imp's messages
    mentions_everyone: bool = False  # @everyone / @here: deliberately not a wake reason


@dataclass(frozen=True)
class WakeDecision:
    wake: bool
    reason: Literal["dm", "mention", "mode_all", "ambient"]
    addressed: bool  # the imp was addressed directly (DM or mention): judge framing reports it


def decide_wake(facts: WakeFacts) -> WakeDecision:
    if facts.is_dm:
        return WakeDecision(True, "dm", True)
    if facts.mentions_imp or facts.mentions_imp_role or facts.replies_to_imp:
        return WakeDecision(True, "mention", True)
    if facts.mode == "all":
        return WakeDecision(True, "mode_all", False)
    return WakeDecision(False, "ambient", False)
