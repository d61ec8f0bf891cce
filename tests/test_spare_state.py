"""A spare box's /state (issue 37, ``impyard.backends.handover``): the channel's files move into the spare's own dir
at its claim and back at its end, never copied, never followed through a link a box planted; what a dead host left
is handed back or removed, and what a running box holds is left alone."""

from __future__ import annotations

import os
from pathlib import Path

from impyard.backends.handover import hand_back, hand_in, note_path, sweep


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    channel = tmp_path / "state" / "channels" / "c1"
    spare = tmp_path / "state" / "spares" / "0123456789abcdef"
    channel.mkdir(parents=True)
    spare.mkdir(parents=True)
    return channel, spare


def test_the_channels_files_move_in_at_the_claim_and_back_at_the_end(tmp_path: Path) -> None:
    channel, spare = dirs(tmp_path)
    (channel / "journal.jsonl").write_text("turn 1\n")
    (channel / "memory-calls.jsonl").write_text("call 1\n")
    assert hand_in(channel, spare) == 2
    assert sorted(os.listdir(channel)) == [] and sorted(os.listdir(spare)) == [
        "journal.jsonl",
        "memory-calls.jsonl",
    ]
    with (spare / "journal.jsonl").open("a") as journal:  # the claimed box's own turn
        journal.write("turn 2\n")
    assert hand_back(spare) == channel
    assert (channel / "journal.jsonl").read_text() == "turn 1\nturn 2\n"
    assert not spare.exists() and not note_path(spare).exists()


def test_an_unclaimed_spares_dir_is_removed_and_nothing_is_handed_anywhere(tmp_path: Path) -> None:
    channel, spare = dirs(tmp_path)
    (spare / "scratch").write_text("x")
    assert hand_back(spare) is None
    assert not spare.exists() and os.listdir(channel) == []


def test_a_link_a_box_planted_is_moved_never_followed(tmp_path: Path) -> None:
    channel, spare = dirs(tmp_path)
    outside = tmp_path / "host-secret"
    outside.write_text("secret")
    hand_in(channel, spare)
    (spare / "journal.jsonl").symlink_to(outside)  # the box swaps its journal for a link to a host file
    (spare / "sub").mkdir()
    (spare / "sub" / "deep").symlink_to(tmp_path)
    channel.rmdir()
    channel.mkdir()
    (channel / "journal.jsonl").write_text("written meanwhile\n")  # the channel dir has a file of its own
    hand_back(spare)
    assert outside.read_text() == "secret"  # untouched
    assert (channel / "journal.jsonl").read_text() == "written meanwhile\n"  # never overwritten...
    assert (channel / f"journal.jsonl.{spare.name[:12]}").is_symlink()  # ...the box's kept beside it, a link
    assert (channel / "sub" / "deep").is_symlink() and not spare.exists()


def test_a_sweep_hands_back_what_a_dead_host_left_and_spares_a_running_boxs_dir(tmp_path: Path) -> None:
    channel, claimed = dirs(tmp_path)
    spares = claimed.parent
    (channel / "journal.jsonl").write_text("turn 1\n")
    hand_in(channel, claimed)  # the host died with this spare claimed
    unclaimed = spares / "feedfacefeedface"
    unclaimed.mkdir()
    running = spares / "cafebabecafebabe"
    running.mkdir()
    (running / "journal.jsonl").write_text("busy\n")
    assert sweep(spares, {running.resolve()}) == 2
    assert (channel / "journal.jsonl").read_text() == "turn 1\n"
    assert sorted(os.listdir(spares)) == ["cafebabecafebabe"]
