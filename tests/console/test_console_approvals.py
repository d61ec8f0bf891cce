"""Issue 34: the Approvals page — held posts with their text, target and deadline; Approve and Deny decided as the
host operator (``operator:<account>``, as ``impyard approvals approve``), exactly once even against a Discord
button pressed at the same moment, and the post delivered once by the host that serves Discord.

Through a real ``impyard console`` process; the race and the browser test beside a real ``impyard serve`` host in
this process (discord.py against the fake Discord, the box program in-process), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import getpass
import json
import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anyio
import pytest
import requests
from click.testing import CliRunner

from impyard.channels.store import ChannelInfo, ChannelStore
from impyard.cli import cli
from impyard.clock import SystemClock
from impyard.console.pages import PAGES
from impyard.gateway.audit import AuditLog
from impyard.gateway.gates import Approver, Gate, GateStore
from impyard.storage import urls as dburl
from impyard.storage.db import Database, open_database
from impyard.storage.tables import audit, gates
from testing.fake_discord import FakeInteraction
from testing.fake_openai import FakeOpenAI, envelope
from tests.console.conftest import Console, start_console, stop_console
from tests.discord_yard import ALICE, GENERAL, OLIVE, OWNERS, Yard, serving

OPERATOR = f"operator:{getpass.getuser()}"
HELD = 'first line of the held post\n<script>alert("held")</script> & second line'
ROUNDS = 4  # two in a fixed order (console first, then button first), then races


@pytest.fixture
def home_db() -> Iterator[Database]:
    db = open_database()
    yield db
    db.close()


def gate_store(db: Database) -> GateStore:
    clock = SystemClock()
    return GateStore(db, clock, AuditLog(db, clock))


def hold(db: Database, *, content: str = HELD, target: str = "1001", hours: float = 24, **extra: Any) -> Gate:
    """A post pip's box asked for, held by the policy (what the gateway stores when it gates a send)."""
    payload = {"channel_id": target, "content": content, **extra}
    return gate_store(db).open(
        imp="pip", run_id="run-1", session_channel="1001", origin_guild="1000", act="discord.send", target=target,
        payload=payload, reason="the channel is not trusted", deadline=timedelta(hours=hours),
    )  # fmt: skip


def show(gate_id: str) -> dict[str, Any]:
    """``impyard approvals show GATE --json``: what the CLI says of the gate."""
    result = CliRunner().invoke(cli, ["approvals", "show", gate_id, "--json"])
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown


def decide(console: Console, gate_id: str, decision: str, **fields: str) -> requests.Response:
    return console.post(
        "/approvals/decide", {"gate": gate_id, "decision": decision, **fields}, allow_redirects=False
    )


def outcome(console: Console, answer: requests.Response) -> str:
    """The one-line notice of the page the decision led back to."""
    assert answer.status_code == 303, (answer.status_code, answer.text)
    page = console.get(answer.headers["Location"])
    found = re.search(r'<p class="notice[^"]*" id="outcome" role="status">([^<]*)</p>', page.text)
    assert found is not None, page.text
    return found.group(1)


def pending_section(page: str, gate_id: str) -> str:
    found = re.search(rf'<section class="gate" id="{gate_id}".*?</section>', page, re.S)
    assert found is not None, page
    return found.group(0)


def decided_row(page: str, gate_id: str) -> str:
    found = re.search(rf'<tr data-gate="{gate_id}">.*?</tr>', page, re.S)
    assert found is not None, page
    return found.group(0)


# ----------------------------------------------------------------------------------------------- the page


