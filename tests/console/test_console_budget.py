"""Issue 34's Budget page: after real model calls through the gateway (the loopback fake OpenAI, the shipped prices),
the page shows each day's spend per purpose group exactly as `impyard budget spend` does, the reservation a call
holds, and the limits with where they come from. Through a real ``impyard console`` process and a real browser."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

from box.protocol.models import ModelRequestParams, ModelRequestResult
from impyard.backends import BoxSpec
from impyard.cli import cli
from impyard.clock import FixedClock, SystemClock
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.ledger import Ledger
from impyard.gateway.policy import build_policy, default_policy_path, load_policy
from impyard.gateway.surfaces import RecordingSurface
from impyard.host import build_gateway
from impyard.imps.store import ImpStore
from impyard.storage.db import open_database
from impyard.tasks.request import TaskRequest
from impyard.tasks.store import TaskStore
from testing.fake_openai import FakeOpenAI, envelope
from tests.console.conftest import Console

KEY = "sk-impyard-budget-test-1b2c3d"
pytestmark = pytest.mark.fake_model(key=KEY)
# The operator's own file allows one purpose the groups do not know: its spend is "other".
PROBE_RULE = """
[[rules]]
name = "model-probe"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
purposes = { probe = ["gpt-4.1-mini"] }
"""
DAY_ONE, DAY_THREE = datetime(2026, 5, 8, 9, 0, tzinfo=UTC), datetime(2026, 5, 10, 15, 0, tzinfo=UTC)


def chat_body(prompt_bytes: int, cap: int = 3000) -> dict[str, Any]:
    """A gpt-4.1-mini body with ``prompt_bytes`` of text: the reservation (bytes + cap) covers the usage scripted."""
    return {
        "model": "gpt-4.1-mini",
        "messages": [{"role": "user", "content": "x" * prompt_bytes}],
        "max_completion_tokens": cap,
    }


async def model_calls(fake: FakeOpenAI, calls: list[tuple[datetime, str, str, int, int]]) -> None:
    """Each (when, run id, purpose, prompt tokens, completion tokens) as one model.request through the gateway, on
    the home's database: judged, reserved, sent to the fake with the host's key, settled at the usage it reports."""
    db = open_database()
    clock = FixedClock(calls[0][0])
    default = default_policy_path()
    policy = build_policy([("ops.toml", PROBE_RULE), (str(default), default.read_text())])
    gateway = build_gateway(
        policy=policy, db=db, surface=RecordingSurface(), clock=clock,
        upstream=UpstreamConfig(base_url=fake.base_url, api_key=KEY), owners={"pip": {"owner-1"}}, secrets=[KEY],
    )  # fmt: skip
    try:
        for when, run_id, purpose, prompt, completion in calls:
            clock.set(when)
            fake.script(
                envelope(answer="ok"), purpose=purpose, times=1,
                usage={"prompt_tokens": prompt, "completion_tokens": completion},
            )  # fmt: skip
            spec = BoxSpec("pip", "c1", Path("/nonexistent/state"), run_id=run_id)
            params = ModelRequestParams(path="/chat/completions", body=chat_body(prompt), purpose=purpose)
            result = await gateway.serve(spec, "model.request", params)
            assert isinstance(result, ModelRequestResult) and result.status == 200, result
    finally:
        await gateway.aclose()
        db.close()


def a_task_run(run_id: str) -> None:
    """A task claimed by a run: the calls that run makes are the imp's tasks."""
    db = open_database()
    try:
        tasks = TaskStore(db, FixedClock(DAY_ONE))
        task = tasks.add(TaskRequest("pip", "say hi", channel_id="c1"))
        assert tasks.claim(task.id, run_id, "process") is not None
    finally:
        db.close()


@pytest.fixture
def spent(fake: FakeOpenAI) -> Iterator[None]:
    """pip's fortnight: two days with spend (2026-05-08 and -10), none on the 9th. gpt-4.1-mini: 0.40 USD per 1M
    input tokens, 1.60 per 1M output; so micro-USD = 0.4 × prompt + 1.6 × completion."""
    ImpStore().add("pip")
    a_task_run("task-run-1")
    anyio.run(
        model_calls, fake,
        [
            (DAY_ONE, "chat-1", "reply", 10_000, 2_500),  # 4,000 + 4,000 = 8,000 = $0.0080
            (DAY_ONE, "chat-1", "summary", 5_000, 1_000),  # 2,000 + 1,600 = 3,600 = $0.0036 memory
            (DAY_THREE, "chat-2", "reply", 10_000, 2_500),  # $0.0080
            (DAY_THREE, "chat-2", "appraisal", 2_500, 625),  # 1,000 + 1,000 = $0.0020 memory
            (DAY_THREE, "task-run-1", "reply", 20_000, 2_500),  # 8,000 + 4,000 = $0.0120 tasks (a task run's)
            (DAY_THREE, "chat-2", "probe", 2_500, 500),  # 1,000 + 800 = $0.0018 other
        ],
    )  # fmt: skip
    yield


