"""The responder's own lines, kept by the host (issue 22): the store's rules (SPEC-001 ENV-07, ENV-11), the
``history.*`` requests through the real protocol and gateway — a box reads and writes only its own channel,
every byte it sends bounded and validated, audited — and an older home's imp-wide history file imported once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from box.common.history import Record
from box.protocol import BOX_METHODS, HOST_METHODS, Peer
from box.protocol.codec import NdjsonDecoder
from box.protocol.history import MAX_COMMIT_LINES, MAX_LINE_CHARS, MAX_LOAD_CHARS, HistoryLine, Role
from impyard.backends import BoxSpec
from impyard.clock import FixedClock
from impyard.conversation import history_act as gateway_module
from impyard.conversation.history_act import HistoryAct
from impyard.conversation.responder_history import HistoryBounds, ResponderHistory
from impyard.imps.store import ImpStore
from impyard.storage.db import Database
from testing.fake_openai import FakeOpenAI, envelope
from testing.pipes import byte_pipe
from tests.scripted import deliver_params, init_params
from tests.test_gateway import KEY, Harness, Watching, make_harness

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]

T0 = datetime(2026, 5, 10, 12, 0, tzinfo=UTC)


def line(n: int, content: str | None = None, role: Role = "user") -> HistoryLine:
    return HistoryLine(
        id=f"m{n}", role=role, author="ann", content=content or f"line {n}", at=T0 + timedelta(minutes=n)
    )


def store(db: Database, limit: int = 20, per_channel: int = 3) -> ResponderHistory:
    return ResponderHistory(db, FixedClock(T0), {"pip": HistoryBounds(limit, per_channel)})


def ids(records: list[Record]) -> list[str]:
    return [f"{r.channel_id}/{r.id}" for r in records]


# ------------------------------------------------------------------ the store: SPEC-001's rules, kept by the host


def test_env_07_commit_trims_the_imps_lines_after_appending(any_engine_db: Database) -> None:
    history = store(any_engine_db, limit=3)
    assert history.commit("pip", "c1", [line(n) for n in range(5)], "sent") == 5
    assert ids(history.lines("pip")) == ["c1/m2", "c1/m3", "c1/m4"]
    assert history.counters("pip") == {"c1": {"sent": 1}}


def test_env_07_load_trims_before_the_call_when_the_limit_fell(any_engine_db: Database) -> None:
    store(any_engine_db, limit=10).commit("pip", "c1", [line(n) for n in range(6)])
    lower = store(any_engine_db, limit=2)  # the imp's [model] history_limit lowered since
    assert ids(lower.load("pip", "c1")) == ["c1/m4", "c1/m5"]
    assert ids(lower.lines("pip")) == ["c1/m4", "c1/m5"]  # and kept trimmed


def test_env_11_a_busy_channel_loses_its_oldest_first(any_engine_db: Database) -> None:
    history = store(any_engine_db, limit=4, per_channel=2)
    history.commit("pip", "dm", [line(0)])
    history.commit("pip", "guild", [line(n) for n in range(1, 5)])
    assert ids(history.lines("pip")) == ["dm/m0", "guild/m2", "guild/m3", "guild/m4"]


def test_a_line_kept_once_is_not_kept_twice_and_each_imp_has_its_own(any_engine_db: Database) -> None:
    history = store(any_engine_db)
    assert history.commit("pip", "c1", [line(1), line(1, "again")]) == 1
    assert history.commit("pip", "c1", [line(1, role="assistant")]) == 1  # the reply to it is its own line
    assert history.commit("pix", "c1", [line(1)]) == 1
    assert [r.content for r in history.lines("pip")] == ["line 1", "line 1"]
    assert ids(history.load("pix", "c1")) == ["c1/m1"]


def test_a_load_answers_only_the_newest_lines_that_fit_one_protocol_line(any_engine_db: Database) -> None:
    history = store(any_engine_db, limit=500)
    big = "x" * MAX_LINE_CHARS
    for start in range(0, 150, MAX_COMMIT_LINES):
        history.commit("pip", "c1", [line(n, big) for n in range(start, min(start + MAX_COMMIT_LINES, 150))])
    loaded = history.load("pip", "c1")
    assert sum(len(r.content) for r in loaded) <= MAX_LOAD_CHARS and loaded[-1].id == "m149"
    assert len(loaded) < 150 and [r.id for r in loaded] == [f"m{n}" for n in range(150 - len(loaded), 150)]


def test_forgetting_a_channel_drops_every_imps_lines_there_and_keeps_the_counts(
    any_engine_db: Database,
) -> None:
    history = store(any_engine_db)
    history.commit("pip", "c1", [line(1)], "sent")
    history.commit("pix", "c1", [line(2)])
    history.commit("pip", "c2", [line(3)])
    assert history.forget_channel("c1") == 2
    assert ids(history.lines("pip")) == ["c2/m3"] and history.lines("pix") == []
    assert history.counters("pip") == {"c1": {"sent": 1}}


def test_a_commit_is_one_transaction_with_what_joins_it(any_engine_db: Database) -> None:
    """The lines, the trim, the counter and the caller's row (the gateway's audit row) commit together: when the
    caller's part fails, none of it is kept."""
    from impyard.gateway.audit import AuditLog, AuditRecord

    history = store(any_engine_db, limit=2)
    audit = AuditLog(any_engine_db, FixedClock(T0), secrets=[])
    history.commit("pip", "c1", [line(0), line(1)], "sent")

    def audited(conn: Any, stored: int) -> None:
        audit.write(
            AuditRecord(imp="pip", method="history.commit", verdict="allowed", reason=f"{stored} new"), conn
        )

    assert history.commit("pip", "c1", [line(2)], "silent", also=audited) == 1
    assert [r.reason for r in audit.tail()] == ["1 new"]
    assert ids(history.lines("pip")) == ["c1/m1", "c1/m2"]

    def broken(conn: Any, stored: int) -> None:
        raise RuntimeError("the audit row cannot be written")

    with pytest.raises(RuntimeError):
        history.commit("pip", "c1", [line(3), line(4)], "sent", also=broken)
    assert ids(history.lines("pip")) == ["c1/m1", "c1/m2"]  # nothing appended, nothing trimmed
    assert history.counters("pip") == {"c1": {"sent": 1, "silent": 1}} and len(audit.tail()) == 1


