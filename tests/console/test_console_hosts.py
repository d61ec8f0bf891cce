"""Issue 34, the Hosts page: ``impyard hosts``'s rows (``impyard.storage.cluster``) in a real ``impyard console`` —
hosts, shards, terminal channels and task runs, with a holder that stopped renewing marked ``expired`` and one of
this machine that is gone marked ``dead``, exactly as ``impyard hosts --json`` says.

The leases are real rows taken through ``LeaseStore`` as each holder would take them: a serving host on another
machine, one that stopped renewing an hour ago, and a chat of this machine whose process is gone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import requests
from click.testing import CliRunner

from impyard.cli import cli
from impyard.clock import FixedClock, SystemClock
from impyard.discord.shards import Shard
from impyard.storage import leases as leases_module
from impyard.storage.db import open_database
from impyard.storage.leases import HostCard, ImpBoxes, LeaseStore
from impyard.storage.liveness import Holder, this_process
from testing.fake_openai import FakeOpenAI
from tests.console.conftest import CLI, Console, settled
from tests.console.page_rows import table_rows
from tests.discord_yard import ALICE, GENERAL, serving

FAR = Holder("far-away", "b00t", 4242, "9")  # a serving host on another machine: its lease decides
GONE = Holder("elsewhere", "f00d", 777, "3")  # another machine's host that stopped renewing an hour ago
START_S = 60
LIVE = timedelta(hours=1)  # a live lease outlives the test however slow the machine is


def gone_pid() -> int:
    """The pid of a process of this machine that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    return int(done.stdout)


@pytest.fixture
def cluster(impyard_home: Path) -> Iterator[Holder]:
    """The leases of three hosts; returns the dead one's holder."""
    me = this_process()
    dead = Holder(me.host, me.boot, gone_pid(), "1")
    hour_ago = FixedClock(SystemClock().now() - timedelta(hours=1))
    db = open_database()
    try:
        far = LeaseStore(db, me=FAR)
        far.acquire("shard:0/2", ttl=LIVE)
        far.acquire("task:t-1/r-1", ttl=LIVE)
        far.acquire("host:far-away/4242", HostCard("serve", "/srv/yard", "0/2", warm_boxes=lambda: 2,
                    boxes=lambda: [ImpBoxes("pip", 2, "docker", "runsc", "auto (the default)")]).detail(), LIVE)  # fmt: skip
        stopped = LeaseStore(db, hour_ago, me=GONE)
        stopped.acquire("shard:1/2")
        stopped.acquire("host:elsewhere/777", HostCard("serve", "/srv/old", "1/2").detail())
        died = LeaseStore(db, me=dead, alive=lambda holder: True)  # it lived when it took them
        died.acquire("channel:terminal:ann", ttl=LIVE)
        died.acquire(f"host:{dead.host}/{dead.pid}", HostCard("chat", "/home/ann/yard").detail(), LIVE)
    finally:
        db.close()
    yield dead


def hosts_json() -> dict[str, list[dict[str, Any]]]:
    done = subprocess.run([*CLI, "hosts", "--json"], capture_output=True, text=True, timeout=60, check=True)
    found: dict[str, list[dict[str, Any]]] = json.loads(done.stdout)
    return found


def test_the_hosts_page_marks_holders_that_stopped_renewing_as_the_cli_does(
    console: Console, cluster: Holder
) -> None:
    page = console.get("/hosts")
    assert page.status_code == 200
    hosts = table_rows(page.text, "hosts", keyed_by="data-lease")
    leases = table_rows(page.text, "leases", keyed_by="data-lease")
    dead = f"host:{cluster.host}/{cluster.pid}"
    assert sorted((row.attrs["data-lease"], row.attrs["data-state"]) for row in hosts) == sorted(
        [("host:far-away/4242", "held"), ("host:elsewhere/777", "expired"), (dead, "dead")]
    )
    assert [(row.attrs["data-lease"], row.attrs["data-state"]) for row in leases] == [
        ("channel:terminal:ann", "dead"),  # its holder is a process of this machine that is gone
        ("shard:0/2", "held"),
        ("shard:1/2", "expired"),  # its holder stopped renewing an hour ago
        ("task:t-1/r-1", "held"),
    ]
    far = next(row.cells for row in hosts if row.attrs["data-lease"] == "host:far-away/4242")
    assert far[:8] == ["far-away", "4242", "serve", "0/2", "2", "-", "shard:0/2, task:t-1/r-1", "/srv/yard"]
    assert far[-1] == "held" and re.fullmatch(r"in (1h|59m(\d+s)?|5\dm(\d+s)?)", far[-2]), far
    assert [row.cells[1] for row in leases] == ["channel", "shard", "shard", "task"]
    assert 'class="badge state-expired"' in page.text and 'class="badge state-dead"' in page.text

    # the same rows and states as `impyard hosts --json`, field by field
    listed = hosts_json()
    shown_hosts = {(row.cells[0], row.cells[1]): row for row in hosts}
    assert len(listed["hosts"]) == len(shown_hosts) == 3
    for host in listed["hosts"]:
        cells = shown_hosts[(host["host"], str(host["pid"]))].cells
        expected = [host["host"], str(host["pid"]), host["command"], host["shard"] or "-",
                    "?" if host["warm_boxes"] is None else str(host["warm_boxes"]), "-",
                    ", ".join(host["holds"]) or "-", host["home"]]  # fmt: skip
        assert cells[:8] == expected and cells[-1] == host["state"]
    assert [(lease["name"], lease["host"], str(lease["pid"]), str(lease["token"]), lease["state"])
            for lease in listed["leases"]] == [
        (row.cells[0], row.cells[2], row.cells[3], row.cells[4], row.cells[-1]) for row in leases
    ]  # fmt: skip


