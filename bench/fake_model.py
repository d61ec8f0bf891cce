"""``python -m bench.fake_model LATENCY_S``: the loopback fake OpenAI in a process of its own.

Prints ``BASE_URL API_KEY`` and serves until its stdin closes. Its own process keeps
its threads out of the supervisor's GIL and RSS, as a real remote model would be.
"""

from __future__ import annotations

import sys

from impyard.testing.fake_openai import FakeOpenAI


def main() -> None:
    with FakeOpenAI(latency_s=float(sys.argv[1])) as fake:
        print(fake.base_url, fake.api_key, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
