"""Issue 11 #7: a fetched page must not freeze the event loop.

``html.parser`` takes time quadratic in some markup (``"<x " * n``: seconds for 30 KB, hours for 2 MB).
The gateway's ``http.fetch`` turns HTML into text in a worker process with a time bound and a size
bound: the loop keeps running meanwhile (a ticker on it keeps counting), a parse past its time is
killed and refused with the reason, a page past the size bound comes back cut and ``truncated``.
The pages come from a loopback site; the fetch goes through ``Gateway.serve`` as a box's would.
"""

from __future__ import annotations

import http.server
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from box.protocol import ErrorCode, RpcError
from box.protocol.models import HttpFetchParams, HttpFetchResult
from impyard.backends import BoxSpec
from impyard.clock import FixedClock
from impyard.gateway.broker import UpstreamConfig
from impyard.gateway.core import Gateway
from impyard.gateway.fetch import EXTRACT_TIMEOUT_S
from impyard.gateway.fetch_act import FetchAct
from impyard.gateway.policy import build_policy, default_policy_path
from impyard.gateway.surfaces import RecordingSurface
from impyard.host import build_gateway
from impyard.storage.db import Database, open_database
from testing.web import local_site
from tests import sqlfile

pytestmark = pytest.mark.anyio

SLOW_MARKUP = (
    b"<x " * 10_000
)  # about 15 s of html.parser on this machine; hours at the 2 MB the policy allows
PAGES = {
    "/slow": SLOW_MARKUP,
    "/broken": b"<![" * 1_000,  # html.parser raises AssertionError on it
    "/long": b"<p>" + b"word " * 4_000 + b"</p>",
    "/ok": b"<html><p>Hello <b>world</b></p></html>",
}
FETCH_RULE = (
    '[[rules]]\nname = "fetch-test-site"\nmethod = "http.fetch"\naction = "allow"\nhosts = ["127.0.0.1"]\n'
    "allow_loopback = true\nmax_fetch_bytes = 100000\n"
)


class Ticker:
    """A task on the event loop that counts its turns: it only counts while the loop is free."""

    def __init__(self) -> None:
        self.count = 0

    async def run(self) -> None:
        while True:
            await anyio.sleep(0.01)
            self.count += 1


@dataclass
class Site:
    address: str
    ticker: Ticker
    ticks_when_served: dict[str, int]


@pytest.fixture
def site() -> Iterator[Site]:
    ticker = Ticker()
    served: dict[str, int] = {}

    class Pages(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            body = PAGES[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            served[self.path] = ticker.count  # from here on the host only reads and extracts

        def log_message(self, *args: object) -> None:
            pass

    with local_site(Pages) as address:
        yield Site(address, ticker, served)


@dataclass
class Host:
    gateway: Gateway
    db: Database
    spec: BoxSpec

    async def fetch(self, path: str, site: Site) -> HttpFetchResult:
        result = await self.gateway.serve(
            self.spec, "http.fetch", HttpFetchParams(url=f"http://{site.address}{path}")
        )
        assert isinstance(result, HttpFetchResult)
        return result

    def last_audit(self) -> tuple[str, str, str]:
        row = sqlfile.query(self.db, "SELECT verdict, rule, reason FROM audit ORDER BY id DESC LIMIT 1")[0]
        return row["verdict"], row["rule"], row["reason"]


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    db = open_database(tmp_path / "impyard.db")
    policy = build_policy(
        [("ops.toml", FETCH_RULE), (str(default_policy_path()), default_policy_path().read_text())]
    )
    gateway = build_gateway(
        policy=policy, db=db, surface=RecordingSurface(), clock=FixedClock(datetime(2026, 6, 1, tzinfo=UTC)),
        upstream=UpstreamConfig(api_key=None), secrets=[],
    )  # fmt: skip
    yield Host(gateway, db, BoxSpec("pip", "c1", tmp_path / "state", run_id="run-1"))
    await gateway.aclose()
    db.close()


async def test_slow_markup_is_parsed_off_the_loop_and_refused_at_its_time_bound(
    host: Host, site: Site
) -> None:
    host.gateway.act(FetchAct).fetcher.extract_timeout_s = 1.0
    outcome: HttpFetchResult | RpcError
    async with anyio.create_task_group() as tg:
        tg.start_soon(site.ticker.run)
        try:
            outcome = await host.fetch("/slow", site)
        except RpcError as exc:
            outcome = exc
        ticked_while_extracting = site.ticker.count - site.ticks_when_served["/slow"]
        tg.cancel_scope.cancel()
    assert ticked_while_extracting >= 10  # the loop ran on while the page was parsed (inline: about 0)
    assert isinstance(outcome, RpcError), "the slow page was not cut off at its time bound"
    assert outcome.code == ErrorCode.DENIED and outcome.data["rule"] == "http-text"
    assert "within 1 s" in outcome.data["reason"] and "not returned" in outcome.data["reason"]
    assert host.last_audit()[:2] == ("denied", "http-text")
    host.gateway.act(FetchAct).fetcher.extract_timeout_s = EXTRACT_TIMEOUT_S
    after = await host.fetch("/ok", site)  # the killed worker is replaced: the next page is fine
    assert (after.status, after.text, after.truncated) == (200, "Hello world", False)


async def test_markup_the_parser_chokes_on_is_refused_with_the_reason(host: Host, site: Site) -> None:
    with pytest.raises(RpcError) as caught:
        await host.fetch("/broken", site)
    assert caught.value.code == ErrorCode.DENIED and caught.value.data["rule"] == "http-text"
    assert "AssertionError" in caught.value.data["reason"]
    assert host.last_audit()[:2] == ("denied", "http-text")


async def test_html_past_the_size_bound_is_cut_and_says_truncated(host: Host, site: Site) -> None:
    host.gateway.act(FetchAct).fetcher.max_html_chars = 1_000
    result = await host.fetch("/long", site)
    assert result.truncated and result.text.startswith("word word") and 900 < len(result.text) <= 1_000
    whole = await host.fetch("/ok", site)
    assert not whole.truncated and whole.text == "Hello world"
