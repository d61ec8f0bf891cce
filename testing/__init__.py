"""What the tests and the benchmark share, outside the shipped package (docs/contributing.md): loopback fakes
of the services impyard talks to, and the in-process box backend.

* ``testing.fake_openai`` — an OpenAI-compatible server the real ``openai`` SDK talks to;
* ``testing.fake_discord`` — Discord's REST API and gateway websocket for the real ``discord.py``;
* ``testing.web`` — a throwaway loopback web site (the far end of ``http.fetch``);
* ``testing.pipes`` — in-memory byte streams for two protocol peers in one process;
* ``testing.inprocess`` — the in-process box backend: the real box program in the host's process.

Each fake refuses what the real service refuses, or it would hide bugs. Not in the wheel (pyproject's package
list names ``impyard`` and ``box`` only): it is imported from the repository root, where pytest and
``python -m bench`` run.
"""
