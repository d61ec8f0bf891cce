"""``python -m bench.ledgerload IMP THREADS ESTIMATE_MICROS CAP_MICROS AT MAX_PAIRS``: one process of the ``ledger``
scenario.

It opens the database ``IMPYARD_DATABASE_URL`` names, as a host does, with a policy whose only binding cap is IMP's
day (CAP_MICROS), and a clock that stands at AT. On go (``bench.children``) THREADS threads meet at a barrier, then
each reserves ESTIMATE_MICROS and settles it at the full estimate, again and again, until the ledger refuses it
(or, should the ledger never refuse, after MAX_PAIRS). Its answer: each pair's latency, how many were granted,
which windows refused, errors, when the threads began and ended (``time.monotonic``), the cap the ledger read and
the database engine.
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import datetime

from bench.children import ready_then_wait, say
from impyard.clock import FixedClock
from impyard.gateway.ledger import BudgetExhausted, Ledger
from impyard.gateway.policy import Policy, policy_from_text
from impyard.gateway.prices import micros_to_usd
from impyard.storage.db import open_database


def policy(cap_micros: int) -> Policy:
    """A policy whose one binding cap is each imp's day; its month and the fleet's windows are far above it."""
    return policy_from_text(
        f"[budgets.per_imp]\ndaily_usd = {micros_to_usd(cap_micros)!r}\nmonthly_usd = 100000.0\n"
        "[budgets.all]\ndaily_usd = 100000.0\nmonthly_usd = 1000000.0\n"
    )


def main() -> None:
    imp, threads, estimate, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    at, max_pairs = datetime.fromisoformat(sys.argv[5]), int(sys.argv[6])
    db = open_database()
    ledger = Ledger(db, policy(cap), FixedClock(at))
    warmed = threading.Barrier(threads + 1)  # every thread warmed up, and the main thread: then say ready
    go = threading.Barrier(threads + 1)  # every thread, and the main thread once the parent said go
    pairs_ms: list[float] = []
    refused: list[str] = []
    errors: list[str] = []
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    def worker() -> None:
        mine: list[float] = []
        refusal, error = None, None
        try:
            ledger.limits(
                imp
            )  # imports, compiled statements and a pooled connection, before the clock starts
        except Exception:
            warmed.abort()  # the main thread stops, and says why on stderr
            raise
        try:
            warmed.wait()
            go.wait()
        except threading.BrokenBarrierError:
            return  # the parent stopped before the load began, or another thread could not warm up
        began = time.monotonic()
        try:
            while len(mine) < max_pairs:
                start = time.perf_counter()
                try:
                    reservation = ledger.reserve(imp, estimate, method="model.request", purpose="reply")
                except BudgetExhausted as exc:
                    refusal = exc.ledger
                    break
                ledger.settle(reservation, estimate)
                mine.append((time.perf_counter() - start) * 1000)
        except Exception as exc:  # noqa: BLE001 - reported in the answer: the scenario fails, naming it
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
        with lock:
            pairs_ms.extend(mine)
            spans.append((began, time.monotonic()))
            refused.extend([refusal] if refusal else [])
            errors.extend([error] if error else [])

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    try:
        for thread in pool:
            thread.start()
        warmed.wait()
        try:
            ready_then_wait()
        except BaseException:
            go.abort()  # the waiting threads return
            raise
        go.wait()
        for thread in pool:
            thread.join()
        say({
            "pairs_ms": [round(value, 3) for value in pairs_ms], "granted": len(pairs_ms), "threads": threads,
            "refused_by": sorted(refused), "errors": errors, "began": min(s[0] for s in spans),
            "ended": max(s[1] for s in spans), "cap_micros": ledger.limits(imp).daily, "dialect": db.dialect,
        })  # fmt: skip
    finally:
        db.close()


if __name__ == "__main__":
    main()