def test_a_held_post_shows_its_text_target_deadline_and_deciders(console: Console, home_db: Database) -> None:
    ChannelStore(home_db, SystemClock()).upsert(ChannelInfo("1001", name="general", guild_id="1000"))
    gate = hold(home_db, files=[{"filename": "plan.txt", "data_b64": "aGk="}])
    elsewhere = hold(home_db, content="into a channel nobody spoke in", target="5002")
    page = console.get("/approvals")
    assert page.status_code == 200
    section = pending_section(page.text, gate.id)
    # The text, escaped, every line of it; never markup.
    assert (
        "first line of the held post\n&lt;script&gt;alert(&#34;held&#34;)&lt;/script&gt; &amp; second line"
        in section
    )
    assert "<script>alert" not in page.text
    assert "pip wants to post in #general (1001)" in section
    assert "the channel is not trusted" in section
    assert "the operator, owners of pip, admins of guild 1000" in section
    assert f"{gate.deadline:%Y-%m-%d %H:%M:%S} UTC" in section and re.search(r"23h5\dm left", section)
    assert "plan.txt" in section
    assert 'name="csrf"' in section and 'value="approve"' in section and 'value="deny"' in section
    other = pending_section(page.text, elsewhere.id)
    assert "wants to post in 5002" in other and "its conversation is in #general (1001)" in other
    assert "no guild admin" in other
    assert f"You decide as <strong>{OPERATOR}</strong>" in page.text
    assert "no gate decided yet" in page.text


def test_a_gate_past_its_deadline_is_expired_first_as_approvals_ls_does(
    console: Console, home_db: Database
) -> None:
    late = hold(home_db, hours=-1)
    page = console.get("/approvals").text
    assert f'<section class="gate" id="{late.id}"' not in page and "no pending gates" in page
    assert ">expired<" in decided_row(page, late.id) and "its deadline" in decided_row(page, late.id)
    assert show(late.id)["state"] == "expired"
    refused = outcome(console, decide(console, late.id, "approve"))
    assert refused.startswith(f"{late.id} already expired at ") and "can no longer be decided" in refused


def test_an_unreadable_payload_is_marked_and_the_rest_still_shows(
    console: Console, home_db: Database
) -> None:
    broken, fine = hold(home_db), hold(home_db, content="a post that reads fine")
    home_db.write(
        lambda conn: conn.execute(
            gates.update().where(gates.c.id == broken.id).values(payload='{"channel_id": "1001", "files": 7}')
        )
    )
    page = console.get("/approvals")
    assert page.status_code == 200
    assert "its frozen payload is not a post this host can read" in pending_section(page.text, broken.id)
    assert "a post that reads fine" in pending_section(page.text, fine.id)


# ----------------------------------------------------------------------------------------------- deciding


def test_approve_records_the_operator_and_the_cli_agrees(console: Console, home_db: Database) -> None:
    ChannelStore(home_db, SystemClock()).upsert(ChannelInfo("1001", name="general", guild_id="1000"))
    gate = hold(home_db)
    line = outcome(console, decide(console, gate.id, "approve", note="fine to post"))
    assert line == f"approved {gate.id}; the running impyard host sends it exactly once"
    shown = show(gate.id)
    assert shown["state"] == "approved" and shown["decided_by"] == OPERATOR
    assert shown["decision_note"] == "fine to post"
    page = console.get("/approvals").text
    assert f'<section class="gate" id="{gate.id}"' not in page  # no longer offered
    row = decided_row(page, gate.id)
    assert ">approved<" in row and OPERATOR in row and "fine to post" in row
    assert (
        "waiting for the running impyard serve host" in row
    )  # the console sends nothing: Discord's host does
    assert "#general (1001)" in row
    described = CliRunner().invoke(cli, ["approvals", "show", gate.id])
    assert f"decided   by {OPERATOR}: fine to post" in described.output
    verdicts = home_db.read(
        lambda conn: [
            (r.verdict, r.reason)
            for r in conn.execute(audit.select().where(audit.c.gate_id == gate.id).order_by(audit.c.id))
        ]
    )
    assert verdicts == [("approved", "fine to post")]


