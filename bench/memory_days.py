"""Issue 32, finding 7: are facts told once still there after 30 days, with the imp's nights on?

A held-out month, typed through the whole host (the process backend's real box, the gateway with the loopback
fake OpenAI, the host's store, on a movable clock): each of 30 days Ann opens a new conversation in her DM with
pip and makes four lines of small talk; on 12 of those days she tells one personal fact in the middle of it,
once. After each day pip sleeps (``impyard memory night pip --consolidate``'s code path, ``run_night``, on the
same clock, 3 hours after the day's last message). On day 31 each fact is asked back with a paraphrased question
(none holds the fact's evidence words), and a fact counts as recalled when its evidence reached the **memory
block** of one of that question's reply calls (the recorded requests of the fake OpenAI; the chat history the host
also sends is not counted: it is not memory). Also counted: the records the nights forgot.

The model is scripted and deterministic. Appraisals: small talk pleasant and faint (0.15-0.25), the facts with
varied feeling: seven pleasant (0.3-0.6, each told after pleasant small talk, so on the seed's rules it joins
the record the small talk opened) and five unpleasant (0.3-0.8). The appraisal calls each fact lasting and no
small talk (a checkout that does not ask for that field ignores it). Replies say "I see!"; the night's plan folds
nothing (the forgetting is what is measured); arrivals are a plain "glad" moment. Embedders: the real sentence
embedder (``bench/real_embedder.py``, all-MiniLM-L6-v2, 384 dimensions) served through the gateway embedder
from the fake's ``/embeddings``, and the hashing embedder (no calls).

Each evaluation runs in a subprocess of its own (``python bench/memory_days.py --embedder …``) with the code of
one checkout on ``PYTHONPATH`` (its box processes inherit it): this checkout, and, when
``BENCH_BASELINE_CHECKOUT`` names a checkout of main (``git worktree add ../base <commit>``), the same month on
that code in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

IMP = "pip"
PERSON_ID, PERSON = "ann-1", "Ann"
CHANNEL = "ann-dm"
DAYS = 30
SMALL_TALK_PER_DAY = 4
FACT_AFTER = 2  # the fact comes after this many lines of the day's small talk
NIGHT_AFTER_H = 3
WORKER_TIMEOUT_S = 3_600
BASELINE_ENV = "BENCH_BASELINE_CHECKOUT"
HERE = Path(__file__).resolve().parent.parent  # this checkout
TARGET = 11  # of 12, after 30 days with the nights on (issue 32)


@dataclass(frozen=True)
class Fact:
    day: int
    said: str
    conclusion: str
    valence: float
    intensity: float
    question: str
    evidence: tuple[str, ...]  # every word must reach the question's memory block (case-insensitive)


FACTS = (
    Fact(1, "oh and my little sister is called Maja, she just started school", "Ann's little sister is Maja.",
         0.4, 0.3, "What was my sister's name again?", ("maja",)),
    Fact(3, "I work as a nurse at the children's hospital, night shifts mostly", "Ann is a nurse at a children's hospital.",
         0.3, 0.4, "Do you remember what I do for a living?", ("nurse",)),
    Fact(5, "my dog Rex died last spring, I still miss him a lot", "Ann lost her dog Rex last spring.",
         -0.7, 0.7, "What happened to my old pet?", ("rex",)),
    Fact(7, "I grew up in Lisbon, right by the river", "Ann grew up in Lisbon.",
         0.5, 0.35, "Where did I spend my childhood?", ("lisbon",)),
    Fact(9, "I play the oboe in an amateur orchestra on Thursdays", "Ann plays the oboe in an orchestra.",
         0.6, 0.5, "Which instrument do I play?", ("oboe",)),
    Fact(11, "I'm badly allergic to peanuts, I carry an epipen", "Ann has a bad peanut allergy.",
         -0.4, 0.5, "Is there any food I must stay away from?", ("peanut",)),
    Fact(13, "my daughter Lena turns six on the 14th of March", "Ann's daughter Lena turns six on 14 March.",
         0.7, 0.6, "When is my kid's birthday?", ("march",)),
    Fact(15, "my father had a stroke in June and can't walk well since", "Ann's father had a stroke in June.",
         -0.8, 0.8, "What happened to my dad's health?", ("stroke",)),
    Fact(17, "we are moving to Bergen in the autumn", "Ann is moving to Bergen in the autumn.",
         0.5, 0.45, "Where are we relocating to?", ("bergen",)),
    Fact(20, "my favourite book is Momo by Michael Ende", "Ann's favourite book is Momo.",
         0.6, 0.3, "What novel do I love most?", ("momo",)),
    Fact(23, "I failed my driving test twice, it was humiliating", "Ann failed her driving test twice.",
         -0.5, 0.3, "How did my attempts at getting a licence go?", ("driving test",)),
    Fact(26, "my husband's name is Tomas, we met at university", "Ann's husband is Tomas.",
         0.5, 0.4, "What's my partner called?", ("tomas",)),
)  # fmt: skip

SMALL_TALK = (
    "good morning pip, how are you today?", "the weather is quite nice today", "I had porridge for breakfast",
    "the coffee here is pretty good", "I watched a bit of tv last night", "it's been a calm day so far",
    "the tram was on time for once", "I might go for a short walk later", "there's a nice breeze outside",
    "I just tidied up the kitchen", "the sky is very blue right now", "I'm having a cup of tea",
    "nothing much new, just a normal day", "I listened to some music on the way", "it's a bit cloudy now",
    "I bought some apples at the market", "the neighbour's cat is sitting on the fence", "lunch was a sandwich",
)  # fmt: skip


def small_talk(day: int, n: int) -> str:
    return SMALL_TALK[(day * SMALL_TALK_PER_DAY + n) % len(SMALL_TALK)]


def small_talk_feeling(line: str) -> tuple[float, float]:
    """Pleasant and faint, a little different line by line (deterministic)."""
    k = sum(map(ord, line))
    return 0.2 + 0.1 * (k % 3) / 2, 0.15 + 0.05 * (k % 3)  # valence 0.2-0.3, intensity 0.15-0.25


# ------------------------------------------------------------------ the scripted model


def _just_happened(request: Any) -> str:
    """The appraisal's "WHAT JUST HAPPENED": the exchange appraised, not the earlier events shown above it."""
    return json.dumps(request.body).split("WHAT JUST HAPPENED", 1)[-1]


