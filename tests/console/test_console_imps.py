"""Issue 34, the Imps page: each imp of a real home — its day, warm boxes and their runtime, channels with mode and
trust, today's spend against its budget — read from the stores the CLI reads, through a real ``impyard console``.

The home is made as an operator makes it: imps with ``impyard imp add``, channel settings with ``impyard channel``, a
budget with ``impyard budget set``; a message that woke an imp in the history and the supervisor's clock stepping
over it (``wakefulness.step``), a model call's spend through the ledger, and the host records serving hosts keep.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from box.protocol.models import Author, Message
from impyard.cli import cli
from impyard.clock import FixedClock, SystemClock
from impyard.conversation.history import History
from impyard.gateway.ledger import Ledger
from impyard.gateway.policy import load_policy
from impyard.imps.store import ImpError, ImpStore
from impyard.memory.wakefulness import step
from impyard.storage.db import Database, open_database
from impyard.storage.leases import HostCard, ImpBoxes, LeaseStore
from impyard.storage.liveness import Holder
from impyard.tasks import TaskStore
from tests.console.conftest import CLI, Console
from tests.console.page_rows import table_rows

PIP_CHANNEL = "123456789012345678"
BO_CHANNEL = "987654321098765432"
FAR = Holder("far-away", "b00t", 4242, "9")  # a serving host on another machine
GONE = Holder("elsewhere", "f00d", 777, "3")  # one that stopped renewing an hour ago
UTC_FORMAT = "%Y-%m-%d %H:%M:%S"
LIVE = timedelta(hours=1)  # a live host's record outlives the test however slow the machine is
BROKEN_TOML = 'name = "bad"\n\n[model]\nmodel = 5\n'


def run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def woke(db: Database, imp: str, channel: str, at: datetime) -> None:
    """Ann said something in ``channel`` at ``at`` that woke ``imp`` (the conversation records both)."""
    history = History(db, FixedClock(at))
    message = Message(id=f"m-{imp}-{at.timestamp():.0f}", author=Author(id="2001", name="Ann"), content="hi",
                      created_at=at)  # fmt: skip
    history.record(channel, message)
    history.record_wake(imp, channel, message.id)


def tick(db: Database, imp: str, at: datetime) -> None:
    """One tick of the supervisor's clock for ``imp`` at ``at``."""
    step(db, TaskStore(db, FixedClock(at), ImpStore()), imp, at)


class Home:
    """The times the home was made with, to compare the page against."""

    def __init__(self) -> None:
        now = SystemClock().now().replace(microsecond=0)
        self.pip_woke = now - timedelta(minutes=10)
        self.bo_woke = now - timedelta(hours=5)
        self.bo_slept = self.bo_woke + timedelta(seconds=7201)  # 7200 s of silence: asleep (mechanism 106)
        self.bo_night = self.bo_slept + timedelta(seconds=601)  # 600 s into sleep: its night (mechanism 107)


@pytest.fixture
def home(impyard_home: Path) -> Iterator[Home]:
    made = Home()
    for name in ("pip", "bo", "cy"):
        run("imp", "add", name)
    broken = impyard_home / "imps" / "bad"
    broken.mkdir()
    (broken / "imp.toml").write_text(BROKEN_TOML)
    run("channel", "mode", PIP_CHANNEL, "mention")
    run("channel", "trust", PIP_CHANNEL)
    run("channel", "untrust", BO_CHANNEL)
    run("budget", "set", "pip", "--daily", "0.01")
    db = open_database()
    try:
        woke(db, "pip", PIP_CHANNEL, made.pip_woke)
        tick(db, "pip", made.pip_woke + timedelta(seconds=1))  # awake, reflecting
        woke(db, "bo", BO_CHANNEL, made.bo_woke)
        for at in (made.bo_woke + timedelta(seconds=1), made.bo_slept, made.bo_night):
            tick(db, "bo", at)
        ledger = Ledger(db, load_policy(), SystemClock())
        held = ledger.reserve("pip", 5_000, method="model.request", purpose="reply", model="gpt-5.1")
        ledger.settle(held, 2_500)  # $0.0025 today
        serving = HostCard("serve", "/srv/yard", "0/1", warm_boxes=lambda: 2,
                           boxes=lambda: [ImpBoxes("pip", 2, "docker", "runsc", "auto (the default)")])  # fmt: skip
        LeaseStore(db, me=FAR).acquire("host:far-away/4242", serving.detail(), LIVE)
        stopped = HostCard(
            "serve", "/srv/old", boxes=lambda: [ImpBoxes("bo", 1, "docker", "runc", "[box] runtime")]
        )
        LeaseStore(db, FixedClock(made.bo_woke), me=GONE).acquire("host:elsewhere/777", stopped.detail())
    finally:
        db.close()
    yield made


def utc(when: datetime) -> str:
    return f'title="{when:{UTC_FORMAT}} UTC"'