def test_deny_records_the_operator_and_the_cli_agrees(console: Console, home_db: Database) -> None:
    gate = hold(home_db)
    line = outcome(console, decide(console, gate.id, "deny"))
    assert line == f"denied {gate.id}; it will not be sent"
    shown = show(gate.id)
    assert shown["state"] == "denied" and shown["decided_by"] == OPERATOR and shown["decision_note"] is None
    fragment = console.get("/approvals/decided").text  # the live list alone, no layout
    row = decided_row(fragment, gate.id)
    assert ">denied<" in row and OPERATOR in row and "<nav>" not in fragment
    assert "waiting for" not in row  # a denial waits for nobody


def test_a_gate_someone_else_decided_first_says_who_and_when(console: Console, home_db: Database) -> None:
    gate = hold(home_db)
    first = gate_store(home_db).decide(
        gate.id, Approver("user", "discord:2009"), approve=True, owners=("discord:2009",)
    )
    line = outcome(console, decide(console, gate.id, "deny", note="too late"))
    assert (
        line
        == f"{gate.id} was already approved by user:discord:2009 at {first.decided_at:%Y-%m-%d %H:%M:%S} UTC"
    )
    shown = show(gate.id)
    assert shown["state"] == "approved" and shown["decided_by"] == "user:discord:2009"
    assert shown["decision_note"] is None  # the late note was not taken


def test_a_crafted_outcome_address_shows_what_the_store_says(console: Console, home_db: Database) -> None:
    gate = hold(home_db)
    gate_store(home_db).decide(
        gate.id, Approver("user", "discord:2009"), approve=False, owners=("discord:2009",)
    )
    page = console.get(f"/approvals?gate={gate.id}&outcome=decided").text
    assert f"{gate.id} was already denied by user:discord:2009" in page and f"approved {gate.id}" not in page
    quiet = console.get("/approvals?gate=<b>nope</b>&outcome=decided").text
    assert 'id="outcome"' not in quiet and "<b>nope" not in quiet


@pytest.mark.parametrize(
    ("fields", "status", "says"),
    [
        ({"gate": "../../etc/passwd", "decision": "approve"}, 400, "'../../etc/passwd' is not a gate id"),
        ({"gate": "g-XYZ", "decision": "approve"}, 400, "is not a gate id"),
        ({"gate": "g-" + "a" * 200, "decision": "approve"}, 400, "is not a gate id"),
        ({"decision": "approve"}, 400, "'' is not a gate id"),
        ({"gate": "g-000000000000", "decision": "approve"}, 404, "no gate g-000000000000"),
        ({"gate": "{held}", "decision": "maybe"}, 400, "the decision must be approve or deny"),
        (
            {"gate": "{held}", "decision": "approve", "note": "x" * 501},
            400,
            "at most 500 printable characters",
        ),
        ({"gate": "{held}", "decision": "approve", "note": "a\x1b[2Jb"}, 400, "one line"),
    ],
    ids=["path", "not-hex", "too-long", "missing", "unknown", "decision", "long-note", "control-chars"],
)
def test_a_bad_form_is_one_line_and_changes_nothing(
    console: Console, home_db: Database, fields: dict[str, str], status: int, says: str
) -> None:
    gate = hold(home_db)
    form = {name: value.replace("{held}", gate.id) for name, value in fields.items()}
    answer = console.post("/approvals/decide", form, allow_redirects=False)
    assert answer.status_code == status and says in answer.text
    assert answer.text.count("\n") == 1 and "Traceback" not in answer.text
    assert show(gate.id)["state"] == "pending"


def test_no_csrf_token_no_decision(console: Console, home_db: Database) -> None:
    gate = hold(home_db)
    form = {"gate": gate.id, "decision": "approve"}
    bare = console.session.post(console.base + "/approvals/decide", data=form, timeout=30)
    assert bare.status_code == 403 and "CSRF" in bare.text
    forged = console.session.post(
        console.base + "/approvals/decide", data={**form, "csrf": "0" * 64}, timeout=30
    )
    assert forged.status_code == 403
    elsewhere = console.post("/approvals/decide", form, headers={"Origin": "http://evil.example"})
    assert elsewhere.status_code == 403
    stranger = requests.post(
        console.base + "/approvals/decide", data={**form, "csrf": console.csrf}, timeout=30
    )
    assert stranger.status_code == 401  # the CSRF token alone is no login
    assert console.get("/approvals/decide").status_code == 405  # a GET never decides
    assert show(gate.id)["state"] == "pending"


