"""Every failure reads the same everywhere (issue 19 #5): the box's kind of failure and the host's words (tables)."""

from __future__ import annotations

import errno
import sqlite3
from datetime import UTC, datetime

import pytest

from box.attempts import ModelExhausted
from box.common.failures import split_tag, tagged
from box.failures import classify
from box.machine import SendFailed
from box.model import ModelCallFailed
from box.protocol import ErrorCode, RpcError
from impyard.failure_words import (
    FALLBACK_WORDS,
    MONTHLY_BUDGET_WORDS,
    WORDS,
    detail_of,
    missed_line,
    task_failure,
    words_for,
)
from impyard.terminal.turn_words import reason


def exhausted(*causes: str) -> ModelExhausted:
    return ModelExhausted(f"no usable answer after 3 attempts: {'; '.join(causes)}")


def send_failed(code: int, data: object = None) -> SendFailed:
    try:
        raise RpcError(code, "refused", data)
    except RpcError as exc:
        try:
            raise SendFailed("the reply was not delivered: refused") from exc
        except SendFailed as failed:
            return failed


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (exhausted("model returned HTTP 429: slow down"), "rate_limited"),
        (exhausted("model returned HTTP 500: boom", "model returned HTTP 502: bad gateway"), "upstream"),
        (
            exhausted("model returned HTTP 500", "model returned HTTP 429"),
            "rate_limited",
        ),  # the last attempt's
        (exhausted("model returned HTTP 429", "model returned HTTP 503"), "upstream"),
        (
            exhausted("model API unreachable: the model API did not answer within 40 s"),
            "timeout",
        ),  # a hung model
        (exhausted("model API unreachable: connection refused"), "unreachable"),
        (exhausted("rate limited by rule reply: at most 30 per minute; retry in 2 s"), "rate_limited"),
        (exhausted("model output is not a valid envelope: x"), "bad_answer"),
        (exhausted("model refused: no"), "bad_answer"),
        (RpcError(ErrorCode.DENIED, "denied by policy rule x: y"), "denied"),
        (
            RpcError(
                ErrorCode.DENIED,
                "refused before paying",
                {"rule": "send-own-channel", "kind": "send_limited"},
            ),
            "send_limited",
        ),  # issue 19 #3: the gateway's precheck, before the model was paid
        (RpcError(ErrorCode.DENIED, "denied", {"kind": "made-up"}), "denied"),
        (RpcError(ErrorCode.BUDGET_EXHAUSTED, "budget exhausted: budget imp:pip/day has ..."), "budget"),
        (RpcError(ErrorCode.INTERNAL_ERROR, "internal error in the host's gateway"), "host"),
        (RpcError(ErrorCode.INTERNAL_ERROR, "the host's storage failed: …", {"kind": "store"}), "store"),
        (RpcError(ErrorCode.DENIED, "denied", {"kind": "store"}), "denied"),  # only an internal error says so
        (send_failed(ErrorCode.INTERNAL_ERROR, {"kind": "store"}), "store"),
        (RpcError(ErrorCode.UPSTREAM_UNREACHABLE, "model API unreachable: no key"), "unreachable"),
        (RpcError(ErrorCode.INVALID_PARAMS, "bad"), "unknown"),
        (ModelCallFailed("model returned HTTP 429", status=429), "rate_limited"),
        (ModelCallFailed("model returned HTTP 500", status=500), "upstream"),
        (send_failed(ErrorCode.RATE_LIMITED), "send_limited"),  # a send limit, not the model's
        (send_failed(ErrorCode.DENIED), "denied"),
        (SendFailed("no cause"), "unknown"),
        (OSError(errno.ENOSPC, "No space left on device"), "store"),
        (OSError(errno.EROFS, "Read-only file system"), "store"),
        (sqlite3.OperationalError("database or disk is full"), "store"),
        (sqlite3.OperationalError("attempt to write a readonly database"), "store"),
        (sqlite3.OperationalError("no such table: x"), "unknown"),
        (TimeoutError(), "timeout"),
        (ValueError("what"), "unknown"),
        (None, "unknown"),
    ],
)
def test_the_box_classifies_each_failure(error: BaseException | None, kind: str) -> None:
    assert classify(error) == kind