# The days as written out: (reply, memory, tasks, other, in flight, total), USD with the CLI's four digits.
EXPECTED = {
    "2026-05-10": ("0.0080", "0.0020", "0.0120", "0.0018", "0.0000", "0.0238"),
    "2026-05-08": ("0.0080", "0.0036", "0.0000", "0.0000", "0.0000", "0.0116"),
}
COLUMNS = ("reply", "memory", "tasks", "other", "in flight", "total")


def section(html: str, anchor: str) -> str:
    found = re.search(rf'<section class="spend" id="{re.escape(anchor)}">(.*?)</section>', html, re.S)
    assert found is not None, f"no section {anchor}"
    return found.group(1)


def day_rows(part: str) -> dict[str, tuple[str, ...]]:
    """The spend table's rows: day -> its cells by column."""
    rows: dict[str, tuple[str, ...]] = {}
    for day, cells in re.findall(r'<tr data-day="([0-9-]+)">(.*?)</tr>', part, re.S):
        by_group = dict(re.findall(r'data-group="([a-z ]+)">([0-9.]+)</td>', cells))
        rows[day] = tuple(by_group[column] for column in COLUMNS)
    return rows


def bars(part: str) -> dict[str, str]:
    """The chart's bars: day -> its <title>."""
    return dict(re.findall(r'<g class="bar" data-day="([0-9-]+)">\s*<title>([^<]*)</title>', part))


def run_cli(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_the_page_shows_each_days_spend_per_purpose_as_the_cli_does(console: Console, spent: None) -> None:
    page = console.get("/budget?until=2026-05-10")
    assert page.status_code == 200, page.text
    pip = section(page.text, "spend-imp-pip")
    assert day_rows(pip) == EXPECTED  # 2026-05-09 spent nothing: no row
    assert day_rows(section(page.text, "spend-all")) == EXPECTED  # pip is the only imp that spent
    totals = re.search(r'<tr data-day="all"><th>14 days</th>(.*?)</tr>', pip, re.S)
    assert totals is not None
    assert dict(re.findall(r'data-group="([a-z ]+)">([0-9.]+)</td>', totals.group(1))) == {
        "reply": "0.0160", "memory": "0.0056", "tasks": "0.0120", "other": "0.0018", "in flight": "0.0000",
        "total": "0.0354",
    }  # fmt: skip
    # the chart: one bar per day with spend, each titled with its numbers
    assert bars(pip) == {
        "2026-05-08": "2026-05-08: $0.0116 (reply $0.0080, memory $0.0036)",
        "2026-05-10": "2026-05-10: $0.0238 (reply $0.0080, memory $0.0020, tasks $0.0120, other $0.0018)",
    }
    assert "2026-05-08 to 2026-05-10" not in pip and "2026-04-27 to 2026-05-10" in pip  # the 14 days shown

    listed = json.loads(run_cli("budget", "spend", "--until", "2026-05-10", "--imp", "pip", "--json").output)
    keys = [column.replace(" ", "_") + "_usd" for column in COLUMNS]
    from_cli = {row["day"]: tuple(f"{row[key]:.4f}" for key in keys) for row in listed}
    assert from_cli == EXPECTED
    table = run_cli("budget", "spend", "--until", "2026-05-10").output.splitlines()
    assert table[0].split("\t") == ["imp", "day (UTC)", "reply $", "memory $", "tasks $", "other $", "in flight $",
                                    "total $"]  # fmt: skip
    assert table[1:] == [
        "\t".join(("all imps", "2026-05-08", *EXPECTED["2026-05-08"])),
        "\t".join(("all imps", "2026-05-10", *EXPECTED["2026-05-10"])),
        "\t".join(("pip", "2026-05-08", *EXPECTED["2026-05-08"])),
        "\t".join(("pip", "2026-05-10", *EXPECTED["2026-05-10"])),
    ]

    # a window that ends on the 9th shows only the 8th; one of two days ending on the 9th, nothing
    assert set(day_rows(section(console.get("/budget?until=2026-05-09").text, "spend-imp-pip"))) == {
        "2026-05-08"
    }
    narrow = console.get("/budget?until=2026-05-09&days=1").text
    assert "no spend from 2026-05-09 to 2026-05-09" in section(narrow, "spend-imp-pip")
    assert bars(section(narrow, "spend-imp-pip")) == {}
    assert (
        "no spend from 2026-05-09 to 2026-05-09 (UTC) for pip"
        in run_cli("budget", "spend", "--until", "2026-05-09", "--days", "1", "--imp", "pip").output
    )


def test_a_held_reservation_shows_in_flight(console: Console) -> None:
    db = open_database()
    try:
        ledger = Ledger(db, load_policy(), SystemClock())
        held = ledger.reserve("pip", 4_250, method="model.request", purpose="summary", model="gpt-4.1-mini")
        today = SystemClock().now().date().isoformat()
        page = console.get("/budget")
        rows = re.findall(r'<tr data-reservation="(\d+)">(.*?)</tr>', page.text, re.S)
        assert [(int(id_), re.findall(r"<td[^>]*>(.*?)</td>", cells)[:4]) for id_, cells in rows] == [
            (held.id, ["pip", "0.0043", "summary", "gpt-4.1-mini"])
        ]
        # it counts on its day (as the budget counts it) as in flight, in the chart and the table
        [(day, cells)] = day_rows(section(page.text, "spend-imp-pip")).items()
        if day == today:  # the UTC day did not turn between the reservation and the page
            assert cells == ("0.0000", "0.0000", "0.0000", "0.0000", "0.0043", "0.0043")
        assert re.search(r'data-scope="pip">\s*<td>pip</td>', page.text)
        ledger.settle(held, 1_000)
        settled = console.get("/budget").text
        assert "no reservation in flight" in settled and 'data-reservation="' not in settled
        [(_, cells)] = day_rows(section(settled, "spend-imp-pip")).items()
        assert cells == ("0.0000", "0.0010", "0.0000", "0.0000", "0.0000", "0.0010")
    finally:
        db.close()


def test_limits_show_with_where_they_come_from(console: Console) -> None:
    ImpStore().add("pip")
    run_cli("budget", "set", "pip", "--daily", "1.5")
    page = console.get("/budget").text
    row = re.search(r'<tr data-scope="pip">(.*?)</tr>', page, re.S)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    defaults = load_policy().budgets
    assert cells[0] == "pip" and cells[2] == "1.5000" and cells[5] == f"{defaults.per_imp.monthly_usd:.4f}"
    assert cells[-1] == "policy, daily override"  # as `impyard budget show` says
    everyone = re.search(r'<tr data-scope="all">(.*?)</tr>', page, re.S)
    assert everyone is not None and f'<td class="num">{defaults.all.daily_usd:.4f}</td>' in everyone.group(1)
    assert "policy, daily override" in run_cli("budget", "show").output


def test_a_broken_policy_hides_the_limits_not_the_spend(console: Console, impyard_home: Path) -> None:
    (impyard_home / "policies").mkdir(parents=True, exist_ok=True)
    (impyard_home / "policies" / "bad.toml").write_text("[budgets.all]\ndaily_usd = 'lots'\n")
    page = console.get("/budget")
    assert page.status_code == 200
    assert "the policy is broken" in page.text and "bad.toml" in page.text
    assert 'id="budget-limits"' not in page.text and 'id="spend-all"' in page.text


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("days=0", "days is a whole number from 1 to 92"),
        ("days=93", "days is a whole number from 1 to 92"),
        ("days=lots", "days is a whole number from 1 to 92"),
        ("until=yesterday", "until is a UTC day (YYYY-MM-DD)"),
        ("until=2026-02-30", "until is a UTC day (YYYY-MM-DD)"),
        ("until=0001-01-01", "until is a UTC day (YYYY-MM-DD)"),
    ],
)
def test_a_bad_window_is_one_line(console: Console, query: str, message: str) -> None:
    answer = console.get(f"/budget?{query}")
    assert answer.status_code == 400 and message in answer.text and len(answer.text.splitlines()) == 1


