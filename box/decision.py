"""Whether a reply goes out (seed 003 DecisionMaking; SPEC-001 ENV-01 .. ENV-04). Pure functions.

Respond framing (a DM, a mention, a one-to-one talk, a prompt task's forced answer) is a
forced response: any answer the model wrote is delivered, and the DecisionMaking stage is
skipped. Judge framing asks the envelope's ``answer_needed`` — except that an answer is
always delivered in a direct message (ENV-04), when the message addresses the imp, and
when a staff note comes with it (ENV-03).
"""

from __future__ import annotations

from box.envelope import Envelope
from box.protocol.models import Framing


def has_answer(envelope: Envelope) -> bool:
    """Something to post: answer text, or a picture to make (its text may be empty)."""
    return bool(
        (envelope.answer and envelope.answer.strip()) or (envelope.picture and envelope.picture.strip())
    )


def judge_answers(envelope: Envelope, framing: Framing) -> bool:
    """DecisionMaking in judge framing: True when the reply should be posted."""
    if not has_answer(envelope):
        return False
    if framing.reason == "dm":
        return True  # ENV-04: direct messages are always answered
    if framing.reason == "mention":
        return True  # ENV-02 applies only to messages that address nobody
    if envelope.staff:
        return True  # ENV-03: a staff note forces delivery
    return envelope.answer_needed  # ENV-01 / ENV-02


def respond_answers(envelope: Envelope) -> bool:
    """Respond framing: a forced response; the envelope's answer_needed is not consulted (ENV-04 for DMs)."""
    return has_answer(envelope)
