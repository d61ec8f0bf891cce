"""The cluster's rows (``impyard.storage.cluster``: what ``impyard hosts`` and the console's Hosts page show) and what
a host's record says of the imps it serves (``HostCard.boxes``, issue 34): a record is another process's words, so
nothing in it is trusted to be well formed, and a host serving many imps never writes a record too big to keep."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from impyard.cli import cli
from impyard.clock import FixedClock, SystemClock
from impyard.storage.cluster import cluster, lease_kind
from impyard.storage.db import open_database
from impyard.storage.leases import MAX_DETAIL_CHARS, HostCard, ImpBoxes, LeaseInfo, LeaseStore, _detail_text
from impyard.storage.liveness import Holder

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
FAR = Holder("far-away", "b00t", 4242, "9")


def host(detail: dict[str, Any], expires_in_s: float = 20) -> LeaseInfo:
    return LeaseInfo("host:far-away/4242", FAR, str(FAR), 1, NOW - timedelta(minutes=5), NOW - timedelta(seconds=4),
                     NOW + timedelta(seconds=expires_in_s), detail)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "kind"),
    [("host:a/1", "host"), ("shard:0/2", "shard"), ("channel:terminal:ann", "channel"), ("task:t/r", "task"),
     ("something", "other"), ("weird:thing", "other")],
)  # fmt: skip
def test_a_lease_s_kind_is_read_from_its_name(name: str, kind: str) -> None:
    assert lease_kind(name) == kind


@pytest.mark.parametrize(
    ("boxes", "parsed"),
    [
        (None, None),  # an older host says nothing of its imps
        ("many", None),
        ([], ()),
        ([{"imp": "pip", "warm": 2, "backend": "docker", "runtime": "runsc", "runtime_setting": "auto (the default)"}],
         (ImpBoxes("pip", 2, "docker", "runsc", "auto (the default)"),)),
        ([{"imp": "pip", "warm": -1, "backend": "docker"}, {"imp": "bo", "warm": True, "backend": "docker"},
          {"imp": 3, "warm": 1, "backend": "docker"}, "pip", {"imp": "cy", "warm": 1, "backend": "process",
          "runtime": 7}],
         (ImpBoxes("cy", 1, "process"),)),
        ([{"imp": "p" * 500, "warm": 1, "backend": "b" * 500}], (ImpBoxes("p" * 80, 1, "b" * 80),)),
    ],
)  # fmt: skip
def test_what_a_host_says_of_its_boxes_is_taken_only_when_well_formed(boxes: Any, parsed: Any) -> None:
    detail = {"command": "serve"} if boxes is None else {"command": "serve", "boxes": boxes}
    (row,) = cluster([host(detail)], NOW, alive=lambda holder: None).hosts
    assert row.boxes == parsed
    assert ("boxes" in row.as_json()) == (parsed is not None)


def test_only_a_live_host_serves_an_imp() -> None:
    boxes = [{"imp": "pip", "warm": 1, "backend": "docker"}]
    live = cluster([host({"boxes": boxes})], NOW, alive=lambda holder: None)
    assert [(row.host, box.warm) for row, box in live.serving("pip")] == [("far-away", 1)]
    assert live.serving("bo") == []
    assert (
        cluster([host({"boxes": boxes}, expires_in_s=-1)], NOW, alive=lambda holder: None).serving("pip")
        == []
    )
    assert cluster([host({"boxes": boxes})], NOW, alive=lambda holder: False).serving("pip") == []  # dead


def test_a_host_serving_many_imps_keeps_a_record_that_fits() -> None:
    many = [ImpBoxes(f"imp-{n:03d}", n % 3, "docker", "runsc", "auto (the default)") for n in range(500)]
    detail = HostCard("serve", "/srv/yard", boxes=lambda: many).detail()
    text = _detail_text(detail)
    assert len(text) <= MAX_DETAIL_CHARS and "truncated" not in text
    kept = detail["boxes"]
    assert 100 < len(kept) < 500 and detail["boxes_more"] == 500 - len(kept)
    assert [box["warm"] for box in kept[:3]] == [2, 2, 2]  # the imps with warm boxes first
    assert HostCard("chat", "/h").detail().keys() == {
        "home",
        "command",
        "shard",
        "warm_boxes",
        "spare_boxes",
        "started_at",
    }
    broken = HostCard("chat", "/h", boxes=lambda: 1 / 0).detail()  # type: ignore[arg-type, return-value]
    assert broken["boxes"] == []  # a list of boxes is never worth a lost lease


def test_hosts_shows_a_garbled_start_as_unknown(impyard_home: object) -> None:
    db = open_database()
    try:
        LeaseStore(db, FixedClock(SystemClock().now()), me=FAR).acquire(
            "host:far-away/4242",
            {"command": "serve", "started_at": "yesterday", "warm_boxes": 1},
            timedelta(hours=1),
        )
    finally:
        db.close()
    result = CliRunner().invoke(cli, ["hosts"])
    assert result.exit_code == 0, result.output
    row = result.output.splitlines()[1].split("\t")
    assert row[:6] == ["far-away", "4242", "serve", "-", "1", "-"] and row[8] == "?"
    (listed,) = json.loads(CliRunner().invoke(cli, ["hosts", "--json"]).output)["hosts"]
    assert listed["started_at"] == "yesterday"  # as the host wrote it
