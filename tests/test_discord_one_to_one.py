"""ENV-02 / ENV-04 in a one-to-one server channel, end to end on the fake Discord (issue 16).

Only alice talks with pip in #general, so each message is framed ``respond`` / ``one_to_one``. A message
that addresses pip (a reply to one of its messages, a mention) is direct and always answered (ENV-04); a
"brb" that addresses nobody is the model's to answer or not, and ``answer_needed = false`` stays silent
(ENV-02). The real discord.py client, the real box, gateway and SQLite; the fake OpenAI as the model.
"""

from __future__ import annotations

import pytest

from box.context import turn_context
from testing.fake_openai import FakeOpenAI, envelope
from tests.discord_yard import (
    ALICE,
    GENERAL,
    serving,
)

pytestmark = pytest.mark.anyio


async def test_env_02_and_env_04_a_brb_stays_silent_a_reply_to_the_imp_is_answered(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    model.script(envelope(answer="hello alice", answer_needed=True), purpose="reply", times=1)
    model.script(envelope(answer="see you soon", answer_needed=False), purpose="reply")  # the model: no need
    async with serving(monkeypatch, model, answer=None) as yard:
        seen = yard.spy()
        hello = yard.fake.post_message(GENERAL, ALICE, "hi pip")
        await yard.answered(hello.id)
        (greeting,) = await yard.posted(GENERAL)
        brb = yard.fake.post_message(GENERAL, ALICE, "brb")
        await yard.answered(brb.id)
        back = yard.fake.post_message(
            GENERAL, ALICE, "keep my seat", referenced_message=greeting.id, extra={"mentions": []}
        )
        await yard.answered(back.id)
        posted = [m.content for m in yard.fake.messages(GENERAL)]
        outcomes = [yard.rt.history.outcome("pip", str(GENERAL), str(m.id)) for m in (hello, brb, back)]
    assert [(d.framing.mode, d.framing.reason) for d in seen] == [("respond", "one_to_one")] * 3
    assert [d.message.mentions_imp for d in seen] == [False, False, True]  # the reply alone addresses pip
    assert outcomes == ["sent", "silent", "sent"]
    assert posted == ["hello alice", "see you soon"]  # the brb got no answer; the reply to pip did
    brb_prompt = turn_context(model.requests_for("/chat/completions")[1].body["messages"])
    assert "set answer_needed to false. A silent answer (answer_needed false) posts nothing" in brb_prompt
