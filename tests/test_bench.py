"""The benchmark runs end to end and writes well-formed results. No timing assertions: timing is the benchmark's job."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.__main__ import SCENARIOS
from bench.harness import SCENARIO_KEYS, Plan
from bench.memory import (
    MEMORY_OFF,
    MEMORY_ON,
    MEMORY_RULES,
    covered,
    near,
    round_trip,
    seed,
    sequential,
    unit_rows,
)
from impyard.backends import BoxSpec
from impyard.db import open_database
from impyard.memory.scopes import SessionScopes
from impyard.memory.service import memory_service

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_the_quick_benchmark_writes_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["quick"] is True and results["environment"]["cores"]
    assert "process" in results["backends"]["measured"]
    assert list(results["scenarios"]) == list(SCENARIOS)
    for name, scenario in results["scenarios"].items():
        assert set(SCENARIO_KEYS) <= set(scenario), name
        assert isinstance(scenario["met"], bool), name
        assert scenario["status"] in ("ok", "not built yet"), (name, scenario["status"])
        if scenario["status"] == "ok":
            assert scenario["samples"] > 0 and scenario["baseline"]["samples"] > 0, name
            assert scenario["p50_ms"] <= scenario["p95_ms"] <= scenario["p99_ms"], name
            assert scenario["targets"], name
    check_runtimes(results)
    check_memory_recall(results["scenarios"]["memory_recall"])
    check_memory_turn(results["scenarios"]["memory_turn"])
    check_memory_night(results["scenarios"]["memory_night"])


def check_runtimes(results: dict[str, Any]) -> None:
    """Issue 22: where the engine has runsc, the warm turn and the cold start are measured under it beside
    runc, each cold box against its own runtime's bare `docker run`, taken in the same run; where it has
    not, the results say why."""
    measured, skipped = results["backends"]["measured"], results["backends"]["skipped"]
    assert "runsc" in measured or "runsc" in skipped
    if "runsc" not in measured:
        return
    assert {"docker", "runsc"} <= set(results["scenarios"]["warm_turn"]["variants"])
    cold = results["scenarios"]["cold_warm"]["variants"]
    for name, runtime in (("docker", "runc"), ("runsc", "runsc")):
        floor, command = cold[name]["cold"]["floor"], cold[name]["cold"]["floor_command"]
        assert floor["samples"] == cold[name]["cold"]["samples"] > 0, name
        assert command[command.index("--runtime") + 1] == runtime, name
        assert cold[name]["ratio_floor_p50"] > 0, name
    assert "runsc" not in results["scenarios"]["burst"]["variants"]  # only cold start and warm turn


# ------------------------------------------------------------------ the memory scenarios (issue 23)


def check_memory_recall(s: dict[str, Any]) -> None:
    """Every size measured through the round trip, found what the host's own search finds, and reported
    its first load, cache bytes, RSS and the float16 overlap."""
    assert s["status"] == "ok", s["status"]
    plan = Plan.quick()
    assert [int(size) for size in s["sizes"]] == list(plan.memory_sizes)
    for size, v in s["sizes"].items():
        assert v["samples"] == plan.memory_searches and v["baseline"]["samples"] == plan.memory_searches, size
        assert 0 < v["p50_ms"] <= v["p99_ms"] and 0 < v["baseline"]["p50_ms"], size
        assert v["same_as_direct"] == v["samples"], size  # the round trip ranks exactly as the store does
        assert v["total"] == v["records"] == int(size) and v["first_found"] == 10, size
        assert v["first_search_ms"] > 0 and v["cache_loads"] == 1 and v["cache_refreshes"] == 0, size
        assert v["cache_bytes"] > v["records"] * v["dims"] * 4, size  # at least the float32 record matrix
        assert isinstance(v["rss_growth_mib"], float), size
        assert 0.0 <= v["overlap_at_10"] <= 1.0 and 0.0 <= v["overlap_at_10_random_queries"] <= 1.0, size
    assert set(s["checks"]) == {"overlap_at_10"}  # the latency verdict needs the 100,000 size


def check_memory_turn(s: dict[str, Any]) -> None:
    """Model calls, tokens and memory.* requests counted per turn on both imps, split at the reply."""
    assert s["status"] == "ok", s["status"]
    on, off = s["memory_on"], s["memory_off"]
    assert s["samples"] == s["baseline"]["samples"] == Plan.quick().memory_turns
    # memory off: the reply is the one model call, and no memory.* request is made
    assert off["model_calls_total"] == off["model_calls_before_reply"] == 1
    assert off["memory_requests_total"] == 0 and off["by_purpose_total"] == {"reply": 1.0}
    # memory on: recall's embedding and the reply before it is sent; the appraisal after
    assert {"embedding", "reply"} <= set(on["by_purpose_before_reply"])
    assert "appraisal" in on["by_purpose_total"] and "appraisal" not in on["by_purpose_before_reply"]
    assert on["model_calls_total"] > on["model_calls_before_reply"] >= 2
    assert 2 <= on["sequential_before_reply_max"] <= on["model_calls_before_reply"] + 1
    assert on["tokens_total"] > off["tokens_total"] > 0
    assert on["memory_requests_total"] > on["memory_requests_before_reply"] > 0
    assert {"search", "encode"} <= set(on["memory_by_method"])
    assert s["records_after"] > s["remembered_before"]  # the turns' moments were kept
    assert set(s["first_turn"]) == {MEMORY_ON, MEMORY_OFF, MEMORY_RULES}
    # memory II (issue 14): the imp with 100 learned rules selects beside recall, and a departure reflects
    rules = s["rules_turn"]
    assert rules["rules"] == 100 and rules["by_purpose_before_reply"].get("selection") == 1.0
    assert "selection" not in on["by_purpose_total"]  # no rule learned: no selection call
    task = s["reflection"]
    assert task["state"] == "done" and task["by_purpose"]["introspection"] == 4  # the fake keeps thinking
    assert "reply" not in task["by_purpose"] and task["model_calls"] >= 5


def test_sequential_counts_calls_that_waited_for_one_another() -> None:
    assert sequential([]) == 0
    assert sequential([(0, 1), (1, 2), (2, 3)]) == 3  # embedding → filter → reply
    assert sequential([(0, 1), (0.5, 1.5), (1.5, 2.5)]) == 2  # a summary beside the embedding counts once
    assert sequential([(0, 3), (0.1, 1), (1, 2), (2, 2.9)]) == 3
    assert covered([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)
    assert covered([]) == 0.0


@pytest.mark.anyio
async def test_seeded_memories_come_back_through_the_memory_round_trip(tmp_path: Path) -> None:
    db = open_database(tmp_path / "memory.db")
    try:
        service = memory_service(db, lambda: datetime.now(UTC))
        rng = np.random.default_rng(1)
        records = unit_rows(rng, 40)
        seed(service.store, "imp", "dm:u1", records, near(rng, records, 0.8), datetime.now(UTC))
        scopes = SessionScopes("dm:u1", ("dm:u1",))
        spec = BoxSpec(imp="imp", channel_id="c1", state_dir=tmp_path / "state")
        async with round_trip(service, spec, scopes) as client:
            found = await client.search(records[7].tolist(), k=10, episodes=3)
        assert found.total == 40 and len(found.records) == 10
        assert all(len(r.episodes) == 1 and r.episodes[0].record_id == r.id for r in found.records)
        direct = service.store.scoped("imp", scopes, "c1").search(records[7].tolist(), (), 10)
        assert [r.id for r in found.records] == [r.id for r in direct]
        other = memory_service(db, lambda: datetime.now(UTC)).store.scoped(
            "imp", SessionScopes("dm:u2", ()), "c2"
        )
        assert other.search(records[7].tolist()) == []  # seeded in its scope only
    finally:
        db.close()


def check_memory_night(s: dict[str, Any]) -> None:
    """A night over each size in a real box: done, the plan folded, faded records forgotten, the box measured."""
    assert s["status"] == "ok" and s["met"] is True, s
    assert [int(size) for size in s["sizes"]] == list(Plan.quick().night_sizes)
    for size, night in [("base", s["base"]), *s["sizes"].items()]:
        assert night["state"] == "done" and night["summary"].startswith("folded 2 records into 1"), (
            size,
            night,
        )
        assert night["box_peak_rss_mib"] and night["box_peak_rss_mib"] > 0, size
    for size, night in s["sizes"].items():
        assert night["records_before"] == int(size) + 20 > night["records_after"], size  # forgetting ran
        assert night["db_mib_before"] >= night["db_mib_after"], size
