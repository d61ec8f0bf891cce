"""Issue 34, Memory: one imp and one scope at a time — its records with their episodes and felt strength, what it
holds in mind, its rules, a search, its day — and Forget (a record; everything about a person), each confirmed
first and posted with the CSRF token, agreeing with ``impyard memory show``. Through a real ``impyard console``
process, memories kept through the real store as a box keeps them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from click.testing import CliRunner
from sqlalchemy import update

from impyard.cli import cli
from impyard.clock import SystemClock, iso
from impyard.imps.store import ImpStore
from impyard.memory import wakefulness
from impyard.memory.store import MemoryStore
from impyard.memory.wakefulness import Wakefulness, reflect_request, sleep_request
from impyard.storage.db import open_database
from impyard.storage.tables import tasks as task_rows
from impyard.tasks import TaskStore
from testing.fake_openai import FakeOpenAI
from tests.console.conftest import Console, start_console, stop_console
from tests.memory.test_cli_memory import CAROL_ID, DAVE_ID, GUILD, hashing_imp, lived, said_in_history

DM = f"dm:{CAROL_ID}"
OTHER_GUILD = "guild:2000"


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    db = open_database()
    yield MemoryStore(db, SystemClock().now)
    db.close()


def shown(*args: str) -> list[dict[str, Any]]:
    """``impyard memory show pip`` (every scope) as the CLI answers it."""
    result = CliRunner().invoke(cli, ["memory", "show", "pip", "-n", "1000", "--json", *args])
    assert result.exit_code == 0, result.output
    return list(json.loads(result.output))


def text_of(html: str) -> str:
    """The page's text, tags dropped and whitespace folded (what a person reads)."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def section(html: str, element_id: str) -> str:
    """The element with ``element_id`` (up to its closing tag of the same name), or "" when absent."""
    match = re.search(rf'<(\w+)[^>]*\bid="{element_id}"', html)
    if match is None:
        return ""
    tag = match.group(1)
    end = html.find(f"</{tag}>", match.start())
    return html[match.start() : end if end >= 0 else len(html)]


def page(console: Console, **query: str) -> str:
    answer = console.get("/memory?" + urlencode({"imp": "pip", **query}))
    assert answer.status_code == 200, answer.text
    return answer.text


@pytest.fixture
def seeded(store: MemoryStore) -> dict[str, str]:
    """pip remembers in three scopes; carol speaks in two of them and is named in a third record."""
    hashing_imp()
    said_in_history("carol", CAROL_ID, "m0")
    return {
        "picnic": lived(store, author="carol", author_id=CAROL_ID, conclusion="We planned a picnic by the lake.",
                        said="carol said: shall we picnic by the lake?", message_id="m1"),
        "secret": lived(store, author="carol", author_id=CAROL_ID, conclusion="She trusts me with a secret.",
                        said="carol said: don't tell anyone", message_id="m2", scope=DM, channel="1100"),
        "late": lived(store, author="dave", author_id=DAVE_ID, conclusion="Dave thinks carol is late again.",
                      said="dave said: carol is late", message_id="m3"),
        "jazz": lived(store, author="dave", author_id=DAVE_ID, conclusion="Dave likes jazz records.",
                      said="dave said: jazz!", message_id="m4"),
        "boats": lived(store, author="erin", author_id="2005", conclusion="Erin sails small boats by the lake.",
                       said="erin said: boats on the lake", message_id="m5", scope=OTHER_GUILD, channel="2001"),
    }  # fmt: skip


# ------------------------------------------------------------------ what it remembers, one scope at a time


def test_the_imp_and_then_its_scopes_are_chosen_before_anything_is_shown(
    console: Console, seeded: dict[str, str]
) -> None:
    chooser = console.get("/memory")
    assert chooser.status_code == 200 and 'href="/memory?imp=pip"' in chooser.text
    imp = page(console)
    scopes = text_of(section(imp, "scopes"))
    assert f"{GUILD} 3 " in scopes and f"{DM} 1 " in scopes and f"{OTHER_GUILD} 1 " in scopes
    for words in ("picnic", "secret", "jazz", "boats"):  # no record before a scope is chosen
        assert words not in imp