def appraise(request: Any) -> dict[str, Any]:
    happened = _just_happened(request)
    for fact in FACTS:
        if json.dumps(fact.said)[1:-1] in happened:
            feeling = "warmth" if fact.valence > 0 else "sorrow"
            return {"feeling": feeling, "conclusion": fact.conclusion, "valence": fact.valence,
                    "intensity": fact.intensity, "lasting": True}  # fmt: skip
    for line in SMALL_TALK:
        if json.dumps(line)[1:-1] in happened:
            valence, intensity = small_talk_feeling(line)
            return {"feeling": "easy", "conclusion": "Ann and I chatted about her day.", "valence": valence,
                    "intensity": intensity, "lasting": False}  # fmt: skip
    return {"feeling": "curious", "conclusion": "Ann asked me something about herself.", "valence": 0.2,
            "intensity": 0.2, "lasting": False}  # fmt: skip


def script(fake: Any, embedder: str) -> None:
    from testing.fake_openai import envelope

    fake.script(appraise, purpose="appraisal")
    fake.script({"keep": [1, 2, 3], "asks_for_memory": True, "asks_for_own": None}, purpose="filter")
    fake.script({"summary": "Ann and I talked about her day."}, purpose="summary")
    fake.script({"greeting": None, "feeling": "glad", "conclusion": "Ann is here.", "valence": 0.2,
                 "intensity": 0.2, "search": None}, purpose="arrival")  # fmt: skip
    fake.script({"groups": []}, purpose="sleep")
    fake.script(envelope(answer="I see!", answer_needed=True), purpose="reply")
    if embedder == "real":
        from bench.real_embedder import RealEmbedder

        RealEmbedder().script(fake)