def test_forgetting_an_imp_drops_its_lines_counters_and_import_mark_only(any_engine_db: Database) -> None:
    history = store(any_engine_db)
    history.commit("pip", "c1", [line(1), line(2)], "sent")
    history.commit("pix", "c1", [line(1)], "sent")
    assert history.forget_imp("pip") == 2
    assert history.lines("pip") == [] and history.counters("pip") == {}
    assert ids(history.lines("pix")) == ["c1/m1"] and history.counters("pix") == {"c1": {"sent": 1}}


def test_counters_come_by_channel_and_outcome_in_code_point_order(any_engine_db: Database) -> None:
    history = store(any_engine_db)
    for channel, outcome in (
        ("b", "sent"),
        ("B", "sent"),
        ("a-1", "silent"),
        ("a-1", "failed"),
        ("a1", "sent"),
    ):
        history.commit("pip", channel, [], outcome)
    assert list(history.counters("pip")) == ["B", "a-1", "a1", "b"]
    assert list(history.counters("pip")["a-1"]) == ["failed", "silent"]


# ------------------------------------------------------------------ through the real protocol and gateway


@dataclass
class RawBox:
    """A hostile box: raw JSON-RPC lines into the host's real protocol peer, served by the real gateway."""

    send: Any
    receive: Any
    decoder: NdjsonDecoder
    next_id: int = 0

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        self.next_id += 1
        frame = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        await self.send.send(json.dumps(frame).encode() + b"\n")
        with anyio.fail_after(10):
            while True:
                for raw in self.decoder.feed(await self.receive.receive()):
                    assert isinstance(raw, bytes)
                    answer: dict[str, Any] = json.loads(raw)
                    if answer.get("id") == self.next_id:
                        return answer