def test_a_scope_shows_its_records_with_episodes_and_felt_strength_and_nothing_of_another(
    console: Console, seeded: dict[str, str], store: MemoryStore
) -> None:
    before = {v.id: f"{v.felt:.2f}" for v in store.show("pip", scope=GUILD)}
    html = page(console, scope=GUILD)
    after = {v.id: f"{v.felt:.2f}" for v in store.show("pip", scope=GUILD)}
    records = section(html, "records")
    rows = re.findall(r'<tr data-record-id="(\w+)">(.*?)</tr>', records, re.S)
    assert [record_id for record_id, _ in rows] == [seeded["jazz"], seeded["late"], seeded["picnic"]]
    for record_id, row in rows:
        felt = re.findall(r'<td class="num">([0-9.]+)', row)[0]
        assert felt in (
            before[record_id],
            after[record_id],
        )  # the store's felt strength, not the console's own
    picnic = text_of(dict(rows)[seeded["picnic"]])
    assert (
        "We planned a picnic by the lake." in picnic and "carol said: shall we picnic by the lake?" in picnic
    )
    assert "1 episode" in picnic and "glad" in picnic and "+0.50/0.60" in picnic
    # Scopes are privacy boundaries: the DM's and the other server's memories never show here.
    assert "secret" not in html and "don't tell" not in html and "boats" not in html
    dm = page(console, scope=DM)
    assert "She trusts me with a secret." in dm and "picnic" not in dm and "jazz" not in dm


def test_search_finds_by_meaning_within_the_scope_only(console: Console, seeded: dict[str, str]) -> None:
    html = page(console, scope=GUILD, q="a picnic by the lake")
    results = section(html, "search-results")
    found = re.findall(r'data-record-id="(\w+)"', results)
    assert found[0] == seeded["picnic"]
    assert seeded["boats"] not in found and seeded["secret"] not in found  # "lake" is in another scope too
    assert "score" in text_of(results)
    # The CLI's own search, limited to the scope, ranks the same record first.
    cli_found = CliRunner().invoke(
        cli, ["memory", "search", "pip", "a picnic by the lake", "--scope", GUILD, "--json"]
    )
    assert json.loads(cli_found.output)[0]["id"] == seeded["picnic"]
    other = page(console, scope=OTHER_GUILD, q="a picnic by the lake")
    assert re.findall(r'data-record-id="(\w+)"', section(other, "search-results")) == [seeded["boats"]]


def test_a_search_is_bounded_and_a_gateway_embedder_without_a_key_says_what_to_do(
    console: Console, seeded: dict[str, str]
) -> None:
    long = console.get("/memory?" + urlencode({"imp": "pip", "scope": GUILD, "q": "x" * 501}))
    assert long.status_code == 400 and long.text.strip() == "a search is at most 500 characters (got 501)"
    CliRunner().invoke(cli, ["imp", "set", "pip", "memory.embedder=gateway"])
    html = page(console, scope=GUILD, q="picnic")
    assert "no model key is configured" in text_of(section(html, "search-problem"))
    assert seeded["picnic"] in section(html, "records")  # the rest of the page still shows


def test_with_the_gateway_embedder_a_search_is_judged_metered_and_audited_like_the_clis(
    fake_model: FakeOpenAI, impyard_home: Path
) -> None:
    env = {"OPENAI_API_KEY": fake_model.api_key or "", "OPENAI_BASE_URL": fake_model.base_url}
    ImpStore().add("pip", memory={"enabled": True})  # the default embedder: the gateway
    given = CliRunner().invoke(cli, ["memory", "remember", "pip", "The lighthouse keeper waved.", "--valence", "0.5",
                                     "--intensity", "0.6", "--scope", GUILD, "--json"], env=env)  # fmt: skip
    record = json.loads(given.output)["record"]
    running = start_console(env)
    try:
        assert running.session.get(running.login_url, timeout=30).status_code == 200
        html = page(running, scope=GUILD, q="The lighthouse keeper waved.")
    finally:
        stop_console(running)
    results = section(html, "search-results")
    assert re.findall(r'data-record-id="(\w+)"', results) == [record]
    assert "score 0.90" in text_of(
        results
    )  # cosine 1 × (0.75 + 0.25 × felt 0.6), as the CLI's search scores it
    calls = fake_model.requests_for("/embeddings")
    assert len(calls) == 2 and all(call.purpose == "embedding" for call in calls)
    tail = CliRunner().invoke(cli, ["audit", "tail", "--imp", "pip", "--json"])
    rows = [json.loads(line) for line in tail.output.splitlines() if line.strip()]
    assert [(r["channel_id"], r["verdict"], r["purpose"]) for r in rows if r["method"] == "model.request"] == [
        ("operator:cli", "allowed", "embedding")] * 2  # fmt: skip