@pytest.mark.parametrize(
    ("error", "split"),
    [
        ("[budget] budget exhausted: x", ("budget", "budget exhausted: x")),
        ("[timeout]no space", ("timeout", "no space")),
        ("[made_up] claims", ("unknown", "claims")),  # a box's tag is believed only when it is a known kind
        ("model returned HTTP 500", ("unknown", "model returned HTTP 500")),
        ("", ("unknown", "")),
        (None, ("unknown", "")),
        ("[rate_limited", ("unknown", "[rate_limited")),
    ],
)
def test_the_tag_reads_back(error: str | None, split: tuple[str, str]) -> None:
    assert split_tag(error) == split


def test_tagged_round_trips() -> None:
    assert split_tag(tagged("store", "disk full")) == ("store", "disk full")


@pytest.mark.parametrize(
    ("error", "words"),
    [
        ("[rate_limited] x", "The model is rate-limiting us — try again in a minute."),
        (
            "[upstream] model returned HTTP 500",
            "The model service is having trouble — try again in a few minutes.",
        ),
        ("[timeout] x", "The model didn't answer in time — try again in a moment."),
        ("[denied] denied by policy rule r: why", "That was blocked by policy, so I didn't answer."),
        (
            "[budget] budget exhausted: budget imp:pip/day has $0",
            "I'm over today's budget (resets at 00:00 UTC).",
        ),
        ("[budget] budget exhausted: budget all/month has $0", MONTHLY_BUDGET_WORDS),
        ("[store] [Errno 28] No space left on device", WORDS["store"]),
        ("[send_limited] x", WORDS["send_limited"]),
        ("[unknown] x", FALLBACK_WORDS),
        ("no tag at all", FALLBACK_WORDS),
        ("[made_up] pwned — say this", FALLBACK_WORDS),  # box text never becomes the host's words
    ],
)
def test_each_kind_has_its_own_line(error: str, words: str) -> None:
    assert words_for(error) == words


def test_every_kind_but_unknown_has_words_and_they_differ() -> None:
    from typing import get_args

    from box.common.failures import FailureKind

    kinds = [kind for kind in get_args(FailureKind) if kind != "unknown"]
    assert sorted(WORDS) == sorted(kinds)
    assert len(set(WORDS.values())) == len(WORDS)  # no two failures look the same
    assert all("\n" not in words and len(words) <= 120 for words in WORDS.values())  # one line


def test_the_imps_own_failure_notice_is_the_fallback_and_known_kinds_keep_their_words() -> None:
    assert words_for("[weird] x", "sorry!") == "sorry!"
    assert words_for("[rate_limited] x", "sorry!") == WORDS["rate_limited"]
    assert words_for("untagged", None) is None


@pytest.mark.parametrize(
    ("summary", "says"),
    [
        ("[rate_limited] no usable answer after 3 attempts: model returned HTTP 429",
         "The model is rate-limiting us — try again in a minute. "
         "(no usable answer after 3 attempts: model returned HTTP 429)"),
        ("model returned HTTP 500", "model returned HTTP 500"),
        ("", "no reason given"),
        ("[store] ", f"{WORDS['store']} (no reason given)"),
    ],
)  # fmt: skip
def test_task_show_says_the_words_then_the_detail(summary: str, says: str) -> None:
    assert task_failure(summary) == says


def test_the_terminal_reason_drops_the_tag() -> None:
    assert detail_of("[budget] budget exhausted: x (-32011)") == "budget exhausted: x (-32011)"
    assert reason("[budget] budget exhausted: x (-32011)") == "budget exhausted: x (see: impyard budget show)"


AT = datetime(2026, 3, 4, 14, 2, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("times", "name", "line"),
    [
        ([AT], None, "I missed your message from 14:02 UTC while I was restarting — please send it again."),
        (
            [AT.replace(minute=9), AT],
            "ann",
            "ann, I missed your 2 messages from 14:02–14:09 UTC while I was restarting — please send them again.",
        ),
        (
            [AT, AT.replace(second=50)],
            None,
            "I missed your 2 messages from 14:02 UTC while I was restarting — please send them again.",
        ),
    ],
)
def test_the_missed_line(times: list[datetime], name: str | None, line: str) -> None:
    assert missed_line(times, name) == line


def test_the_missed_line_needs_a_message() -> None:
    with pytest.raises(ValueError, match="at least one"):
        missed_line([])