# ----------------------------------------------------------------------------------------------- exactly once


def posted_replies(yard: Yard, text: str) -> list[Any]:
    return [m for m in yard.fake.messages(GENERAL) if m.content == text]


async def held_reply(yard: Yard, model: FakeOpenAI, text: str) -> tuple[Any, str]:
    """pip answers in an untrusted channel: the reply is held; its card is posted to the owners' channel."""
    model.clear_rules()
    model.script(envelope(answer=text, answer_needed=True))
    asked = yard.fake.post_message(GENERAL, ALICE, f"pip, say {text}")
    await yard.answered(asked.id)
    (gate,) = [g for g in yard.rt.gateway.gates.latest(("pending",)) if g.send.content == text]
    card = await yard.fake.wait_for(
        lambda: next((m for m in yard.fake.messages(OWNERS) if gate.id in m.content), None)
    )
    return card, gate.id


async def click_answer(yard: Yard, click: FakeInteraction) -> Any:
    """What the click came to: the card edited (it decided), or an ephemeral line (it was too late)."""
    responses = await yard.fake.wait_for(lambda: len(r := yard.fake.interaction_responses(click)) >= 2 and r)
    return responses[-1]


async def approve_both(yard: Yard, console: Console, card: Any, gate_id: str, order: str) -> tuple[Any, Any]:
    """The console's Approve and OLIVE's Approve button on the card: one after the other, or released together."""
    answers: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def by_console() -> None:
        if order == "race":
            barrier.wait(30)
        answers["console"] = decide(console, gate_id, "approve")

    def by_button() -> None:
        if order == "race":
            barrier.wait(30)
        answers["click"] = yard.fake.click_button(card.id, f"impyard:gate:{gate_id}:approve", user=OLIVE)

    if order == "race":
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.to_thread.run_sync, by_console)
            group.start_soon(anyio.to_thread.run_sync, by_button)
    else:
        first, second = (by_console, by_button) if order == "console first" else (by_button, by_console)
        await anyio.to_thread.run_sync(first)
        if first is by_button:
            await click_answer(yard, answers["click"])
        await anyio.to_thread.run_sync(second)
    line = await anyio.to_thread.run_sync(outcome, console, answers["console"])
    return line, await click_answer(yard, answers["click"])


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.anyio
async def test_the_console_and_a_discord_button_at_once_decide_once_and_post_once(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, request: pytest.FixtureRequest, database: str
) -> None:
    if database == "postgresql":  # the console process and the serve host share one PostgreSQL database
        monkeypatch.setenv(dburl.ENV, request.getfixturevalue("migrated_postgres_url"))
    winners = []
    async with serving(monkeypatch, model, answer=None, trusted=()) as yard:
        console = await anyio.to_thread.run_sync(start_console)
        try:
            assert (
                await anyio.to_thread.run_sync(console.get, "/?token=" + console.token)
            ).status_code == 200
            for n in range(ROUNDS):
                text = f"held reply number {n}"
                card, gate_id = await held_reply(yard, model, text)
                order = ("console first", "button first")[n] if n < 2 else "race"
                line, clicked = await approve_both(yard, console, card, gate_id, order)
                await (
                    yard.rt.host.pump.run_once()
                )  # the serve host's gate pump sends what the console approved
                (reply,) = await yard.fake.wait_for(lambda: posted_replies(yard, text))  # noqa: B023 - awaited here
                await yard.rt.host.pump.run_once()  # another pass: still once
                gate = yard.rt.gateway.gates.get(gate_id)
                assert gate.state == "executed" and gate.message_ids == [str(reply.id)], (order, gate)
                assert len(posted_replies(yard, text)) == 1, order
                when = f"{gate.decided_at:%Y-%m-%d %H:%M:%S} UTC"
                if gate.decided_by == OPERATOR:  # the console won: the button was told so
                    assert line == f"approved {gate_id}; the running impyard host sends it exactly once", (
                        order
                    )
                    assert clicked.ephemeral and clicked.content.startswith(
                        f"Nothing was changed: gate {gate_id} was already approved by {OPERATOR} at {when}"
                    ), (order, clicked.content)
                else:  # the button won: the console was told who and when
                    assert gate.decided_by == f"user:discord:{OLIVE.id}", (order, gate)
                    assert line.startswith(
                        f"{gate_id} was already approved by user:discord:{OLIVE.id} at {when}"
                    )
                    assert clicked.kind == "edit_original", order
                winners.append((order, gate.decided_by))
                approvals = [
                    r.verdict
                    for r in yard.rt.gateway.audit.tail(50, imp="pip")
                    if r.gate_id == gate_id and r.method == "gate"
                ]
                assert sorted(approvals) == ["approved", "executed", "executing"], (order, approvals)
                page = (await anyio.to_thread.run_sync(console.get, "/approvals")).text
                assert f"message {reply.id} at" in decided_row(page, gate_id)
        finally:
            await anyio.to_thread.run_sync(stop_console, console)
    assert winners[0] == ("console first", OPERATOR)
    assert winners[1] == ("button first", f"user:discord:{OLIVE.id}")
    assert [m.content for m in yard.fake.messages(GENERAL)] == [
        f"held reply number {n}" for n in range(ROUNDS)
    ]


