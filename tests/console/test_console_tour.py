"""Issue 34, "Done when": a fresh home, one ``impyard chat`` turn and ``impyard console`` show that turn in a real
browser — on the pages an operator looks at first.

With ``IMPYARD_CONSOLE_SCREENSHOTS=<dir>`` the tour also saves a screenshot of every page of the navigation into
that directory (docs/console.md's pictures: ``IMPYARD_CONSOLE_SCREENSHOTS=docs/console .venv/bin/pytest
tests/console/test_console_tour.py -p no:xdist``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from impyard.console.pages import PAGES, now
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI
from tests.console.conftest import CLI, settled, start_console, stop_console
from tests.test_chat_terminal import chat_once

SCREENSHOTS_ENV = "IMPYARD_CONSOLE_SCREENSHOTS"
MESSAGE = "hello pip, what a grey morning"


@pytest.mark.slow
@pytest.mark.fake_model(answer="Hello from the tour!")
def test_a_chat_turn_shows_on_the_console(fake: FakeOpenAI, impyard_home: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    chat_once(fake, impyard_home, MESSAGE, "Hello from the tour!")
    console = start_console()
    try:
        browser.get(console.login_url)
        assert "pip" in browser.find_element(By.ID, "imps").text  # Imps, where / leads
        browser.get(console.base + "/audit?imp=pip&method=model.request")
        rows = browser.find_element(By.ID, "audit-rows").text
        assert "model.request" in rows and "reply" in rows and "allowed" in rows
        browser.get(console.base + "/budget")
        spent = browser.find_element(By.CSS_SELECTOR, '#budget-limits tr[data-scope="pip"]').text.split()
        budget = json.loads(subprocess.run([*CLI, "budget", "show", "--json"], capture_output=True, text=True,
                                           timeout=60, check=True).stdout)  # fmt: skip
        (pip,) = [row for row in budget if row["scope"] == "pip"]
        assert (
            pip["daily_spent_usd"] > 0 and spent[1] == f"{pip['daily_spent_usd']:.4f}"
        )  # the turn's cost, as the CLI
        browser.get(console.base + "/now")  # the turn's outcome leads Now's recent outcomes
        (recent,) = settled(
            browser,
            lambda b: [e.text for e in b.find_elements(By.CSS_SELECTOR, "#now-recent tr[data-imp='pip'][data-outcome='sent']")],
        )  # fmt: skip
        assert "terminal (" in recent
        shots = os.environ.get(SCREENSHOTS_ENV)
        if shots:
            take_screenshots(console.base, browser, Path(shots))
    finally:
        stop_console(console)


# What each page's picture shows beyond the one chat turn: a post held for a decision, pip's memory in its terminal
# scope (the page shows one scope at a time).
SHOT_PATHS = {"/memory": "/memory?imp=pip&scope=terminal"}


def take_screenshots(base: str, browser: Any, where: Path) -> None:
    from tests.console.test_console_approvals import hold

    where.mkdir(parents=True, exist_ok=True)
    db = open_database()
    try:
        hold(db, content="Good morning, everyone! The garden club meets at six tonight.")
    finally:
        db.close()
    for event in (
        "The garden club planted tulips by the old well.",
        "Ana told me her sister Maja moved to Bergen.",
    ):
        subprocess.run([*CLI, "memory", "remember", "pip", event, "--valence", "0.6", "--intensity", "0.7",
                        "--age", "2h"], capture_output=True, timeout=120, check=True)  # fmt: skip
    for page in PAGES:
        if page is now.PAGE and (where / "now.png").exists():
            continue  # Now's picture shows a turn in flight (tests/console/test_console_now.py)
        browser.get(base + SHOT_PATHS.get(page.path, page.path))
        browser.save_screenshot(str(where / f"{page.path.strip('/')}.png"))