# ------------------------------------------------------------------ one evaluation (in its own process)


def memory_block(request: Any) -> str:
    """The ``### Memory`` block of a reply call (the end of its turn context, issue 33's layout), lowercased;
    "" when none."""
    from box.context import memory_block_of

    messages = request.body.get("messages") or []
    return memory_block_of(messages).lower() if isinstance(messages, list) else ""


def stored_texts() -> str:
    """Every text the imp's store still holds (records and episodes), lowercased."""
    from impyard.storage.db import open_database

    db = open_database()
    try:
        rows = db.read(lambda conn: conn.exec_driver_sql(
            "SELECT conclusion AS t FROM memory_records WHERE imp = ? UNION ALL"
            " SELECT as_happened AS t FROM memory_episodes WHERE imp = ?", (IMP, IMP),
        ).all())  # fmt: skip
        return "\n".join(str(r.t) for r in rows).lower()
    finally:
        db.close()


async def evaluate(embedder: str, days: int = DAYS, nights_on: bool = True) -> dict[str, Any]:
    import anyio

    from box.protocol.models import Author, Message
    from impyard.backends.process import ProcessBackend
    from impyard.cli.memory_night import run_night
    from impyard.clock import FixedClock
    from impyard.conversation.pipeline import Inbound
    from impyard.gateway.surfaces import RecordingSurface
    from impyard.imps.store import ImpStore
    from impyard.memory.act import memory_service_of
    from impyard.runtime import open_runtime
    from testing.fake_openai import FakeOpenAI

    memory: dict[str, Any] = {"enabled": True, "embedder": "hashing"}
    if embedder == "real":
        memory = {"enabled": True, "embedder": "gateway", "dimensions": 384}
    clock = FixedClock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))
    forgot = nights = night_failures = 0
    asked: list[dict[str, Any]] = []
    began = time.perf_counter()
    with FakeOpenAI() as fake:
        os.environ["OPENAI_API_KEY"], os.environ["OPENAI_BASE_URL"] = str(fake.api_key), fake.base_url
        script(fake, embedder)
        ImpStore().add(IMP, "You are Pip, a friendly companion.", memory=memory)
        n = 0
        async with open_runtime(
            [IMP], RecordingSurface(), clock=clock, backends={IMP: ProcessBackend(warn=False)},
            surfaces=("discord",), pump_period_s=None,
        ) as rt:  # fmt: skip

            async def say(text: str) -> tuple[int, int]:
                nonlocal n
                n += 1
                clock.advance(minutes=3)
                message = Message(
                    id=f"m{n}", author=Author(id=PERSON_ID, name=PERSON), content=text, created_at=clock.now()
                )
                inbound = Inbound(surface="discord", channel_id=CHANNEL, channel_kind="dm", message=message,
                                  channel_name=f"DM with {PERSON}")  # fmt: skip
                first = len(fake.requests)
                routed = await rt.conversations.receive(IMP, inbound)
                if routed not in ("started", "queued"):
                    raise RuntimeError(f"message {n} was not delivered: {routed}")
                with anyio.fail_after(120):
                    await rt.conversations.wait_finished(f"m{n}")
                return first, len(fake.requests)

            for day in range(1, days + 1):
                clock.set(datetime(2026, 3, 2, 9, 0, tzinfo=UTC) + timedelta(days=day - 1))
                fact = next((f for f in FACTS if f.day == day), None)
                for k in range(SMALL_TALK_PER_DAY):
                    if fact is not None and k == FACT_AFTER:
                        await say(fact.said)
                    await say(small_talk(day, k))
                clock.advance(hours=NIGHT_AFTER_H)
                if not nights_on:
                    continue
                report = await run_night(IMP, consolidate=True, clock=clock, backend="process")
                nights += 1
                for _scope, task in report.tasks:
                    if task.state != "done":
                        night_failures += 1
                        continue
                    summary = task.box_summary or ""
                    if "forgot " in summary:
                        forgot += int(summary.split("forgot ", 1)[1].split()[0])
                forgot += report.host_forgot[0]
            clock.set(datetime(2026, 3, 2, 10, 0, tzinfo=UTC) + timedelta(days=days))  # the day after
            told = [fact for fact in FACTS if fact.day <= days]
            for fact in told:
                first, last = await say(fact.question)
                blocks = [memory_block(r) for r in fake.requests[first:last] if r.purpose == "reply"]
                reached = any(all(word in block for word in fact.evidence) for block in blocks)
                asked.append({"day": fact.day, "valence": fact.valence, "intensity": fact.intensity,
                              "evidence": list(fact.evidence), "recalled": reached, "reply_calls": len(blocks)})  # fmt: skip
            memory_service = memory_service_of(rt.gateway)
            assert memory_service is not None
            remaining = await rt.db.run(memory_service.store.count, IMP)
    stored = stored_texts()
    for fact, entry in zip(told, asked, strict=True):  # kept (in the store at all) apart from recalled
        entry["kept"] = all(word in stored for word in fact.evidence)
    recalled = sum(1 for a in asked if a["recalled"])
    return {
        "embedder": embedder, "days": days, "nights_on": nights_on, "facts": len(told), "recalled": recalled,
        "kept": sum(1 for a in asked if a["kept"]), "asked": asked, "nights": nights,
        "night_failures": night_failures, "records_forgotten": forgot, "records_left": remaining,
        "messages": n, "wall_s": round(time.perf_counter() - began, 1),
    }  # fmt: skip


