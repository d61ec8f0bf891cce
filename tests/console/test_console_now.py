"""Issue 34, the Now page: what every host on the home's database is doing now, live, in the console's process.

Over HTTP: a host's published turn (its stage, the messages queued behind it), its warm boxes, a task run and the
newest outcomes show on ``/now`` and its fragment; a host whose lease expired shows nothing; no message text ever.
In a real browser: a real ``impyard chat`` turn held in flight (the fake model holds its reply) appears on the open
page with its stage without a reload, then leaves it for the recent outcomes. With ``IMPYARD_CONSOLE_SCREENSHOTS=<dir>``
it saves the page, the turn in flight, as ``now.png`` (docs/console.md's picture).
"""

from __future__ import annotations

import getpass
import io
import os
import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pexpect
import pytest
import requests

from box.protocol.models import Author, Message
from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.clock import FixedClock, SystemClock
from impyard.conversation.activity import put_activity, snapshot_text
from impyard.conversation.history import History
from impyard.conversation.sessions import SessionActivity
from impyard.imps.store import ImpStore
from impyard.storage.db import open_database
from impyard.storage.leases import LeaseStore, host_lease_name, task_lease_name
from impyard.storage.liveness import Holder
from impyard.tasks.request import TaskRequest
from impyard.tasks.store import TaskStore
from testing.fake_openai import FakeOpenAI, RecordedRequest, envelope
from tests.console.conftest import Console
from tests.console.test_console_tour import SCREENSHOTS_ENV
from tests.test_chat_terminal import spawn_chat

FAR = Holder("yard-far", "b00t", 4242, "9")  # a host of another machine, alive while its lease is
GONE = Holder("yard-gone", "b00t", 777, "3")  # one that stopped renewing a minute ago
SECRET_TEXT = "the words ann said in #general"
WAIT_S = 40


def session(channel: str, **changes: Any) -> SessionActivity:
    now = datetime.now(UTC)
    fields: dict[str, Any] = {
        "warm": True, "in_turn": 1, "stage": "post", "turn_since": now - timedelta(seconds=65),
        "stage_since": now - timedelta(seconds=2), "waiting": 3,
    }  # fmt: skip
    fields.update(changes)
    return SessionActivity("pip", channel, **fields)


def publish_hosts() -> str:
    """FAR runs a turn in #general (remembering, 3 queued) and keeps a warm box in a DM; GONE's lease expired; a task
    run of FAR's is under way; one turn ended. Returns the task's id."""
    db = open_database()
    try:
        clock = SystemClock()
        channels = ChannelStore(db, clock)
        channels.upsert(ChannelInfo("1001", kind="guild", name="general", guild_id="1000"))
        channels.upsert(ChannelInfo("1100", kind="dm", name="DM with carol"))
        history = History(db, clock)
        history.record(
            "1001",
            Message(
                id="m1", author=Author(id="2001", name="ann"), content=SECRET_TEXT, created_at=clock.now()
            ),
        )
        history.record_wake("pip", "1001", "m1")
        history.finish("pip", "1001", ["m1"], "failed", "the model server refused: 503\nsecond line")
        far = LeaseStore(db, clock, me=FAR)
        far.acquire(host_lease_name(FAR), {"command": "serve", "shard": "0/2"}, timedelta(hours=1))
        put_activity(
            db, host_lease_name(FAR), FAR,
            snapshot_text([session("1001"), session("1100", in_turn=0, stage=None, waiting=0)]), clock.now(),
        )  # fmt: skip
        past = FixedClock(clock.now() - timedelta(minutes=1))
        LeaseStore(db, past, me=GONE).acquire(
            host_lease_name(GONE), {"command": "chat"}, timedelta(seconds=30)
        )
        put_activity(
            db, host_lease_name(GONE), GONE, snapshot_text([session("1002", stage="tools")]), past.now()
        )
        ImpStore().add("pip")
        tasks = TaskStore(db, clock)
        task = tasks.add(TaskRequest(imp="pip", prompt="water the plants"))
        assert tasks.claim(task.id, "r-1", "process") is not None
        far.acquire(task_lease_name(task.id, "r-1"), ttl=timedelta(hours=1))
        return task.id
    finally:
        db.close()