def test_the_slot_rules_and_the_day_of_the_scope(console: Console, seeded: dict[str, str]) -> None:
    db = open_database()
    clock = SystemClock()
    now = clock.now()
    try:
        db.write(lambda conn: wakefulness.save(conn, "pip", Wakefulness(
            awake=True, woke_at=now - timedelta(hours=3), last_activity_at=now - timedelta(minutes=20),
            slept_at=now - timedelta(hours=9),
        ), now))  # fmt: skip
        tasks = TaskStore(db, clock)
        reflect = db.write(lambda conn: tasks.insert(conn, reflect_request("pip", None)))
        night_here = db.write(
            lambda conn: tasks.insert(conn, sleep_request("pip", GUILD, now, consolidate=True))
        )
        db.write(lambda conn: tasks.insert(conn, sleep_request("pip", DM, now, consolidate=True)))
        db.write(lambda conn: conn.execute(
            update(task_rows).where(task_rows.c.id == night_here).values(
                state="done", box_summary="folded 2 records into 1; forgot 1 record", finished_at=iso(now),
            )
        ))  # fmt: skip
        assert reflect is not None
    finally:
        db.close()
    html = page(console, scope=GUILD)
    assert text_of(section(html, "day-state")).startswith("Awake since ")
    events = text_of(section(html, "day-events"))
    assert "a night in this scope: folded 2 records into 1; forgot 1 record" in events
    assert events.count("a night in this scope") == 1  # the DM's night is the DM's
    assert "a quiet reflection queued" in events and "woke" in events and "last activity" in events
    order = [events.index(word) for word in ("last activity", "woke", "fell asleep")]
    assert order == sorted(order)  # newest first: 20 minutes ago, 3 hours ago, 9 hours ago
    dm = text_of(section(page(console, scope=DM), "day-events"))
    assert "a night in this scope queued" in dm and "folded" not in dm
    assert "nothing in mind in" in text_of(html) and "no learned rules yet" in text_of(html)


# ------------------------------------------------------------------ Forget one record


def _confirm_form(html: str) -> dict[str, str]:
    form = section(html, "confirm")
    return {
        name: unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form)
    }


def test_forget_a_record_confirms_then_forgets_it_and_the_cli_agrees(
    console: Console, seeded: dict[str, str]
) -> None:
    html = page(console, scope=GUILD)
    link = re.search(rf'href="(/memory/forget\?[^"]*record={seeded["picnic"]})"', html)
    assert link is not None
    question = console.get(unescape(link.group(1)))
    assert question.status_code == 200
    said = text_of(question.text)
    assert "We planned a picnic by the lake." in said and "1 episode" in said and "cannot be undone" in said
    assert f"impyard memory forget pip --record {seeded['picnic']}" in said
    assert seeded["picnic"] in {r["id"] for r in shown()}  # a GET changes nothing
    form = _confirm_form(question.text)
    assert form == {"imp": "pip", "scope": GUILD, "record": seeded["picnic"], "csrf": console.csrf}
    answer = console.post("/memory/forget", form, allow_redirects=False)
    assert answer.status_code == 303
    target = answer.headers["Location"]
    assert parse_qs(urlsplit(target).query)["done"] == [
        f"pip forgot record {seeded['picnic'][:12]}: 1 record, 1 episode."
    ]
    after = console.get(target)
    assert f"pip forgot record {seeded['picnic'][:12]}" in text_of(section(after.text, "outcome"))
    assert seeded["picnic"] not in after.text
    left = {r["id"] for r in shown()}
    assert seeded["picnic"] not in left and left == {seeded[k] for k in ("secret", "late", "jazz", "boats")}
    again = console.post("/memory/forget", form, allow_redirects=False)
    assert (
        "was already gone; nothing was forgotten"
        in parse_qs(urlsplit(again.headers["Location"]).query)["done"][0]
    )


def test_a_record_is_forgotten_only_in_the_scope_it_is_in(console: Console, seeded: dict[str, str]) -> None:
    wrong = {"imp": "pip", "scope": GUILD, "record": seeded["secret"]}  # the DM's record, asked in the guild
    assert console.get("/memory/forget?" + urlencode(wrong)).status_code == 404
    answer = console.post("/memory/forget", wrong, allow_redirects=False)
    assert answer.status_code == 303 and "nothing was forgotten" in answer.headers["Location"].replace(
        "+", " "
    )
    assert seeded["secret"] in {r["id"] for r in shown()}


# ------------------------------------------------------------------ Forget a person (the /forget-me path)


