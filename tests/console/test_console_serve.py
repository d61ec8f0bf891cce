"""Issue 34: ``impyard serve --console`` serves the console in the Discord host's own process, on the same home:
a message answered on Discord shows on the console's Audit page, and a stop takes both down cleanly."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pexpect
import pytest
import requests
from click.testing import CliRunner

from impyard.cli import cli
from testing.fake_openai import FakeOpenAI, envelope
from tests.console.conftest import TOKEN
from tests.discord_yard import ALICE, GENERAL, add_pip, make_fake

IMPYARD = str(Path(sys.executable).parent / "impyard")


@pytest.mark.slow
def test_serve_with_the_console_beside_it(model: FakeOpenAI, impyard_home: Path) -> None:
    model.script(envelope(answer="hello from the host with a console"))
    add_pip()
    CliRunner().invoke(cli, ["channel", "trust", str(GENERAL)])
    with make_fake() as fake:
        env = {
            **os.environ, "IMPYARD_HOME": str(impyard_home), "OPENAI_API_KEY": model.api_key,
            "OPENAI_BASE_URL": model.base_url, "IMPYARD_DISCORD_TOKEN_PIP": fake.token,
            "IMPYARD_DISCORD_API_BASE": fake.api_base, "IMPYARD_DISCORD_GUILD_READY_TIMEOUT": "0.05",
            "IMPYARD_CONSOLE_TOKEN": TOKEN,
        }  # fmt: skip
        child = pexpect.spawn(
            IMPYARD, ["serve", "pip", "--backend", "process", "--console", "--console-port", "0"],
            env=env, encoding="utf-8", timeout=60,
        )  # fmt: skip
        try:
            child.expect(r"impyard console: (http://\S+)/\?token=")
            base = child.match.group(1)
            child.expect("serving pip on Discord")
            fake.post_message(GENERAL, ALICE, "hello")
            child.expect("posted imp=pip channel=1001")
            page = requests.get(
                base + "/audit?method=model.request", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
            )
            assert page.status_code == 200
            assert re.search(r"<td>pip</td><td>model.request</td><td>reply</td>", page.text), page.text
            assert requests.get(base + "/audit", timeout=30).status_code == 401  # the same guard as alone
            child.kill(signal.SIGTERM)
            child.expect("stopped")
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
        assert child.exitstatus == 0, child.before
    with pytest.raises(requests.ConnectionError):
        requests.get(base + "/audit", timeout=5)  # the console stopped with the host