def worker_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--embedder", choices=("real", "hashing"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--days", type=int, default=DAYS)
    parser.add_argument("--no-nights", action="store_true")
    args = parser.parse_args()
    import anyio

    if not os.environ.get("IMPYARD_HOME"):  # run by hand: a home of its own, never the user's
        with tempfile.TemporaryDirectory(prefix="memory-days-") as tmp:
            os.environ["IMPYARD_HOME"] = str(Path(tmp) / "home")
            figures = anyio.run(evaluate, args.embedder, args.days, not args.no_nights)
    else:
        figures = anyio.run(evaluate, args.embedder, args.days, not args.no_nights)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


# ------------------------------------------------------------------ the scenario (python -m bench --only memory_days)


def run_checkout(checkout: Path, embedder: str, days: int, nights_on: bool = True) -> dict[str, Any]:
    """One evaluation of ``checkout``'s code in a subprocess with a home of its own."""
    with tempfile.TemporaryDirectory(prefix="memory-days-") as tmp:
        out = Path(tmp) / "figures.json"
        env = {**os.environ, "PYTHONPATH": str(checkout), "IMPYARD_HOME": str(Path(tmp) / "home")}
        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
            env.pop(name, None)
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--embedder", embedder, "--out", str(out),
             "--days", str(days), *([] if nights_on else ["--no-nights"])],
            env=env, cwd=tmp, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr or done.stdout)[-1500:]
            return {"embedder": embedder, "error": f"exit {done.returncode}: {tail}"}
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures


def commit_of(checkout: Path) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return None
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


