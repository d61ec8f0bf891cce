"""Issue 34, "Metrics and health" (docs/metrics.md): ``/metrics``, ``/healthz`` and ``/readyz`` of the long-running
processes, and the metrics counted where things happen.

Real parts: ``impyard serve`` in this process with the real discord.py client against the fake Discord and the real
openai SDK against the fake OpenAI, read over HTTP; the gateway with the fake OpenAI; a real lease store; the CLI.
Counters are compared before and after (deltas), so no test depends on what another one counted.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import aiohttp
import anyio
import pexpect
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from box.protocol import ErrorCode
from box.protocol.models import ModelRequestParams
from impyard import metrics
from impyard.cli import cli
from impyard.discord.serve import serve
from impyard.gateway.model_act import call_labels
from impyard.gateway.policy import load_policy
from impyard.metrics.http import Phase, serve_health
from impyard.metrics.labels import MAX_LABEL_CHARS, clipped, known, lease_kind
from impyard.storage.db import open_database
from impyard.storage.leases import LeaseStore, holding
from impyard.storage.liveness import Holder
from impyard.storage.readiness import database_check, lease_check
from impyard.storage.tables import leases
from testing.fake_discord import FakeChannel, FakeDiscord, FakeGuild, FakeUser, member
from testing.fake_openai import FakeOpenAI, envelope
from testing.inprocess import InProcessBackend
from tests.discord_yard import add_pip, settings_for
from tests.test_gateway import CHAT_BODY, KEY, make_harness, policy_with

IMPYARD = str(Path(sys.executable).parent / "impyard")
WAIT_S = 20.0

# Ids and words no metric could hold by chance: if one shows in /metrics, a label carries it.
PERSON = FakeUser(739_184_620_551_203_877, "wren-the-tester")
ROOM = 918_273_645_500_112_233
GUILD_ID = 884_422_119_900_001
WORDS = "zebra-quartz-7721 tell me about the lighthouse"
SECOND_WORDS = "marigold-umbra-5530 and the harbour?"


# ------------------------------------------------------------------ helpers


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a /metrics text, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, frozenset(labels.items())), 0.0)


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as client, client.get(url) as response:
        return response.status, await response.text()


async def until_status(url: str, status: int) -> str:
    with anyio.fail_after(WAIT_S):
        while True:
            got, text = await get(url)
            if got == status:
                return text
            await anyio.sleep(0.05)


# ------------------------------------------------------------------ what a label may say


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("pip", "pip"),
        ("gpt-4.1-mini", "gpt-4.1-mini"),
        ('bad"name\nwith {braces}', "bad_name_with__braces_"),
        ("x" * 500, "x" * MAX_LABEL_CHARS),
        ("", "other"),
    ],
)
def test_a_label_is_clipped_to_a_safe_alphabet_and_length(given: str, expected: str) -> None:
    assert clipped(given) == expected


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("shard:0/2", "shard"),
        (f"channel:terminal:{ROOM}", "channel"),
        ("task:t-123/r-456", "task"),
        ("host:box-7/4242", "host"),
        (f"{ROOM}", "other"),
        ("made-up:thing", "other"),
    ],
)
def test_a_lease_is_counted_by_its_kind_never_its_id(name: str, kind: str) -> None:
    assert lease_kind(name) == kind


def test_a_model_and_a_purpose_a_box_made_up_are_other() -> None:
    policy = load_policy()
    assert call_labels(policy, "reply", "gpt-4.1-mini") == (
        "reply",
        "gpt-4.1-mini",
    )  # priced, a known purpose
    assert call_labels(policy, "zz_made_up_purpose", "gpt-4.1-mini") == ("other", "gpt-4.1-mini")
    assert call_labels(policy, "reply", f"user-{PERSON.id}-model") == (
        "reply",
        "other",
    )  # no price: not a label
    assert call_labels(policy, "reply", None) == ("reply", "other")
    assert known("sent", {"sent", "silent"}) == "sent" and known("bogus", {"sent"}) == "other"


# ------------------------------------------------------------------ the gateway: calls, tokens, spend, refusals


@pytest.mark.anyio
@pytest.mark.fake_model(key=KEY)
async def test_a_model_call_counts_the_call_its_tokens_and_its_spend(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    h = make_harness(tmp_path, fake)
    labels = {"imp": "pip", "purpose": "reply", "model": "gpt-4.1-mini", "outcome": "allowed"}
    before = metrics.exposition().decode()
    fake.script(
        envelope(answer="hello"),
        purpose="reply",
        usage={"prompt_tokens": 1000, "completion_tokens": 200, "cached_tokens": 100},
    )
    body = {**CHAT_BODY, "messages": [{"role": "user", "content": "hello " * 200}]}
    await h.call("model.request", ModelRequestParams(path="/chat/completions", body=body, purpose="reply"))
    after = metrics.exposition().decode()
    await h.gateway.aclose()
    h.db.close()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("impyard_model_calls_total", **labels) == 1
    tokens = {kind: delta("impyard_model_tokens_total", imp="pip", purpose="reply", kind=kind) for kind in
              ("input", "output", "cached")}  # fmt: skip
    assert tokens == {"input": 1000, "output": 200, "cached": 100}
    charged = (
        900 * 0.40 + 100 * 0.10 + 200 * 1.60
    )  # gpt-4.1-mini's prices, micro-USD: what the ledger settled
    assert delta("impyard_spend_usd_total", imp="pip") == pytest.approx(round(charged) / 1_000_000)
    assert h.spent() == round(charged)


@pytest.mark.anyio
@pytest.mark.fake_model(key=KEY)
async def test_a_refusal_counts_its_rule_and_the_refused_call(tmp_path: Path, fake: FakeOpenAI) -> None:
    policy = policy_with(
        '[[rules]]\nname = "ops-models"\nmethod = "model.request"\naction = "allow"\npaths = ["/chat/completions"]\n'
        'purposes = { experiment = ["gpt-unpriced"] }\n'
    )
    h = make_harness(tmp_path, fake, policy)
    before = metrics.exposition().decode()
    unpriced = ModelRequestParams(
        path="/chat/completions", body={**CHAT_BODY, "model": "gpt-unpriced"}, purpose="experiment"
    )
    await h.refused("model.request", unpriced, ErrorCode.DENIED)
    made_up = ModelRequestParams(
        path="/chat/completions", body={**CHAT_BODY, "model": "text-embedding-3-small"}, purpose="zz_made_up"
    )
    await h.refused("model.request", made_up, ErrorCode.DENIED)
    h.gateway.ledger.set_limits("pip", daily_usd=0.000001, monthly_usd=None)
    reply = ModelRequestParams(path="/chat/completions", body=CHAT_BODY, purpose="reply")
    await h.refused("model.request", reply, ErrorCode.BUDGET_EXHAUSTED)
    after = metrics.exposition().decode()
    await h.gateway.aclose()
    h.db.close()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("impyard_refusals_total", rule="prices") == 1
    assert delta("impyard_refusals_total", rule="default-deny") == 1
    assert delta("impyard_refusals_total", rule="budget") == 1
    calls = {key: after_value - samples(before).get(key, 0.0) for key, after_value in samples(after).items()
             if key[0] == "impyard_model_calls_total" and after_value != samples(before).get(key, 0.0)}  # fmt: skip
    counted = {(dict(labels)["outcome"], dict(labels)["purpose"], dict(labels)["model"]): n
               for (_, labels), n in calls.items()}  # fmt: skip
    assert counted == {
        ("denied", "experiment", "other"): 1,  # a purpose a rule names; a model the price table does not list
        ("denied", "other", "text-embedding-3-small"): 1,  # a purpose no rule names: never the box's own word
        ("budget_exhausted", "reply", "gpt-4.1-mini"): 1,
    }
    assert fake.requests == []


# ------------------------------------------------------------------ the HTTP server: health and readiness


@pytest.mark.anyio
async def test_readyz_is_not_ready_while_starting_and_once_the_database_is_gone(tmp_path: Path) -> None:
    db = open_database(tmp_path / "impyard.db")
    phase = Phase("starting: the bots are connecting")
    try:
        async with serve_health(None, 0, [phase.check, database_check(db)]) as port:
            base = f"http://127.0.0.1:{port}"
            assert await get(f"{base}/healthz") == (200, "ok\n")
            assert await get(f"{base}/readyz") == (503, "process: starting: the bots are connecting\n")
            phase.ready()
            assert await get(f"{base}/readyz") == (200, "ready\n")
            status, text = await get(f"{base}/metrics")
            assert status == 200 and "# TYPE impyard_turns_total counter" in text
            (tmp_path / "impyard.db").unlink()  # the database file removed from under the process
            assert await get(f"{base}/readyz") == (
                503, f"database: the SQLite file {tmp_path / 'impyard.db'} is gone (the file was removed)\n"
            )  # fmt: skip
            assert await get(f"{base}/healthz") == (200, "ok\n")  # alive all the same
            phase.stopping()
            status, text = await get(f"{base}/readyz")
            assert status == 503 and text.splitlines()[0] == "process: stopping"
            assert await get(f"{base}/nothing-here") == (404, "404: Not Found")
        with pytest.raises(aiohttp.ClientConnectionError):  # closed with its block
            await get(f"{base}/healthz")
    finally:
        db.close()


@pytest.mark.anyio
async def test_readyz_fails_once_the_shard_lease_is_lost(tmp_path: Path) -> None:
    db = open_database(tmp_path / "impyard.db")
    store = LeaseStore(db)
    try:
        async with (
            holding(store, ["shard:1/2"], renew_every=timedelta(seconds=0.05)) as keeper,
            serve_health("127.0.0.1", 0, [lease_check(keeper)]) as port,
        ):
            base = f"http://127.0.0.1:{port}"
            assert await get(f"{base}/readyz") == (200, "ready\n")
            assert value((await get(f"{base}/metrics"))[1], "impyard_leases_held", kind="shard") == 1
            other = Holder("beta", "f00d", 200, "777")
            with db.begin() as conn:  # another host takes the shard over
                conn.execute(
                    sa.update(leases).where(leases.c.name == "shard:1/2").values(holder=str(other), token=2)
                )
            text = await until_status(f"{base}/readyz", 503)
            assert (
                text
                == "lease: lost lease shard:1/2: the lease passed to beta pid 200 (token 2, this host held 1)\n"
            )
            assert value((await get(f"{base}/metrics"))[1], "impyard_leases_held", kind="shard") == 0
    finally:
        db.close()


@pytest.mark.anyio
async def test_a_check_that_raises_or_hangs_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from impyard.metrics import http

    monkeypatch.setattr(http, "CHECK_TIMEOUT_S", 0.2)

    async def broken() -> str | None:
        raise RuntimeError("the check broke\nwith a second line")

    async def hangs() -> str | None:
        await anyio.sleep_forever()
        return None

    checks = [http.ReadyCheck("broken", broken), http.ReadyCheck("slow", hangs)]
    async with serve_health(None, 0, checks) as port:
        assert await get(f"http://127.0.0.1:{port}/readyz") == (
            503, "broken: RuntimeError: the check broke\nslow: no answer within 0.2 s\n"
        )  # fmt: skip


def test_a_metrics_port_in_use_is_one_line_on_the_cli(model: FakeOpenAI) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for command in (["serve"], ["supervise", "--once"]):
            result = CliRunner().invoke(cli, [*command, "--metrics-port", str(port)])
            assert result.exit_code == 1, result.output
            assert result.output == (
                f"Error: the metrics port 127.0.0.1:{port} is in use: give another with --metrics-port "
                "(0 picks a free one)\n"
            )


# ------------------------------------------------------------------ impyard serve, end to end


def _fake() -> FakeDiscord:
    guild = FakeGuild(
        GUILD_ID,
        "the yard",
        owner_id=PERSON.id,
        channels=[FakeChannel(ROOM, "lighthouse")],
        members=[member(PERSON)],
    )
    return FakeDiscord(guilds=[guild], token="pip-token-0123456789")


@pytest.fixture
async def served(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> AsyncIterator[tuple[FakeDiscord, str]]:
    """pip served in this process with ``--metrics-port 0``: the fake Discord and the metrics' base URL."""
    add_pip(discord={})
    stop = anyio.Event()
    bound: list[int] = []
    async with _fake() as fake:
        monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", fake.token)
        with fake.patch_discord():
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: serve(
                    ["pip"], stop=stop, handle_signals=False, settings=settings_for(fake),
                    backends={"pip": InProcessBackend()}, metrics_port=0, on_metrics_port=bound.append,
                ))  # fmt: skip
                with anyio.fail_after(WAIT_S):
                    while not bound:
                        await anyio.sleep(0.01)
                base = f"http://127.0.0.1:{bound[0]}"
                assert (await get(f"{base}/healthz"))[0] == 200  # alive from before the host opened
                await until_status(f"{base}/readyz", 200)
                assert fake.sessions_connected == 1  # ready means connected
                yield fake, base
                stop.set()
    with pytest.raises(aiohttp.ClientConnectionError):  # closed once serve stopped
        await get(f"{base}/healthz")