@asynccontextmanager
async def raw_box(h: Harness, spec: BoxSpec) -> AsyncIterator[RawBox]:
    """The box of ``spec`` as the host sees it: its pipe is its identity (what ``RunningBox`` wires up)."""
    box_out, host_in = byte_pipe()
    host_out, box_in = byte_pipe()

    async def serve(method: str, params: Any) -> Any:
        return await h.gateway.serve(spec, method, params)

    async def refused(method: str, code: int, reason: str) -> None:
        await h.gateway.refused(spec, method, code, reason)

    peer = Peer(host_in, host_out, serves=HOST_METHODS, calls=BOX_METHODS, handler=serve, on_refusal=refused)
    async with anyio.create_task_group() as tg:
        tg.start_soon(peer.run)
        yield RawBox(box_out, box_in, NdjsonDecoder(1 << 20))
        await h.gateway.closed(spec)
        tg.cancel_scope.cancel()


def wire(n: int, **extra: Any) -> dict[str, Any]:
    return {**line(n).model_dump(mode="json"), **extra}


async def test_a_box_reads_and_writes_only_its_own_channels_lines(tmp_path: Path, fake: FakeOpenAI) -> None:
    h = make_harness(tmp_path, fake)
    dm = BoxSpec("pip", "dm-ann", tmp_path / "dm", run_id="dm-run")
    guild = BoxSpec("pip", "guild-1", tmp_path / "guild", run_id="guild-run")
    async with raw_box(h, dm) as box:
        said = {"lines": [wire(1, content="my pin is 4711")], "outcome": "sent"}
        assert (await box.call("history.commit", said))["result"] == {"stored": 1}
    async with raw_box(h, guild) as box:
        assert (await box.call("history.load", {}))["result"] == {"lines": []}  # never the DM's lines
        for asking in ({"channel_id": "dm-ann"}, {"scope": "dm:ann"}):  # no request may name another channel
            assert (await box.call("history.load", asking))["error"]["code"] == -32602
        forged = {"lines": [wire(2, channel_id="dm-ann", content="planted")]}
        assert (await box.call("history.commit", forged))["error"]["code"] == -32602
        mine = {"lines": [wire(3, content="hello guild")], "outcome": "silent"}
        assert (await box.call("history.commit", mine))["result"] == {"stored": 1}
        [seen] = (await box.call("history.load", {}))["result"]["lines"]
        assert seen["content"] == "hello guild"
    lines = h.gateway.act(HistoryAct).history.lines("pip")
    assert [(r.channel_id, r.content) for r in lines] == [
        ("dm-ann", "my pin is 4711"),
        ("guild-1", "hello guild"),
    ]
    rows = [(r["method"], r["verdict"], r["channel_id"]) for r in h.audit()]
    assert rows == [
        ("history.commit", "allowed", "dm-ann"),
        ("history.load", "invalid", "guild-1"), ("history.load", "invalid", "guild-1"),
        ("history.commit", "invalid", "guild-1"),
        ("history.commit", "allowed", "guild-1"),  # its load folded in: one row a turn
        ("history.load", "allowed", "guild-1"),  # a load no commit followed: audited at the box's end
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"lines": [wire(1, content="x" * (MAX_LINE_CHARS + 1))]}, "content"),
        ({"lines": [wire(n) for n in range(MAX_COMMIT_LINES + 1)]}, "lines"),
        ({"lines": [wire(1, id="")]}, "id"),
        ({"lines": [wire(1, id="i" * 129)]}, "id"),
        ({"lines": [wire(1, author="a" * 257)]}, "author"),
        ({"lines": [wire(1, role="system")]}, "role"),
        ({"lines": [wire(1, at="yesterday")]}, "at"),
        ({"lines": [], "outcome": "deleted everything"}, "outcome"),
        ({"lines": [], "limit": 0}, "limit"),  # the box never sets the limit: the imp's config does
    ],
)
async def test_every_byte_of_a_commit_is_bounded_and_nothing_is_half_written(
    tmp_path: Path, fake: FakeOpenAI, params: dict[str, Any], field: str
) -> None:
    h = make_harness(tmp_path, fake)
    h.gateway.act(HistoryAct).history.commit("pip", "c1", [line(0)])
    async with raw_box(h, h.spec) as box:
        answer = await box.call("history.commit", params)
    assert answer["error"]["code"] == -32602 and field in json.dumps(answer["error"]["data"])
    kept = h.gateway.act(HistoryAct).history.lines("pip")
    assert ids(kept) == ["c1/m0"]  # nothing written, nothing trimmed


