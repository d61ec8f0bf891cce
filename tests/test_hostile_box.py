"""A hostile box against the real host code (issue 11 #1, #6, #8 and "also close").

The box program is assumed fully hostile: ``tests/boxes/hostile_box.py`` writes raw NDJSON attacks,
the real host code (process backend, ``RunningBox``, the session manager, the gateway) must end that
box only, keep its own memory, log and audit bounded, and go on serving every other box.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from box.protocol import MAX_FRAME_DEPTH, ErrorCode, FrameInvalid, RpcError, decode_frame
from box.protocol.memory import PresenceEntry
from box.protocol.models import BoxInitParams, LogParams, Message
from impyard.backends import BoxBackend, BoxDied, BoxSpec
from impyard.backends.conduct import Admission, HeldBack, NoiseLimits, NoiseMeter, folded_refusals, printable
from impyard.backends.process import ProcessBackend, box_command, box_environment
from impyard.conversation.sessions import DIED_NOTICE, SessionKey, SessionManager, SessionSettings
from tests.scripted import ScriptedHost, deliver_params, init_params
from tests.test_sessions import Recorder, delivery

pytestmark = pytest.mark.anyio

HOSTILE_BOX = str(Path(__file__).parent / "boxes" / "hostile_box.py")


def hostile(mode: str) -> ProcessBackend:
    return ProcessBackend(command=[sys.executable, HOSTILE_BOX, mode], warn=False)


def spec(tmp_path: Path, imp: str = "evil") -> BoxSpec:
    return BoxSpec(imp=imp, channel_id="c1", state_dir=tmp_path / imp / "state")


@dataclass
class Plan:
    """Each imp with its own backend (a hostile one among honest ones); state under ``root``."""

    backends: dict[str, BoxBackend]
    root: Path

    def backend_for(self, imp: str) -> BoxBackend:
        return self.backends[imp]

    async def presence_for(self, key: SessionKey, message: Message, now: datetime) -> list[PresenceEntry]:
        return []

    async def init_for(self, key: SessionKey, now: datetime) -> BoxInitParams:
        return init_params(key.imp, key.channel_id)

    def state_dir_for(self, key: SessionKey) -> Path:
        return self.root / key.imp / "state" / key.channel_id  # each box its own /state (issue 22)

    def settings_for(self, imp: str) -> SessionSettings:
        return SessionSettings()


def sessions_of(tmp_path: Path, backends: dict[str, BoxBackend], recorder: Recorder) -> SessionManager:
    return SessionManager(plan=Plan(backends, tmp_path), host=ScriptedHost(), events=recorder)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# ------------------------------------------------------------------ #1: decoding never raises past the peer


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        (b'{"a": 1}', True),
        (nested(MAX_FRAME_DEPTH), True),  # as deep as the protocol allows
        (nested(MAX_FRAME_DEPTH + 1), False),  # one level more
        (nested(100_000), False),  # what crashed the host: RecursionError inside json.loads
        (b'{"a": ' * 5_000 + b"1" + b"}" * 5_000, False),
        (b"\xff\xfe not utf-8", False),
        (b"not json", False),
    ],
)
def test_decode_frame_turns_every_failure_into_frame_invalid(line: bytes, ok: bool) -> None:
    if ok:
        decode_frame(line)
    else:
        with pytest.raises(FrameInvalid):
            decode_frame(line)


@pytest.mark.parametrize("mode", ["deep", "deep-params"])
async def test_a_deeply_nested_line_ends_that_box_only(tmp_path: Path, mode: str) -> None:
    """One hostile session and one honest one in the same manager: only the hostile one ends."""
    evil, honest = SessionKey("evil", "c1"), SessionKey("pip", "c1")
    backends = {"evil": hostile(mode), "pip": ProcessBackend(warn=False)}
    recorder = Recorder()
    async with sessions_of(tmp_path, backends, recorder) as sessions:
        sessions.deliver(delivery(1, key=evil))
        sessions.deliver(delivery(2, key=honest))
        await recorder.until(lambda: {"m1", "m2"} <= set(recorder.answered()))
        outcomes = {ids[0]: result for ids, result in recorder.outcomes}
        assert outcomes["m1"].outcome == "failed" and "protocol violation" in (outcomes["m1"].error or "")
        assert outcomes["m2"].outcome == "sent"
        assert DIED_NOTICE in recorder.notices
        sessions.deliver(delivery(3, key=honest))  # the manager and the honest session live on
        await recorder.until(lambda: "m3" in recorder.answered())
        assert outcomes["m2"].outcome == "sent" and recorder.outcomes[-1][1].outcome == "sent"


async def test_the_box_program_survives_a_deeply_nested_line(tmp_path: Path) -> None:
    """The box's side: the same line on the real ``python -m box`` stdin is a parse error, then it answers."""
    process = await anyio.open_process(box_command(), env=box_environment(tmp_path), cwd="/")
    async with process:
        assert process.stdin is not None and process.stdout is not None
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "box.init",
            "params": init_params().model_dump(mode="json"),
        }
        await process.stdin.send(nested(100_000) + b"\n" + json.dumps(init).encode() + b"\n")
        received = b""
        with anyio.fail_after(20):
            while received.count(b"\n") < 2:
                received += await process.stdout.receive()
        first, second = (json.loads(line) for line in received.splitlines()[:2])
        assert first["error"]["code"] == -32700 and "deeper" in first["error"]["message"]
        assert second["result"]["protocol"] == 1
        await process.stdin.aclose()
        with anyio.fail_after(10):
            assert await process.wait() == 0