def test_the_tables_refresh_from_a_fragment_behind_the_login(console: Console, cluster: Holder) -> None:
    page = console.get("/hosts")
    assert 'data-refresh-url="/hosts/fragment"' in page.text
    part = console.get("/hosts/fragment")
    assert part.status_code == 200 and "<html" not in part.text
    assert [row.attrs["data-state"] for row in table_rows(part.text, "leases", keyed_by="data-lease")] == [
        "dead", "held", "expired", "held",
    ]  # fmt: skip
    stranger = requests.get(console.base + "/hosts/fragment", timeout=30)
    assert stranger.status_code == 401 and "far-away" not in stranger.text


def test_with_no_hosts_the_page_says_who_registers(console: Console) -> None:
    page = console.get("/hosts")
    assert page.status_code == 200 and 'id="no-hosts"' in page.text
    assert "each <code>impyard serve</code> and <code>impyard chat</code> registers itself" in page.text


@pytest.mark.anyio
async def test_a_serving_host_says_which_imps_it_serves_and_their_warm_boxes(
    console: Console, monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    """A real ``serve`` host's record names pip's warm box as soon as it opens (``HostCard.boxes``): the CLI's
    ``--json`` and both console pages show it."""
    monkeypatch.setattr(leases_module, "RENEW_EVERY", timedelta(hours=1))
    monkeypatch.setattr(leases_module, "DEFAULT_TTL", timedelta(hours=2))
    monkeypatch.setenv("OPENAI_API_KEY", str(model.api_key))
    monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
    me = this_process()

    def pip_boxes() -> list[dict[str, Any]]:
        result = CliRunner().invoke(cli, ["hosts", "--json"])
        assert result.exit_code == 0, result.output
        (host,) = json.loads(result.output)["hosts"]
        return [box for box in host.get("boxes", []) if box["imp"] == "pip"]

    async def until(warm: int) -> None:
        expected = [
            {"imp": "pip", "warm": warm, "backend": "in-process", "runtime": None, "runtime_setting": None}
        ]
        with anyio.fail_after(START_S):
            while pip_boxes() != expected:
                await anyio.sleep(0.05)

    async with serving(monkeypatch, model, shard=Shard(0, 1)) as yard:
        await until(0)  # served, no box yet
        yard.fake.post_message(GENERAL, ALICE, "hello pip")
        await yard.posted(GENERAL)
        await until(1)
        row = next(r for r in table_rows(console.get("/imps").text, "imps", keyed_by="data-imp"))
        assert row.cells[3] == f"1 warm on {me.host} (serve, pid {os.getpid()}) · in-process"
        (box,) = table_rows(console.get("/imps/pip").text, "imp-boxes", keyed_by="data-host")
        assert box.cells == [f"{me.host} (pid {os.getpid()})", "serve", "1", "in-process", "-", "-"]


@pytest.mark.slow
def test_in_a_browser_a_stopped_host_is_marked(console: Console, cluster: Holder, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(console.login_url)
    browser.find_element(By.LINK_TEXT, "Hosts").click()
    assert browser.current_url == console.base + "/hosts"

    def stopped_row(b: Any) -> tuple[str, str, str]:
        stopped = b.find_element(By.CSS_SELECTOR, 'tr[data-lease="shard:1/2"]')
        badge = stopped.find_element(By.CSS_SELECTOR, ".badge")
        return stopped.text, stopped.get_attribute("class") or "", badge.value_of_css_property("color")

    text, classes, color = settled(browser, stopped_row)  # the live list may be replaced as it is read
    assert text.endswith("expired") and "stopped" in classes
    assert color == "rgba(201, 42, 42, 1)"  # --bad: the stylesheet loaded
    live = browser.find_element(By.ID, "hosts-live")
    assert live.get_attribute("data-refresh-url") == "/hosts/fragment"