def test_now_shows_each_live_hosts_turns_queue_boxes_tasks_and_outcomes(console: Console) -> None:
    task_id = publish_hosts()
    page = console.get("/now")
    assert page.status_code == 200
    part = console.get("/now/fragment")
    assert (
        part.status_code == 200 and "<html" not in part.text and "<nav" not in part.text
    )  # the content alone
    for html in (page.text, part.text):
        assert '<tr data-imp="pip" data-channel-id="1001" data-stage="remembering">' in html
        assert "<td>pip</td><td>#general</td><td>discord</td>" in html
        assert 'title="the box\'s stage: post">remembering</span>' in html
        assert re.search(r'<td class="num">\d+s</td><td class="num">1m\d+s</td>', html)  # in stage, in turn
        assert '<td class="num">1</td><td class="num">3</td>' in html  # its messages, and 3 queued behind it
        assert "<td>pip</td><td>DM with carol</td><td>discord</td>" in html  # the warm box, idle
        assert f'<tr data-task="{task_id}">' in html
        assert '<tr data-imp="pip" data-channel-id="1001" data-outcome="failed">' in html
        assert "<td>the model server refused: 503</td>" in html and "second line" not in html
        assert "yard-far · serve 0/2 · pid 4242" in html
        assert "yard-gone" not in html and "1002" not in html  # its lease expired: nothing of it is live
        assert SECRET_TEXT not in html  # never a message's text
    assert 'data-refresh-url="/now/fragment"' in page.text  # the page polls its fragment: live
    assert "data-refresh-url" not in part.text
    for path in ("/now", "/now/fragment"):
        stranger = requests.get(console.base + path, timeout=30)
        assert stranger.status_code == 401 and "yard-far" not in stranger.text


def test_now_on_a_home_where_nothing_runs_says_so(console: Console) -> None:
    html = console.get("/now/fragment").text
    assert "no host is running on this database" in html
    assert 'id="now-no-turns"' in html and "each <code>impyard chat</code>" in html
    assert "no turn has ended yet" in html
    assert '<a href="/now" aria-current="page">Now</a>' in console.get("/now").text  # in the navigation


# ---------------------------------------------------------------- in a real browser, a real chat


class HeldReply:
    """The fake model's reply call waits until ``released``: the chat's turn stays in flight, thinking."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.asked = threading.Event()

    def __call__(self, request: RecordedRequest) -> Any:
        self.asked.set()
        self.released.wait(WAIT_S)
        return envelope(answer="Held, then said.", answer_needed=True)


@pytest.mark.slow
def test_a_turn_held_in_flight_appears_live_then_moves_to_the_outcomes(
    console: Console, fake: FakeOpenAI, impyard_home: Path, browser: Any
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    held = HeldReply()
    fake.script(held, purpose="reply")
    browser.get(console.login_url)
    browser.get(console.base + "/now")  # opened before the turn: what follows comes by the page's own polling
    assert browser.find_elements(By.ID, "now-no-turns")
    # The page replaces its lists on each refresh: an element that went as it was read is read again.
    wait = WebDriverWait(
        browser, WAIT_S, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    )
    chat = spawn_chat(fake, impyard_home, "--backend", "process")
    chat.logfile_read = io.StringIO()
    try:
        chat.expect("you> ")
        chat.sendline("hello pip, are you there?")
        cells = wait.until(
            lambda d: [
                [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
                for row in d.find_elements(
                    By.CSS_SELECTOR, "#now-turns tr[data-imp='pip'][data-stage='thinking']"
                )
            ]
        )[0]
        assert cells[:4] == ["pip", f"terminal ({chat_user()})", "terminal", "thinking"], cells
        assert "hello pip" not in browser.find_element(By.ID, "now").text  # never the message's text
        assert held.asked.is_set()
        shots = os.environ.get(SCREENSHOTS_ENV)
        if shots:  # docs/console.md's picture of Now: a turn in flight
            Path(shots).mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(Path(shots) / "now.png"))
        held.released.set()
        chat.expect("pip> Held, then said.")
        outcome = wait.until(
            lambda d: [
                row.text
                for row in d.find_elements(
                    By.CSS_SELECTOR, "#now-recent tr[data-imp='pip'][data-outcome='sent']"
                )
            ]
        )[0]
        assert f"terminal ({chat_user()})" in outcome
        wait.until(lambda d: d.find_elements(By.ID, "now-no-turns"))  # the turn left the turns in flight
        assert browser.find_elements(
            By.CSS_SELECTOR, "#now-sessions tr[data-imp='pip']"
        )  # its box stays warm
        chat.sendline("/quit")
        chat.expect(pexpect.EOF)
    finally:
        held.released.set()
        chat.close(force=True)
    wait.until(lambda d: "no host is running on this database" in d.find_element(By.ID, "now").text)


def chat_user() -> str:
    return getpass.getuser()