@pytest.mark.anyio
async def test_serve_counts_turns_stages_boxes_and_calls_and_no_label_names_a_person(
    served: tuple[FakeDiscord, str], model: FakeOpenAI
) -> None:
    fake, base = served
    model.script(envelope(answer="the lighthouse is old", answer_needed=True), times=2)
    assert CliRunner().invoke(cli, ["channel", "trust", str(ROOM)]).exit_code == 0
    before = (await get(f"{base}/metrics"))[1]
    fake.post_message(ROOM, PERSON, WORDS)
    await fake.wait_for(lambda: len(fake.messages(ROOM)) >= 1, timeout=WAIT_S)  # the reply
    fake.post_message(ROOM, PERSON, SECOND_WORDS)  # the same warm box answers
    await fake.wait_for(lambda: len(fake.messages(ROOM)) >= 2, timeout=WAIT_S)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    with anyio.fail_after(WAIT_S):  # the second turn's outcome is recorded just after its post
        while True:
            after = (await get(f"{base}/metrics"))[1]
            if delta("impyard_turns_total", imp="pip", surface="discord", outcome="sent") >= 2:
                break
            await anyio.sleep(0.05)
    assert delta("impyard_turns_total", imp="pip", surface="discord", outcome="sent") == 2
    assert delta("impyard_turn_seconds_count", stage="turn") == 2
    assert delta("impyard_turn_seconds_count", stage="context") == 2  # each stage the box said, timed
    assert delta("impyard_turn_seconds_count", stage="render") == 2
    assert delta("impyard_turn_seconds_sum", stage="turn") > 0
    assert delta("impyard_box_starts_total", runtime="in-process", kind="cold") == 1
    assert delta("impyard_box_starts_total", runtime="in-process", kind="warm") == 1
    assert (
        value(after, "impyard_boxes", imp="pip", state="idle") == 1
    )  # the warm box waits for the next message
    assert value(after, "impyard_leases_held", kind="host") >= 1  # its own record
    calls = delta("impyard_model_calls_total", imp="pip", purpose="reply", model="gpt-5.1", outcome="allowed")
    assert calls == 2, after
    assert delta("impyard_spend_usd_total", imp="pip") > 0
    assert delta("impyard_model_tokens_total", imp="pip", purpose="reply", kind="input") > 0
    # No label carries the person's id, the channel's, the server's or a word of what was said.
    for secret in (
        str(PERSON.id),
        str(ROOM),
        str(GUILD_ID),
        PERSON.username,
        "zebra",
        "lighthouse",
        "marigold",
    ):
        assert secret not in after, f"{secret!r} is in /metrics"
    assert (await get(f"{base}/readyz")) == (200, "ready\n")


# ------------------------------------------------------------------ impyard supervise, a real process


def test_supervise_serves_health_and_metrics_until_stopped(model: FakeOpenAI, impyard_home: Path) -> None:
    env = {**os.environ, "IMPYARD_HOME": str(impyard_home), "OPENAI_API_KEY": model.api_key,
           "OPENAI_BASE_URL": model.base_url}  # fmt: skip
    child = pexpect.spawn(
        IMPYARD, ["supervise", "--metrics-port", "0"], env=env, encoding="utf-8", timeout=30
    )
    try:
        child.expect(r"metrics and health on http://127\.0\.0\.1:(\d+)/metrics")
        base = f"http://127.0.0.1:{child.match.group(1)}"
        child.expect("supervising")
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as response:
            assert response.read() == b"ok\n"
        with urllib.request.urlopen(f"{base}/readyz", timeout=10) as response:
            assert response.status == 200 and response.read() == b"ready\n"
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert re.search(r"^# TYPE impyard_box_starts_total counter$", text, re.M)
        assert "process_resident_memory_bytes" in text  # the process's own, beside impyard's
        child.kill(2)
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{base}/healthz", timeout=5)