# ----------------------------------------------------------------------------------------------- in a browser


@pytest.mark.slow
@pytest.mark.anyio
async def test_in_a_browser_approve_a_held_post_and_see_it_delivered_once(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI, browser: Any
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    text = "a held post\nwith <b>two</b> lines"
    async with serving(monkeypatch, model, answer=None, trusted=()) as yard:
        console = await anyio.to_thread.run_sync(start_console)
        try:
            _, gate_id = await held_reply(yard, model, text)

            def approve_in_the_browser() -> tuple[str, str, str]:
                browser.get(console.login_url)
                assert browser.current_url == console.base + PAGES[0].path
                browser.get(console.base + "/approvals")
                held = browser.find_element(By.ID, gate_id)
                shown = held.find_element(By.CSS_SELECTOR, "pre.content").text
                held.find_element(By.NAME, "note").send_keys("looks fine")
                held.find_element(By.CSS_SELECTOR, "button.approve").click()
                WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.ID, "outcome"))
                notice = browser.find_element(By.ID, "outcome").text
                return shown, notice, browser.current_url

            shown, notice, address = await anyio.to_thread.run_sync(approve_in_the_browser)
            await yard.rt.host.pump.run_once()  # the serve host sends it
            (reply,) = await yard.fake.wait_for(lambda: posted_replies(yard, text))

            def decided_in_the_browser() -> str:
                row = f'#decided-gates tr[data-gate="{gate_id}"]'  # the live list catches up by itself

                def executed(b: Any) -> str | None:
                    text = "".join(e.text for e in b.find_elements(By.CSS_SELECTOR, row))
                    return text if "executed" in text else None

                # the list is replaced on each refresh: a row that went as it was read is read again
                wait = WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,))
                return str(wait.until(executed))

            row = await anyio.to_thread.run_sync(decided_in_the_browser)
            await yard.rt.host.pump.run_once()
            gate = yard.rt.gateway.gates.get(gate_id)
        finally:
            await anyio.to_thread.run_sync(stop_console, console)
    assert shown == text  # the text as written, markup shown as text
    assert notice == f"approved {gate_id}; the running impyard host sends it exactly once"
    assert "token" not in address and "outcome=decided" in address
    assert OPERATOR in row and "looks fine" in row and f"message {reply.id}" in row
    assert gate.state == "executed" and gate.decided_by == OPERATOR and gate.message_ids == [str(reply.id)]
    assert len(posted_replies(yard, text)) == 1
