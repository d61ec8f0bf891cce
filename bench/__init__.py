"""The benchmark (issue 7; README.md, "Performance"): how fast and how cheap impyard is, each figure beside its baseline.

Run ``python -m bench`` (``--quick`` for a smoke run). Every scenario measures its
baseline in the same run and reports p50/p95/p99 and a ratio; results go to JSON
and a short table. Timing belongs here, never in the test suite.
"""