async def run(ctx: Any) -> dict[str, Any]:
    """The month on this checkout (and on ``BENCH_BASELINE_CHECKOUT``'s, the before) with each embedder; the
    headline is the real embedder's (the hashing one where it is not installed, and in --quick). The timed
    figure is one evaluation's wall time, against the same month with no nights on this checkout: the control
    that separates what the nights forgot from what recall did not rank."""
    from bench.harness import result
    from bench.real_embedder import available
    from impyard.threads import in_thread  # (this checkout's: the module also runs on a baseline's code)

    days = ctx.plan.memory_days
    quick = days < DAYS
    base = os.environ.get(BASELINE_ENV)
    embedders = ["real", "hashing"] if available() and not quick else ["hashing"]
    checkouts = {"after": HERE, **({"before": Path(base)} if base else {})}  # an absolute path
    ctx.progress.phase(f"memory days: {days} days, nights on ({', '.join(checkouts)} × {', '.join(embedders)})",
                       len(checkouts) * len(embedders) + 1)  # fmt: skip
    runs: dict[str, dict[str, Any]] = {}
    for label, checkout in checkouts.items():
        runs[label] = {"checkout": str(checkout), "commit": commit_of(checkout)}
        for embedder in embedders:
            runs[label][embedder] = await in_thread(run_checkout, checkout, embedder, days)
            ctx.progress.advance()
    head = runs["after"][embedders[0]]
    control = await in_thread(run_checkout, HERE, embedders[0], days, False)
    ctx.progress.advance()

    def reached(embedder: str) -> bool:
        figures = runs["after"][embedder]
        return "error" not in figures and figures["recalled"] >= TARGET

    # The target is the real embedder's (issue 32); the hashing embedder matches words, not meaning, so a
    # paraphrased question finds only what comes to mind by person and strength: reported, not judged.
    judged = [e for e in embedders if e == "real"]

    def timed(figures: dict[str, Any]) -> dict[str, Any]:
        wall = figures.get("wall_s")
        ms = None if wall is None else wall * 1000
        return {"samples": 1 if ms is not None else 0, "p50_ms": ms, "p95_ms": ms, "p99_ms": ms}

    stats, baseline = timed(head), timed(control)
    return result(
        stats, baseline=baseline,
        ratio=round(stats["p50_ms"] / baseline["p50_ms"], 2) if stats["p50_ms"] and baseline["p50_ms"] else None,
        targets={"recalled_of_12_real_embedder": TARGET},
        met=bool(judged) and all(reached(e) for e in judged),
        checks={f"{e}_recalled_at_least_{TARGET}": reached(e) for e in judged},
        runs=runs, no_nights=control, headline=head.get("recalled"), embedders=embedders, days=days,
        baseline_note=None if base else f"set {BASELINE_ENV} to a checkout of main for the before figures",
    )  # fmt: skip


def _said(f: dict[str, Any] | None) -> str:
    if not f:
        return "not run"
    if "error" in f:
        return f"error: {f['error'][:200]}"
    return (
        f"{f['recalled']}/{f['facts']} recalled ({f['kept']} still in the store), "
        f"{f['records_forgotten']} records forgotten"
    )


def rows(s: dict[str, Any]) -> list[Any]:
    from bench.report import Row

    out = []
    for embedder in s.get("embedders", []):
        after = s["runs"]["after"].get(embedder, {})
        before = s["runs"].get("before", {}).get(embedder)
        stats = {"samples": after.get("facts", 0), "p50_ms": None, "p95_ms": None, "p99_ms": None}
        out.append(
            Row(
                f"facts recalled after {s.get('days', DAYS)} days, nights on ({embedder} embedder)",
                stats,
                None,
                None,
                f"after: {_said(after)}; before ({s['runs'].get('before', {}).get('commit') or 'no baseline'}): "
                f"{_said(before)}",
                ("error" not in after and after.get("recalled", 0) >= TARGET) if embedder == "real" else None,
            )  # fmt: skip
        )
    control = s.get("no_nights")
    if control:
        stats = {"samples": control.get("facts", 0), "p50_ms": None, "p95_ms": None, "p99_ms": None}
        out.append(
            Row(
                f"… the same month with no nights, this checkout ({control.get('embedder')} embedder)",
                stats,
                None,
                None,
                f"control: {_said(control)}",
                None,
            )  # fmt: skip
        )
    return out


if __name__ == "__main__":
    worker_main()