def test_the_imps_page_shows_each_imp_as_the_stores_say(console: Console, home: Home) -> None:
    page = console.get("/imps")
    assert page.status_code == 200
    rows = {row.attrs["data-imp"]: row for row in table_rows(page.text, "imps", keyed_by="data-imp")}
    assert list(rows) == ["bad", "bo", "cy", "pip"]  # ImpStore.scan's order: by name

    with pytest.raises(ImpError) as broken:
        ImpStore().get("bad")
    first_line = str(broken.value).splitlines()[0]
    assert "key 'model.model'" in first_line
    assert rows["bad"].cells == ["bad", f"imp.toml cannot be loaded: {first_line}"]

    ago = r"(\d+h)?(\d+m)?(\d+s)? ago"
    pip = rows["pip"].cells
    assert pip[0] == "pip gpt-5.1"
    assert re.fullmatch(r"awake since 1\dm(\d+s)? ago", pip[1]), pip[1]  # 10 minutes, read a moment later
    assert pip[2] == "no night yet"
    assert pip[3] == "2 warm on far-away (serve, pid 4242) · docker, runsc"
    assert pip[4] == f"{PIP_CHANNEL} mention trusted"
    assert pip[5] == "$0.0025 of $0.0100"
    assert 'width="25.0"' in page.text  # the meter: a quarter of today's limit

    bo = rows["bo"].cells
    assert re.fullmatch(rf"asleep since {ago}", bo[1]) and re.fullmatch(
        rf"slept {ago}, folded {ago}", bo[2]
    ), bo
    assert bo[3] == "no host serves it now [box] auto, runtime auto"  # its only host stopped renewing
    assert bo[4] == f"{BO_CHANNEL} all untrusted"
    assert bo[5] == "$0.0000 of $2.0000"  # the policy's [budgets.per_imp]

    cy = rows["cy"].cells
    assert cy[1:5] == ["not seen by the clock yet", "no night yet", "no host serves it now [box] auto, runtime auto",
                       "none yet"]  # fmt: skip
    for when in (home.pip_woke, home.bo_slept, home.bo_night):
        assert utc(when) in page.text
    assert "All imps today: $0.0025 of $5.0000; this month $0.0025 of $50.0000" in page.text


def test_the_page_agrees_with_the_cli(console: Console, home: Home) -> None:
    def cli_json(*args: str) -> Any:
        done = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, timeout=60, check=True)
        return json.loads(done.stdout)

    budget = {row["scope"]: row for row in cli_json("budget", "show")}
    channels = {row["channel_id"]: row for row in cli_json("channel", "ls")}
    day = cli_json("memory", "stats", "bo")["clock"]
    page = console.get("/imps/pip").text
    spend = table_rows(page, "imp-spend")[1].cells
    row = budget["pip"]
    assert spend == [f"{row['daily_spent_usd']:.4f}", f"{row['daily_limit_usd']:.4f}",
                     f"{row['monthly_spent_usd']:.4f}", f"{row['monthly_limit_usd']:.4f}",
                     f"{row['reserved_usd']:.4f}", row["source"]]  # fmt: skip
    assert spend == ["0.0025", "0.0100", "0.0025", "20.0000", "0.0000", "policy, daily override"]
    (channel,) = table_rows(page, "imp-channels", keyed_by="data-channel")
    listed = channels[PIP_CHANNEL]
    assert (listed["mode"], listed["trusted"]) == ("mention", True)
    assert channel.cells == [PIP_CHANNEL, "mention", "yes", "discord", "guild", "", "not known yet"]
    (box,) = table_rows(page, "imp-boxes", keyed_by="data-host")
    assert box.cells == ["far-away (pid 4242)", "serve", "2", "docker", "runsc", "auto (the default)"]
    bo = console.get("/imps/bo").text
    assert day["state"] == "asleep" and day["slept_at"] == home.bo_slept.isoformat()
    assert "asleep" in bo and utc(home.bo_slept) in bo and utc(home.bo_night) in bo
    assert 'id="no-host"' in bo


def test_an_imp_s_own_page_refuses_what_is_not_an_imp(console: Console, home: Home) -> None:
    broken = console.get("/imps/bad")
    assert broken.status_code == 200 and "imp.toml cannot be loaded" in broken.text
    for path, line in (
        ("/imps/nobody", "no imp 'nobody' here: the imps are listed at /imps"),
        ("/imps/Not%20A%20Name", "invalid imp name 'Not A Name'"),
        ("/imps/..%2F..%2Fetc", "invalid imp name"),
        ("/imps/" + "x" * 300, "invalid imp name"),
    ):
        answer = console.get(path)
        assert answer.status_code == 404, (path, answer.status_code)
        assert answer.text.startswith(line) and answer.text.count("\n") == 1, answer.text
    assert console.get("/").url.endswith("/imps")  # / leads to the first page


def test_a_broken_policy_is_one_line_and_the_rest_is_shown(
    console: Console, home: Home, impyard_home: Path
) -> None:
    policies = impyard_home / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "broken.toml").write_text("[budgets.per_imp]\ndaily_usd = 'lots'\n")
    page = console.get("/imps")
    assert page.status_code == 200
    assert "the policy is broken:" in page.text and "broken.toml" in page.text
    rows = {row.attrs["data-imp"]: row for row in table_rows(page.text, "imps", keyed_by="data-imp")}
    assert rows["pip"].cells[4] == f"{PIP_CHANNEL} mention trusted"  # the rest of the page is still there


def test_with_no_imps_the_page_says_how_to_add_one(console: Console) -> None:
    page = console.get("/imps")
    assert page.status_code == 200 and "no imps yet" in page.text and "impyard imp add NAME" in page.text


@pytest.mark.slow
def test_in_a_browser_the_imps_page_leads_to_an_imp(console: Console, home: Home, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(console.login_url)
    assert browser.current_url == console.base + "/imps"
    pip = browser.find_element(By.CSS_SELECTOR, 'tr[data-imp="pip"]')
    assert "2 warm on far-away" in pip.text and "$0.0025 of $0.0100" in pip.text
    pip.find_element(By.LINK_TEXT, "pip").click()
    assert browser.current_url == console.base + "/imps/pip"
    assert PIP_CHANNEL in browser.find_element(By.ID, "imp-channels").text
    current = browser.find_element(By.CSS_SELECTOR, 'nav a[aria-current="page"]')
    assert current.text == "Imps"