# ------------------------------------------------------------------ #6: requests in flight are bounded


async def test_a_box_flooding_requests_it_never_reads_back_is_killed(tmp_path: Path) -> None:
    host = ScriptedHost(hold=anyio.Event())  # every model call stays in flight
    with anyio.fail_after(60):
        async with hostile("request-flood").open(spec(tmp_path), host) as running:
            await running.init(init_params())
            with pytest.raises(BoxDied) as caught:
                await running.deliver(deliver_params(), timeout=40)
    assert "requests in flight" in str(caught.value)
    assert host.model_calls <= 8  # of 200 sent: the rest were never served, nor held in memory


# ------------------------------------------------------------------ #8: logs and refusals are bounded


@pytest.mark.parametrize(("mode", "most_shown"), [("log-flood", 400), ("log-repeat", 1)])
async def test_a_box_flooding_the_log_is_cut_off_and_killed(
    tmp_path: Path, mode: str, most_shown: int
) -> None:
    host = ScriptedHost()
    with anyio.fail_after(60):
        async with hostile(mode).open(spec(tmp_path), host) as running:
            await running.init(init_params())
            with pytest.raises(BoxDied) as caught:
                await running.deliver(deliver_params(), timeout=40)
    assert "flooded the host's log" in str(caught.value)
    assert 1 <= len(host.logs) <= most_shown  # of 20,000 sent


class RefusalsHost(ScriptedHost):
    """Records what the protocol refused, as the gateway's ``refused`` would audit it (one row each)."""

    def __init__(self, **fields: object) -> None:
        super().__init__(**fields)  # type: ignore[arg-type]
        self.refusals: list[tuple[str, int, str]] = []

    async def refused(self, spec: BoxSpec, method: str, code: int, reason: str) -> None:
        self.refusals.append((method, code, reason))


async def test_a_box_flooding_refused_requests_is_audited_in_bounds_and_killed(tmp_path: Path) -> None:
    host = RefusalsHost()
    with anyio.fail_after(60):
        async with hostile("refusal-flood").open(spec(tmp_path), host) as running:
            await running.init(init_params())
            with pytest.raises(BoxDied) as caught:
                await running.deliver(deliver_params(), timeout=40)
    assert "kept sending refused requests" in str(caught.value)
    assert 1 <= len(host.refusals) <= 100  # of 5,000 sent
    method, _, reason = host.refusals[-1]  # what was not recorded one by one is one folded row
    assert method == "(folded)" and "not recorded one by one" in reason


