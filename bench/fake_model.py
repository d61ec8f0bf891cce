"""``python -m bench.fake_model LATENCY_S [talk]``: the loopback fake OpenAI in a process of its own.

Prints ``BASE_URL API_KEY`` and serves until its stdin closes. Its own process keeps
its threads out of the supervisor's GIL and RSS, as a real remote model would be.

Every call answers after LATENCY_S: the reply envelope by default, an embedding on ``/embeddings``, and
for the memory engine's structured calls (issue 23) an answer that fits each one's schema, so a memory
turn does all its work: the filter keeps two candidates, the appraisal forms a feeling, the summary a text;
the selection matches two rules, every introspection step keeps thinking (so a reflection makes all four
calls), learning finds a rule and classification calls it the same as the strongest held.

The filter reads a memory question ("what did I tell you about …?", ``MEMORY_QUESTION``) as asking for a
moment of the imp's past (mechanism 21), so a memory question takes its path through the engine. With ``talk``
(the memory-turn scenario, issue 33) every reply says a sentence of ordinary length (``TALK_REPLIES``) instead of
"ok": what a reply writes is output tokens, and it comes back in every later turn's history.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope

# By the schema name of the call (box/memory: association_filter.SCHEMA, moment.SCHEMA, summary.SCHEMA).
MEMORY_ANSWERS: dict[str, dict[str, Any]] = {
    "filter": {"keep": [1, 2], "asks_for_memory": False, "asks_for_own": None},
    "appraisal": {
        "feeling": "glad",
        "conclusion": "Ann asks after my day; she cares how I am.",
        "valence": 0.4,
        "intensity": 0.5,
    },
    "summary": {"summary": "Ann keeps asking how my day is going; we talk briefly and warmly."},
    # Memory II (issue 14): every call of a turn, a reflection and a departure does its work.
    "arrival": {
        "greeting": "Hello again, Ann.",
        "feeling": "glad",
        "conclusion": "Ann is back.",
        "valence": 0.4,
        "intensity": 0.4,
        "search": None,
    },
    "selection": {"matched": [1, 2]},
    "introspection": {
        "thought": "Ann asks after me every day; it steadies me.",
        "feeling": "warm",
        "conclusion": "Ann's questions are a kind of care.",
        "valence": 0.4,
        "intensity": 0.5,
        "reinforces": None,
        "act": "keep_thinking",
        "text": None,
    },
    "learning": {"learned": "when someone asks after my day → I answer warmly and ask back"},
    "classification": {"same": 1, "contradicts": -1},
    # Memory III (issue 15): the night's plan folds records 2 and 3 into record 1.
    "sleep": {"groups": [{"anchor": 1, "absorbed": [2, 3], "summary_fact": "A day of small things."}]},
}


MEMORY_QUESTION = "what did i tell you about"  # lower case; the filter finds it in the words it is shown
# Replies of ordinary length, each starting differently: a conversation's lines differ from their first words, so
# a history window that slides by a line shares no more of its start than a real one would.
TALK_REPLIES = (
    "That's kind of you to ask! My day has been quiet: I sorted my notes and watched the rain for a while.",
    "Busy, honestly. Three people asked me about train times and I got two of them right. What about you?",
    "Oh, you know me, I spent the morning reading about moths. Did you know some never eat as adults?",
    "Not bad at all. I tried to learn a card trick and failed in a new and interesting way each time.",
    "Quite good! Someone shared a recipe for lemon cake and now I can't stop thinking about it.",
    "A little slow. I like slow days, though: there is time to think properly about things.",
    "Honestly? Mixed. A long argument about tabs and spaces, then a lovely chat about old maps.",
)
_talked = itertools.count()


def talk_reply(request: RecordedRequest) -> dict[str, Any]:
    """The next of ``TALK_REPLIES``, in turn."""
    return envelope(answer=TALK_REPLIES[next(_talked) % len(TALK_REPLIES)])


def filter_answer(request: RecordedRequest) -> dict[str, Any]:
    """The filter's verdict: ``asks_for_memory`` where the words shown to it ask what the person told the imp."""
    body = request.body if isinstance(request.body, dict) else {}
    messages = body.get("messages") or body.get("input") or []
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    shown = users[-1].get("content") if users else ""
    asks = isinstance(shown, str) and MEMORY_QUESTION in shown.lower()
    return {**MEMORY_ANSWERS["filter"], "asks_for_memory": asks}


def main() -> None:
    with FakeOpenAI(latency_s=float(sys.argv[1])) as fake:
        if sys.argv[2:] == ["talk"]:
            fake.script(talk_reply, purpose="reply")
        fake.script(filter_answer, schema_name="filter")
        for schema_name, answer in MEMORY_ANSWERS.items():
            fake.script(answer, schema_name=schema_name)
        print(fake.base_url, fake.api_key, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
