"""``python -m bench.fake_model LATENCY_S``: the loopback fake OpenAI in a process of its own.

Prints ``BASE_URL API_KEY`` and serves until its stdin closes. Its own process keeps
its threads out of the supervisor's GIL and RSS, as a real remote model would be.

Every call answers after LATENCY_S: the reply envelope by default, an embedding on ``/embeddings``, and
for the memory engine's structured calls (issue 23) an answer that fits each one's schema, so a memory
turn does all its work: the filter keeps two candidates, the appraisal forms a feeling, the summary a text;
the selection matches two rules, every introspection step keeps thinking (so a reflection makes all four
calls), learning finds a rule and classification calls it the same as the strongest held.
"""

from __future__ import annotations

import sys
from typing import Any

from testing.fake_openai import FakeOpenAI

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


def main() -> None:
    with FakeOpenAI(latency_s=float(sys.argv[1])) as fake:
        for schema_name, answer in MEMORY_ANSWERS.items():
            fake.script(answer, schema_name=schema_name)
        print(fake.base_url, fake.api_key, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