async def test_repeated_refusals_are_folded_into_one_row_that_counts_and_names_them(tmp_path: Path) -> None:
    """Issue 38: a "(folded)" row comes after the row it folds, before the next one recorded; it says how
    many, of what, in the right number — not "the previous one", which is no row of the audit table."""
    host = RefusalsHost()
    with anyio.fail_after(60):
        async with hostile("refused-repeat").open(spec(tmp_path), host) as running:
            await running.init(init_params())
            await running.deliver(deliver_params(), timeout=40)
            while len(host.refusals) < 3:
                await anyio.sleep(0.01)
    assert [method for method, _, _ in host.refusals] == ["model.request", "(folded)", "nope.method"]
    assert host.refusals[1][2] == (
        "refusals not recorded one by one: model.request refused 2 more times the same way (-32602)"
    )  # and nothing was left to fold at the box's end: no fourth row


async def test_refusals_the_host_recorded_itself_are_never_folded(tmp_path: Path) -> None:
    """Issue 38: the gateway audits every request its handler refuses, so none is "not recorded one by one";
    they still count against the box's budget."""
    denied = RpcError(ErrorCode.DENIED, "denied by policy rule default-deny")
    host = RefusalsHost(answers=[denied])
    with anyio.fail_after(60):
        async with hostile("denied-repeat").open(spec(tmp_path), host) as running:
            await running.init(init_params())
            await running.deliver(deliver_params(), timeout=40)
            while host.model_calls < 2:
                await anyio.sleep(0.01)
    assert host.model_calls == 2  # each one reached the host's handler (the gateway writes its row)
    assert host.refusals == []  # and no "(folded)" row claims one of them was left out


@pytest.mark.parametrize(
    ("held", "reason"),
    [
        (HeldBack("model.request:-32602", 1, 0), "model.request refused 1 more time the same way (-32602)"),
        (HeldBack("a.b:-32601", 3, 0), "a.b refused 3 more times the same way (-32601)"),
        (HeldBack("a.b:-32601", 0, 1), "1 more refusal over the budget (B)"),
        (HeldBack("a.b:-32601", 2, 5), "a.b refused 2 more times the same way (-32601); 5 more refusals over the budget (B)"),
        (HeldBack("a.b:-32601", 0, 0), None),
    ],
)  # fmt: skip
def test_folded_refusals_words(held: HeldBack, reason: str | None) -> None:
    expected = None if reason is None else f"refusals not recorded one by one: {reason}"
    assert folded_refusals(held, "B") == expected


async def test_a_box_cannot_forge_a_line_of_the_host_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from impyard.gateway.policy import load_policy
    from impyard.gateway.surfaces import TerminalSurface
    from impyard.host import build_gateway
    from impyard.storage.db import open_database

    db = open_database(tmp_path / "impyard.db")
    gateway = build_gateway(policy=load_policy(), db=db, surface=TerminalSurface())
    forged = "hello\n2026-12-03 06:00:00 ERROR impyard.gateway.core: budget reset\r\x1b[2J\u202e"
    with caplog.at_level(logging.DEBUG):
        await gateway.serve(
            spec(tmp_path), "log", LogParams(level="warning", message=forged, fields={"k\nx": "v\n"})
        )
    await gateway.aclose()
    db.close()
    [record] = [r for r in caplog.records if r.name == "impyard.box.evil"]
    shown = record.getMessage()
    assert "\n" not in shown and "\r" not in shown and "\x1b" not in shown and "\u202e" not in shown
    assert "hello\\x0a2026-12-03" in shown and "box evil/c1:" in shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain words, ünïcode kept", "plain words, ünïcode kept"),
        ("two\nlines", "two\\x0alines"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("rtl\u202eoverride", "rtl\\u202eoverride"),
        ("line\u2028separator", "line\\u2028separator"),
        ("x" * 10, "xxxx…"),
    ],
)
def test_printable_escapes_what_could_forge_a_line(text: str, shown: str) -> None:
    assert printable(text, limit=4 if text == "x" * 10 else 2000) == shown


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_noise_meter_burst_then_rate_then_fold_then_kill() -> None:
    clock = Clock()
    meter = NoiseMeter(NoiseLimits(burst=3, per_s=1.0, kill_after=5), clock)
    assert [meter.admit(f"l{n}").show for n in range(4)] == [True, True, True, False]  # a burst of 3
    clock.t = 1.0  # one token back
    assert meter.admit("l4") == Admission(
        show=True, summary="1 line dropped (over 3 at once, then 1/s)", held=HeldBack("l2", 0, 1)
    )  # one line, not "1 lines"
    assert [meter.admit("l4").show for _ in range(2)] == [False, False]  # repeats are folded
    clock.t = 2.0
    assert meter.admit("l5").summary == "the previous one repeated 2 more times"
    assert meter.suppressed == 3
    meter.admit("l5"), meter.admit("l5")
    final = meter.admit("l5")  # the sixth held back: past kill_after
    assert final.kill and not final.show and meter.killed
    assert meter.flush() == "the previous one repeated 3 more times"  # told once, at the box's end
    assert meter.flush() is None