@pytest.mark.slow
def test_in_a_browser_the_budget_page_shows_todays_spend(
    console: Console, browser: Any, fake: FakeOpenAI
) -> None:
    from selenium.webdriver.common.by import By

    ImpStore().add("pip")
    now = SystemClock().now()
    anyio.run(model_calls, fake, [(now, "chat-1", "reply", 10_000, 2_500)])  # $0.0080
    browser.get(console.login_url)
    browser.find_element(By.LINK_TEXT, "Budget").click()
    assert browser.title.startswith("Budget")
    row = browser.find_element(By.CSS_SELECTOR, '#budget-limits tr[data-scope="pip"]')
    cells = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == "pip" and cells[1] == "0.0080"  # today's spend, against pip's daily limit
    assert cells[2] == f"{load_policy().budgets.per_imp.daily_usd:.4f}"
    bar = browser.find_element(By.CSS_SELECTOR, "#spend-imp-pip svg g.bar")
    assert bar.get_attribute("data-day") == now.date().isoformat()
    assert bar.find_element(By.TAG_NAME, "title").get_attribute("textContent").endswith("(reply $0.0080)")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--until", "yesterday"], 2, "'yesterday' is not a UTC day (YYYY-MM-DD)"),
        (["--days", "93"], 2, "93 is not in the range 1<=x<=92"),
        (["--imp", "not a name!"], 1, "'not a name!' is not an imp name"),
    ],
)
def test_budget_spend_refuses_bad_input_with_one_line(args: list[str], code: int, message: str) -> None:
    result = CliRunner().invoke(cli, ["budget", "spend", *args])
    assert result.exit_code == code and message in result.output and "Traceback" not in result.output