async def test_a_box_flooding_history_requests_is_refused(
    tmp_path: Path, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_module, "HISTORY_REQUESTS_PER_MINUTE", 3)
    h = make_harness(tmp_path, fake)
    async with raw_box(h, h.spec) as box:
        answers = [await box.call("history.load", {}) for _ in range(4)]
    assert [("result" in a) for a in answers] == [True, True, True, False]
    assert (
        answers[-1]["error"]["code"] == -32010 and answers[-1]["error"]["data"]["rule"] == "history-requests"
    )
    assert ("history.load", "denied") in [(r["method"], r["verdict"]) for r in h.audit()]


async def test_a_guild_box_is_never_handed_a_dms_lines(
    tmp_path: Path, fake: FakeOpenAI, backend: Any
) -> None:
    """Two real boxes of one imp through the real gateway: what the DM box committed stays with the DM."""
    h = make_harness(tmp_path, fake)
    h.channel("guild-1", kind="guild", trusted=True)
    fake.script(
        envelope(answer="noted, ann: 4711"),
        purpose="reply",
        times=1,
        usage={"prompt_tokens": 10, "completion_tokens": 5},
    )
    watching = Watching(h.gateway)
    # a run id of its own, as the host gives every box: the runc and runsc cases run side by side on one engine
    dm = BoxSpec("pip", "c1", tmp_path / "state" / "c1")
    async with backend.open(dm, watching) as box:
        await box.init(init_params(imp="pip", channel_id="c1", kind="dm"), timeout=60)
        result = await box.deliver(deliver_params("remember: my pin is 4711", "m1"), timeout=60)
    assert result.outcome == "sent"
    assert "4711" in " ".join(r.content for r in h.gateway.act(HistoryAct).history.lines("pip", "c1"))
    fake.script(
        envelope(answer="hi all"), purpose="reply", usage={"prompt_tokens": 10, "completion_tokens": 5}
    )
    watching.handed_to_box.clear()
    guild = BoxSpec("pip", "guild-1", tmp_path / "state" / "guild-1")
    async with backend.open(guild, watching) as box:
        await box.init(init_params(imp="pip", channel_id="guild-1", kind="guild"), timeout=60)
        await box.deliver(
            deliver_params("what did ann tell you?", "m2", mode="judge", reason="mention"), timeout=60
        )
    assert not any(
        "4711" in text for text in watching.handed_to_box
    )  # nothing the host answered the guild box
    assert "4711" not in json.dumps(fake.requests[-1].body)  # nor its prompt
    channels = [r.channel_id for r in h.gateway.act(HistoryAct).history.lines("pip")]
    assert channels[:2] == ["c1", "c1"] and set(channels[2:]) == {"guild-1"}  # each its own channel's lines
    assert not list((tmp_path / "state").rglob("history.json"))  # no history file under any /state


# ------------------------------------------------------------------ an existing home keeps its history


def legacy_file(state: Path, records: list[dict[str, Any]], counters: dict[str, Any] | None = None) -> Path:
    state.mkdir(parents=True, exist_ok=True)
    path = state / "history.json"
    path.write_text(json.dumps({"version": 1, "records": records, "counters": counters or {}}))
    return path


def record(channel: str, n: int, content: str = "", role: str = "user") -> dict[str, Any]:
    return {"channel_id": channel, "id": f"{channel}-{n}", "role": role, "author": "ann",
            "content": content or f"{channel} {n}", "at": (T0 + timedelta(minutes=n)).isoformat()}  # fmt: skip


