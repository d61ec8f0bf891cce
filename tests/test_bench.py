"""The benchmark runs end to end and writes well-formed results. No timing assertions: timing is the benchmark's job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import SCENARIOS
from bench.harness import SCENARIO_KEYS

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_the_quick_benchmark_writes_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
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