# ------------------------------------------------------------------ also close: /state cannot change the program


async def test_nothing_under_state_changes_which_program_the_next_box_runs(tmp_path: Path) -> None:
    state = tmp_path / "pip" / "state"
    marker = tmp_path / "hijacked"
    payload = f"open({str(marker)!r}, 'w').write('ran')\n"
    (state / "box").mkdir(parents=True)
    (state / "box" / "__init__.py").write_text(payload)  # a package that shadows the real box
    (state / "box" / "__main__.py").write_text(payload)
    (state / "sitecustomize.py").write_text(payload)
    user_site = (
        state
        / ".local"
        / "lib"
        / f"python{sys.version_info.major}.{sys.version_info.minor}"
        / "site-packages"
    )
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(payload)
    (user_site / "evil.pth").write_text(f"import os; {payload}")
    async with ProcessBackend(warn=False).open(BoxSpec("pip", "c1", state), ScriptedHost()) as running:
        result = await running.init(init_params())
    assert result.box == "0.1.0"
    assert not marker.exists()


async def test_a_box_runs_in_its_own_session_so_ctrl_c_never_reaches_it(tmp_path: Path) -> None:
    async with ProcessBackend(warn=False).open(spec(tmp_path, "pip"), ScriptedHost()) as running:
        await running.init(init_params())
        assert os.getsid(running.process.pid) == running.process.pid != os.getsid(0)


class _Exploding:
    """A backend whose box breaks in ways nobody foresaw: at start, or in the middle of a turn."""

    name = "exploding"

    def __init__(self, when: str) -> None:
        self.when = when

    @asynccontextmanager
    async def open(self, spec: BoxSpec, host: object) -> AsyncIterator[object]:
        if self.when == "start":
            raise KeyError("no such thing")
        when = self.when

        class Box:
            async def init(self, params: object, *, timeout: float) -> None:
                return None

            async def deliver(self, params: object, *, timeout: float) -> None:
                if when == "turn":
                    raise ZeroDivisionError("the unforeseen")
                async with anyio.create_task_group() as tg:  # a helper of the box fails under the turn
                    tg.start_soon(_fail_soon)
                    await anyio.sleep_forever()

            async def kill(self) -> None:
                return None

        yield Box()


async def _fail_soon() -> None:
    raise OSError("a helper task failed")


@pytest.mark.parametrize(
    ("when", "error"), [("start", "KeyError"), ("turn", "ZeroDivisionError"), ("helper", "OSError")]
)
async def test_an_unexpected_error_in_one_session_is_reported_and_contained(
    tmp_path: Path, when: str, error: str
) -> None:
    evil, honest = SessionKey("evil", "c1"), SessionKey("pip", "c1")
    backends = {"evil": _Exploding(when), "pip": ProcessBackend(warn=False)}
    recorder = Recorder()
    async with sessions_of(tmp_path, backends, recorder) as sessions:  # type: ignore[arg-type]
        sessions.deliver(delivery(1, key=evil))
        await recorder.until(lambda: "m1" in recorder.answered())
        sessions.deliver(delivery(2, key=honest))
        await recorder.until(lambda: "m2" in recorder.answered())
    outcomes = {ids[0]: result for ids, result in recorder.outcomes}
    assert outcomes["m1"].outcome == "failed" and (outcomes["m1"].error or "").startswith(error)
    assert outcomes["m2"].outcome == "sent"
    assert recorder.notices == [DIED_NOTICE]