def test_an_older_homes_history_file_is_imported_once_and_kept(
    any_engine_db: Database, tmp_path: Path
) -> None:
    state = tmp_path / "imps" / "pip" / "state"
    records = [record("dm", 0), record("guild", 1), record("dm", 2, role="assistant"), {"id": "broken"}]
    legacy_file(state, records, {"dm": {"sent": 4}, "guild": {"silent": 2, "bogus": "x"}})
    history = store(any_engine_db)
    done = history.import_legacy("pip", state)
    assert done is not None and (done.lines, done.skipped, done.error) == (3, 1, None)
    assert ids(history.lines("pip")) == ["dm/dm-0", "guild/guild-1", "dm/dm-2"]  # order, channel, text kept
    assert history.counters("pip") == {"dm": {"sent": 4}, "guild": {"silent": 2}}
    kept = json.loads((state / "history.json.imported").read_text())  # nothing lost: the file stays
    assert kept["records"][3] == {"id": "broken"} and not (state / "history.json").exists()
    assert history.import_legacy("pip", state) is None  # nothing left to import
    legacy_file(state, [record("dm", 9)])  # an older impyard ran again and wrote a new one
    again = history.import_legacy("pip", state)
    assert again is not None and again.lines == 0  # imported once per imp, never twice
    assert len(history.lines("pip")) == 3
    second = json.loads((state / "history.json.imported.2").read_text())  # kept too, beside the first
    assert second["records"][0]["id"] == "dm-9"
    assert json.loads((state / "history.json.imported").read_text())["records"][3] == {"id": "broken"}


@pytest.mark.parametrize("kind", ["not json", "a link", "a directory", "too big"])
def test_an_old_file_that_cannot_be_read_safely_is_set_aside_untouched(
    any_engine_db: Database, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    secret = tmp_path / "host-secret.json"
    secret.write_text(json.dumps({"records": [record("dm", 0, "the host's own file")]}))
    if kind == "not json":
        (state / "history.json").write_text("{broken")
    elif kind == "a link":  # planted by a box: never followed to a file of the host
        (state / "history.json").symlink_to(secret)
    elif kind == "a directory":
        (state / "history.json").mkdir()
    else:
        monkeypatch.setattr("impyard.conversation.responder_history.MAX_LEGACY_BYTES", 10)
        legacy_file(state, [record("dm", 0)])
    history = store(any_engine_db)
    done = history.import_legacy("pip", state)
    assert done is not None and done.error is not None and history.lines("pip") == []
    aside = state / "history.json.unreadable"
    assert aside.exists() or aside.is_symlink()
    assert secret.read_text().startswith('{"records"')  # the link's target untouched


async def test_a_host_opening_an_older_home_brings_its_history_in() -> None:
    """The upgrade itself: ``open_host`` imports each imp's old file before any box runs; the box of each
    channel then gets its own lines back, and a second start imports nothing."""
    from impyard.gateway.surfaces import RecordingSurface
    from impyard.host import open_host

    imps = ImpStore()
    imps.add("pip", "You are Pip.")
    legacy_file(imps.state_dir("pip"), [record("terminal:ann", 0, "we spoke of owls"), record("c9", 1)])
    for _ in range(2):
        async with open_host(RecordingSurface(), reaches=("terminal",)) as host:
            lines = host.responder_history.load("pip", "terminal:ann")
            assert [r.content for r in lines] == ["we spoke of owls"]
            assert [r.channel_id for r in host.responder_history.lines("pip")] == ["terminal:ann", "c9"]
    assert (imps.state_dir("pip") / "history.json.imported").exists()


def test_removing_an_imp_keeps_its_lines_and_purging_forgets_them() -> None:
    from click.testing import CliRunner

    from impyard.cli import cli
    from impyard.storage.db import open_database

    imps = ImpStore()
    imps.add("pip", "You are Pip.")
    db = open_database()
    try:
        history = ResponderHistory(db, FixedClock(T0))
        history.commit("pip", "c1", [line(1)], "sent")
        history.commit("pix", "c1", [line(2)])
        assert CliRunner().invoke(cli, ["imp", "rm", "pip", "--yes"]).exit_code == 0
        assert len(history.lines("pip")) == 1  # kept, like its state dir: adding pip again gives it back
        imps.add("pip", "You are Pip.")
        assert CliRunner().invoke(cli, ["imp", "rm", "pip", "--purge", "--yes"]).exit_code == 0
        assert history.lines("pip") == [] and history.counters("pip") == {}
        assert len(history.lines("pix")) == 1  # another imp's lines stay
    finally:
        db.close()
