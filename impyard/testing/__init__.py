"""What tests and the benchmark share: loopback fakes of the services impyard talks to (docs/contributing.md).

Shipped with the package the way Starlette ships its test client, so the benchmark (and anyone testing
an imp) can use them without importing the test suite:

* ``impyard.testing.fake_openai`` — an OpenAI-compatible server the real ``openai`` SDK talks to;
* ``impyard.testing.fake_discord`` — Discord's REST API and gateway websocket for the real ``discord.py``;
* ``impyard.testing.web`` — a throwaway loopback web site (the far end of ``http.fetch``);
* ``impyard.testing.pipes`` — in-memory byte streams for two protocol peers in one process.

Each fake refuses what the real service refuses, or it would hide bugs.
"""
