"""Whether a reply goes out (seed 003 DecisionMaking; SPEC-001 ENV-01 .. ENV-04). Pure functions.

A *direct* message (ENV-04) is a DM, or a message that addresses the imp: a mention of it or
of its role, or a reply to one of its messages (the host sets ``Message.mentions_imp`` for
all three; a group mention also arrives as framing reason ``mention``). A direct turn is a
forced response: any answer the model wrote is delivered, and the DecisionMaking stage is
skipped (seed 003: direct-prefix turns do not pass through it). Every other turn — judge
framing in a group, and respond framing in a one-to-one server channel when the message
addresses nobody — is decided on the envelope: ``answer_needed = false`` stays silent
(ENV-02), unless a staff note comes with the answer (ENV-03).
"""

from __future__ import annotations

from box.common.envelope import Envelope
from box.protocol.models import Framing, Message


def has_answer(envelope: Envelope) -> bool:
    """Something to post: answer text, or a picture to make (its text may be empty)."""
    return bool(
        (envelope.answer and envelope.answer.strip()) or (envelope.picture and envelope.picture.strip())
    )


def is_direct(framing: Framing, message: Message) -> bool:
    """ENV-04: a DM, or a message addressed to the imp (mention, role mention, reply to the imp)."""
    return framing.reason in ("dm", "mention") or message.mentions_imp


def answers(envelope: Envelope, framing: Framing, message: Message) -> bool:
    """True when the reply should be posted."""
    if not has_answer(envelope):
        return False
    if is_direct(framing, message):
        return (
            True  # ENV-04: a direct message is always answered (ENV-02 is for messages addressed to nobody)
        )
    if envelope.staff:
        return True  # ENV-03: a staff note forces delivery
    return envelope.answer_needed  # ENV-01 / ENV-02