def test_forget_a_person_counts_first_then_takes_them_from_every_scope(
    console: Console, seeded: dict[str, str]
) -> None:
    question = console.get(
        "/memory/forget-person?" + urlencode({"imp": "pip", "scope": GUILD, "person": CAROL_ID})
    )
    assert question.status_code == 200
    said = text_of(question.text)
    # hers in the guild, hers in the DM, and dave's that names her: 3 memories with their 3 moments
    assert (
        f"by or about 'carol', id {CAROL_ID} , in every scope : 3 memories, 3 moments, 0 conversations?"
        in said
    )
    assert f"impyard memory forget pip --person {CAROL_ID} ," in said
    assert len(shown()) == 5  # the question changed nothing
    spaced = console.get("/memory/forget-person?" + urlencode({"imp": "pip", "person": "Carol B"}))
    assert "--person 'Carol B'" in text_of(spaced.text)  # the command as a shell takes it
    form = _confirm_form(question.text)
    assert form == {"imp": "pip", "scope": GUILD, "person": CAROL_ID, "csrf": console.csrf}
    answer = console.post("/memory/forget-person", form, allow_redirects=False)
    assert answer.status_code == 303
    done = parse_qs(urlsplit(answer.headers["Location"]).query)["done"][0]
    assert (
        done
        == "pip forgot the person you named: 3 memories, 3 moments, 0 conversations (4 found by id, 2 by name)."
    )
    assert CAROL_ID not in answer.headers["Location"] and "carol" not in answer.headers["Location"]
    left = shown()
    assert {r["id"] for r in left} == {seeded["jazz"], seeded["boats"]}
    assert not shown("--person", "carol") and not shown("--person", CAROL_ID)  # in every scope the CLI looks
    assert text_of(section(console.get(answer.headers["Location"]).text, "outcome")).startswith(
        "pip forgot the person"
    )


# ------------------------------------------------------------------ refusals: nothing forgotten


def test_without_the_csrf_token_nothing_is_forgotten(console: Console, seeded: dict[str, str]) -> None:
    for path, form in (
        ("/memory/forget", {"imp": "pip", "scope": GUILD, "record": seeded["picnic"]}),
        ("/memory/forget-person", {"imp": "pip", "scope": GUILD, "person": CAROL_ID}),
    ):
        bare = console.session.post(console.base + path, data=form, timeout=30, allow_redirects=False)
        assert bare.status_code == 403 and "CSRF" in bare.text
        forged = console.post(path, {**form, "csrf": "not-the-token"}, allow_redirects=False)
        assert forged.status_code == 403
    assert len(shown()) == 5


@pytest.mark.parametrize(
    ("path", "query", "status", "line"),
    [
        pytest.param("/memory", {"imp": "nobody"}, 404, "no imp named 'nobody'", id="unknown-imp"),
        pytest.param("/memory", {"imp": "../etc"}, 404, "invalid imp name", id="bad-imp-name"),
        pytest.param("/memory", {"imp": "pip", "scope": "everything"}, 400, "scope ", id="bad-scope"),
        pytest.param("/memory", {"imp": "pip", "scope": GUILD, "n": "0"}, 400, "n must be a whole number", id="n"),
        pytest.param("/memory/forget", {"imp": "pip", "scope": GUILD, "record": "1234"}, 400,
                     "record must be a record's id", id="short-record"),
        pytest.param("/memory/forget-person", {"imp": "pip", "person": "x" * 65}, 400,
                     "the person must be a name or a Discord id", id="long-person"),
        pytest.param("/memory/forget-person", {"imp": "pip", "person": "  "}, 400,
                     "the person must be a name or a Discord id", id="blank-person"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_changes_nothing(
    console: Console, seeded: dict[str, str], path: str, query: dict[str, str], status: int, line: str
) -> None:
    asked = console.get(f"{path}?{urlencode(query)}")
    assert asked.status_code == status and len(asked.text.strip().splitlines()) == 1, asked.text
    assert line in asked.text
    if path != "/memory":
        posted = console.post(path, query, allow_redirects=False)
        assert posted.status_code == status and line in posted.text
    assert len(shown()) == 5


# ------------------------------------------------------------------ in a real browser


@pytest.mark.slow
def test_in_a_browser_forget_a_record_through_its_confirmation(
    console: Console, browser: Any, seeded: dict[str, str]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    wait = WebDriverWait(browser, 30)
    browser.get(console.login_url)
    browser.find_element(By.LINK_TEXT, "Memory").click()
    browser.find_element(By.LINK_TEXT, "pip").click()
    Select(browser.find_element(By.CSS_SELECTOR, "#choose-scope select[name=scope]")).select_by_value(GUILD)
    browser.find_element(By.CSS_SELECTOR, "#choose-scope button").click()
    row = wait.until(
        ec.presence_of_element_located((By.CSS_SELECTOR, f'tr[data-record-id="{seeded["jazz"]}"]'))
    )
    assert "Dave likes jazz records." in row.text
    row.find_element(By.CSS_SELECTOR, "a.forget").click()
    confirm = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#confirm button")))
    assert "Dave likes jazz records." in browser.find_element(By.ID, "what").text
    confirm.click()
    outcome = wait.until(ec.presence_of_element_located((By.ID, "outcome")))
    assert outcome.text == f"pip forgot record {seeded['jazz'][:12]}: 1 record, 1 episode."
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-record-id="{seeded["jazz"]}"]')
    assert seeded["jazz"] not in {r["id"] for r in shown()}
