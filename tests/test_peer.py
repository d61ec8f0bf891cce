"""The JSON-RPC peer: round trips both ways, id matching, notifications, errors, and hostile input."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from box.protocol import BOX_METHODS, HOST_METHODS, ErrorCode, Peer, PeerClosed, RpcError
from box.protocol.models import (
    BoxInitResult,
    DeliverParams,
    DeliverResult,
    ModelRequestParams,
    ModelRequestResult,
    TurnStageParams,
)
from testing.pipes import byte_pipe
from tests.scripted import deliver_params, init_params

pytestmark = pytest.mark.anyio


@dataclass
class Recorder:
    """A handler that records calls and answers from a small table."""

    calls: list[tuple[str, BaseModel]] = field(default_factory=list)
    delays: dict[str, float] = field(default_factory=dict)

    async def __call__(self, method: str, params: BaseModel) -> BaseModel | None:
        self.calls.append((method, params))
        if method == "box.init":
            return BoxInitResult(protocol=1, box="test")
        if method == "mailbox.deliver":
            assert isinstance(params, DeliverParams)
            await anyio.sleep(self.delays.get(params.message.id, 0))
            return DeliverResult(outcome="sent", message_ids=[f"reply-to-{params.message.id}"])
        if method == "model.request":
            return ModelRequestResult(status=200, body={"echo": params.purpose})  # type: ignore[attr-defined]
        if method == "discord.send":
            raise RpcError(ErrorCode.DENIED, "denied by policy", {"rule": "no-sends", "reason": "test"})
        if method == "turn.stage":
            return None
        raise RuntimeError("boom: secret internals")


@asynccontextmanager
async def connected(host_handler: Any, box_handler: Any) -> AsyncIterator[tuple[Peer, Peer]]:
    host_out, box_in = byte_pipe()
    box_out, host_in = byte_pipe()
    host = Peer(host_in, host_out, serves=HOST_METHODS, calls=BOX_METHODS, handler=host_handler)
    box = Peer(box_in, box_out, serves=BOX_METHODS, calls=HOST_METHODS, handler=box_handler)
    async with anyio.create_task_group() as tg:
        tg.start_soon(host.run)
        tg.start_soon(box.run)
        yield host, box
        tg.cancel_scope.cancel()


async def test_round_trip_host_to_box() -> None:
    async with connected(Recorder(), Recorder()) as (host, _box):
        result = await host.request("box.init", init_params(), timeout=5)
    assert result == BoxInitResult(protocol=1, box="test")


async def test_requests_flow_both_ways_while_one_is_in_flight() -> None:
    box_side = Recorder()
    host_side = Recorder()
    peers: dict[str, Peer] = {}

    async def box_handler(method: str, params: BaseModel) -> BaseModel | None:
        # The box asks the host for a model call in the middle of serving a delivery.
        answer = await peers["box"].request(
            "model.request", ModelRequestParams(path="/chat/completions", body={}, purpose="reply"), timeout=5
        )
        assert isinstance(answer, ModelRequestResult) and answer.body == {"echo": "reply"}
        return await box_side(method, params)

    async with connected(host_side, box_handler) as (host, box):
        peers["box"] = box
        result = await host.request("mailbox.deliver", deliver_params(), timeout=5)
    assert isinstance(result, DeliverResult) and result.outcome == "sent"
    assert [method for method, _ in host_side.calls] == ["model.request"]


async def test_concurrent_requests_are_matched_by_id() -> None:
    box_side = Recorder(delays={"m1": 0.15, "m2": 0.1, "m3": 0.05, "m4": 0.0})
    results: dict[str, BaseModel] = {}
    async with connected(Recorder(), box_side) as (host, _box):

        async def one(message_id: str) -> None:
            results[message_id] = await host.request(
                "mailbox.deliver", deliver_params(message_id=message_id), timeout=5
            )

        async with anyio.create_task_group() as tg:
            for message_id in ("m1", "m2", "m3", "m4"):
                tg.start_soon(one, message_id)
    assert {key: value.message_ids for key, value in results.items()} == {  # type: ignore[attr-defined]
        key: [f"reply-to-{key}"] for key in ("m1", "m2", "m3", "m4")
    }


async def test_notifications_arrive_in_order() -> None:
    host_side = Recorder()
    async with connected(host_side, Recorder()) as (_host, box):
        for stage in ("context", "render", "send", "post"):
            await box.notify("turn.stage", TurnStageParams(message_id="m1", stage=stage))  # type: ignore[arg-type]
        with anyio.fail_after(5):
            while len(host_side.calls) < 4:
                await anyio.sleep(0.01)
    assert [params.stage for _, params in host_side.calls] == ["context", "render", "send", "post"]  # type: ignore[attr-defined]


async def test_handler_error_reaches_the_requester_with_code_and_data() -> None:
    async with connected(Recorder(), Recorder()) as (_host, box):
        from box.protocol.models import DiscordSendParams

        with pytest.raises(RpcError) as caught:
            await box.request("discord.send", DiscordSendParams(channel_id="c1", content="hi"), timeout=5)
    assert caught.value.code == ErrorCode.DENIED
    assert caught.value.data == {"rule": "no-sends", "reason": "test"}


async def test_unexpected_handler_failure_is_an_internal_error_without_details() -> None:
    async def broken(method: str, params: BaseModel) -> BaseModel | None:
        raise RuntimeError("boom: secret internals")

    async with connected(Recorder(), broken) as (host, _box):
        with pytest.raises(RpcError) as caught:
            await host.request("box.init", init_params(), timeout=5)
    assert caught.value.code == ErrorCode.INTERNAL_ERROR
    assert "secret" not in caught.value.message


async def test_timeout_when_the_other_side_never_answers() -> None:
    async def never(method: str, params: BaseModel) -> BaseModel | None:
        await anyio.sleep_forever()
        return None

    async with connected(Recorder(), never) as (host, _box):
        with pytest.raises(TimeoutError):
            await host.request("box.init", init_params(), timeout=0.1)


# ------------------------------------------------------------------ hostile bytes, raw


@dataclass
class RawHarness:
    """A real Peer on one side; raw bytes on the other."""

    peer: Peer
    write: Any
    lines: list[dict[str, Any]]
    violations: list[str]

    async def send_raw(self, data: bytes) -> None:
        await self.write.send(data)

    async def next_line(self) -> dict[str, Any]:
        with anyio.fail_after(5):
            while not self.lines:
                await anyio.sleep(0.005)
        return self.lines.pop(0)


@asynccontextmanager
async def raw_peer(serves: str, max_line_bytes: int = 4096) -> AsyncIterator[RawHarness]:
    to_peer, peer_in = byte_pipe()
    peer_out, from_peer = byte_pipe()
    violations: list[str] = []
    serves_table, calls_table = (
        (BOX_METHODS, HOST_METHODS) if serves == "box" else (HOST_METHODS, BOX_METHODS)
    )
    peer = Peer(
        peer_in,
        peer_out,
        serves=serves_table,
        calls=calls_table,
        handler=Recorder(),
        on_violation=violations.append,
        max_line_bytes=max_line_bytes,
    )
    lines: list[dict[str, Any]] = []

    async def collect() -> None:
        buffer = b""
        async for chunk in from_peer:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                lines.append(json.loads(line))

    async with anyio.create_task_group() as tg:
        tg.start_soon(peer.run)
        tg.start_soon(collect)
        yield RawHarness(peer, to_peer, lines, violations)
        tg.cancel_scope.cancel()


def _request(method: str, params: Any, frame_id: Any = 7) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": frame_id, "method": method, "params": params}).encode() + b"\n"


INIT = init_params().model_dump(mode="json")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"this is not json\n", ErrorCode.PARSE_ERROR),
        (b"\xff\xfe\x00garbage\n", ErrorCode.PARSE_ERROR),
        (b"[1, 2, 3]\n", ErrorCode.INVALID_REQUEST),
        (b'{"hello": "world"}\n', ErrorCode.INVALID_REQUEST),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "box.init"}\n', ErrorCode.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": true, "method": "box.init"}\n', ErrorCode.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 3}\n', ErrorCode.INVALID_REQUEST),
        (_request("box.explode", {}), ErrorCode.METHOD_NOT_FOUND),
        (_request("model.request", {}), ErrorCode.METHOD_NOT_FOUND),  # a host method, sent to the box
        (_request("box.init", {"protocol": "one", "imp": 5}), ErrorCode.INVALID_PARAMS),
        (_request("box.init", [1, 2]), ErrorCode.INVALID_PARAMS),
        (_request("mailbox.deliver", {"message": {"id": "m"}}), ErrorCode.INVALID_PARAMS),
    ],
)
async def test_bad_input_gets_an_error_and_the_peer_stays_alive(raw: bytes, code: int) -> None:
    async with raw_peer("box") as harness:
        await harness.send_raw(raw)
        error = await harness.next_line()
        assert error["error"]["code"] == code
        # Still alive: a good request right after is answered.
        await harness.send_raw(_request("box.init", INIT, frame_id=99))
        reply = await harness.next_line()
        assert reply == {"jsonrpc": "2.0", "id": 99, "result": {"protocol": 1, "box": "test"}}


async def test_over_long_line_is_refused_and_dropped() -> None:
    async with raw_peer("box", max_line_bytes=2048) as harness:  # box.init alone is ~1,000 bytes
        await harness.send_raw(_request("box.init", {**INIT, "pad": "x" * 4000}))
        error = await harness.next_line()
        assert error["id"] is None and error["error"]["code"] == ErrorCode.INVALID_REQUEST
        assert "too long" in error["error"]["message"]
        await harness.send_raw(_request("box.init", INIT, frame_id=8))
        assert (await harness.next_line())["id"] == 8
        assert harness.violations and "exceeds" in harness.violations[0]


async def test_box_side_ignores_unknown_fields_from_a_newer_host() -> None:
    async with raw_peer("box") as harness:
        await harness.send_raw(_request("box.init", {**INIT, "future_field": {"x": 1}}))
        assert "result" in await harness.next_line()


async def test_host_side_refuses_unknown_fields_from_a_box() -> None:
    params = {"path": "/chat/completions", "body": {}, "purpose": "reply", "sneaky": "extra"}
    async with raw_peer("host") as harness:
        await harness.send_raw(_request("model.request", params))
        error = await harness.next_line()
    assert error["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert any(item["loc"] == "sneaky" for item in error["error"]["data"])


async def test_response_to_an_unknown_id_is_a_violation_not_a_crash() -> None:
    async with raw_peer("host") as harness:
        await harness.send_raw(b'{"jsonrpc": "2.0", "id": 12345, "result": {}}\n')
        await harness.send_raw(
            _request("model.request", {"path": "/embeddings", "body": {}, "purpose": "embedding"})
        )
        assert (await harness.next_line())["result"]["status"] == 200
        assert harness.violations == ["response to unknown id 12345"]


async def test_pending_requests_fail_when_the_stream_ends() -> None:
    async with raw_peer("host") as harness:
        async with anyio.create_task_group() as tg:
            outcome: list[BaseException] = []

            async def ask() -> None:
                try:
                    await harness.peer.request("box.init", init_params(), timeout=5)
                except PeerClosed as exc:
                    outcome.append(exc)

            tg.start_soon(ask)
            await harness.next_line()  # the request went out
            await harness.write.aclose()  # ... and the other side vanished
        assert len(outcome) == 1


async def test_a_result_that_does_not_match_the_schema_fails_the_request() -> None:
    from box.protocol import ProtocolViolation

    async with raw_peer("host") as harness:
        async with anyio.create_task_group() as tg:
            errors: list[BaseException] = []

            async def ask() -> None:
                try:
                    await harness.peer.request("box.init", init_params(), timeout=5)
                except ProtocolViolation as exc:
                    errors.append(exc)

            tg.start_soon(ask)
            request = await harness.next_line()
            await harness.send_raw(
                json.dumps(
                    {"jsonrpc": "2.0", "id": request["id"], "result": {"protocol": 1, "box": "x", "evil": 1}}
                ).encode()
                + b"\n"
            )
        assert errors and harness.violations == ["invalid result"]
