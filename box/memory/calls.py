"""The memory's model calls: routing, tolerant JSON, busy backoff and the call log (mechanisms 55, 119-121).

Every call goes to the host's gateway as ``model.request`` (the box has no network, docs/protocol.md),
through ``box.model.ModelClient``. What is different from the reply machinery in ``box.attempts``
(ENV-12), and why:

* **Routing (55).** Each purpose may name its own model in ``[memory.models]``; on OpenAI the per-turn
  judgements default to a cheaper model (issue 33, ``box.common.memory_models``); the rest use the imp's
  reply model.
* **Never raises for a model failure.** A memory call that fails costs the turn a feeling or a
  recall, never the reply: ``chat_json`` and ``embedding`` return ``None`` for an HTTP error, a
  refusal, an unreadable answer or a gateway refusal (``RpcError``), and the engine falls back
  (e.g. mechanism 59). A closed peer (``PeerClosed``) still propagates: the box is going away.
* **Bad JSON is asked again (120)** with a note that the previous reply was not valid JSON; the
  parser is tolerant (fences, a leading "+", the first ``{…}``).
* **Busy backoff (121).** HTTP 429 and 5xx — and the gateway's own "rate limited" / "upstream
  unreachable" refusals, which mean the same — are retried after 2, 5, 10, 20, 40 and 60 s, but a
  wait that would end past the turn's deadline is not started: the call fails instead
  (``box.common.busy``, which the host's own embedding calls follow too).
* **Every call is logged (119)**, success or failure, one JSON line per HTTP attempt, to
  ``/state/memory-calls.jsonl`` (rotated, one ``.1`` kept); a failed write never fails the call.
* **Only what the model takes (issue 16).** The body is shaped by the routed model's profile
  (``box.common.model_profiles``): the purpose's temperature only where the model takes one (not on gpt-5 or
  the o-series), the output cap under the key it takes, the schema with or without ``strict`` as the
  server takes it.
* **The least thinking, a bounded answer (issue 33).** Every chat call sends the least ``reasoning_effort``
  the routed model takes (``none`` on gpt-5.1, ``minimal`` on gpt-5, ``low`` on the o-series, nothing on a
  model that does not reason): unsent, a reasoning model thinks at its own default (``medium``), which a memory
  call does not need. Every call sends an output cap: ``OUTPUT_CAPS`` per purpose, sized to the schema's largest
  sensible answer, plus ``REASONING_HEADROOM`` for the thinking an effort above ``none`` still spends (a cut-off
  answer is no JSON and costs another attempt). The schemas carry their bounds (``maxItems``, ``maxLength``);
  ``box.common.schema_bounds.fit_schema`` sends each server the keywords it takes (issue 38).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from box.common.busy import Asked, ModelCaller, ask_while_busy
from box.common.embedding import EMBEDDINGS_PATH, embedding_body, vector_of
from box.common.memory_models import memory_model
from box.common.model_profiles import LEAST_EFFORT, OPENAI, profile_for
from box.common.request_bodies import CHAT_PATH
from box.common.schema_bounds import fit_schema
from box.common.structured import JsonSchemaRefused, with_schema_in_prompt
from box.protocol.models import MemoryPurpose, MemorySettings

log = logging.getLogger("box.memory.calls")

# Temperatures per purpose (seed 002, "Hard-coded constants").
TEMPERATURE_REPLY = 0.4  # mechanism 46
TEMPERATURE_APPRAISAL = 0.4  # mechanism 57
TEMPERATURE_FILTER = 0.2  # mechanism 20
TEMPERATURE_INTROSPECTION = 0.5  # mechanism 71
TEMPERATURE_SUMMARY = 0.4  # mechanism 44
TEMPERATURE_SELECTION = 0.2  # mechanism 99
TEMPERATURE_LEARNING = 0.2  # mechanism 90
TEMPERATURE_CLASSIFICATION = 0.1  # mechanism 94
TEMPERATURE_SLEEP = 0.3  # mechanism 108

# Mechanism 46 (the reply asked up to 3 times on bad JSON) is the reply path's own: box/attempts.py's
# MAX_ATTEMPTS (ENV-12, ENV-18). The reply never goes through ``chat_json``.
JSON_RETRIES = 1  # mechanism 120: every other call is asked once more

# Mechanism 120: the note that goes with a re-ask (machinery text, not a prompt template).
NOT_JSON_NOTE = (
    "Your previous reply was NOT valid JSON. Answer again with one JSON object only: "
    "no code fences, no text before or after it."
)

# Issue 33: the output cap of each purpose, in tokens — the schema's largest sensible answer (its bounds written
# out in JSON, in a language that spends more tokens a word than English) with room to spare: a cut-off answer is
# no JSON and costs another attempt (120). The introspection's thought, text and conclusion are the longest
# fields; the night's plan lists up to 20 groups of up to 20 numbers.
OUTPUT_CAPS: dict[str, int] = {
    "arrival": 400,
    "appraisal": 400,
    "filter": 150,
    "summary": 700,
    "introspection": 800,
    "selection": 100,
    "learning": 200,
    "classification": 60,
    "sleep": 2_000,
}
DEFAULT_OUTPUT_CAP = 800  # a purpose not listed above (none today)
# What a reasoning model spends thinking at the least effort it takes, on top of the answer: "minimal" (gpt-5)
# thinks a little, "low" (the o-series) more; "none" (gpt-5.1, gpt-5.2) not at all.
REASONING_HEADROOM: dict[str, int] = {"none": 0, "minimal": 1_024, "low": 3_072}
# The default policy's rule model-text refuses an output cap over 4,096 tokens (policies/default.toml).
MAX_OUTPUT_CAP = 4_096

CALL_LOG_FILE = "memory-calls.jsonl"  # mechanism 119, under the box's state dir
ANSWER_LOG_CHARS = 20_000  # an answer longer than this is cut in the log (never in the call)


# ------------------------------------------------------------------ mechanism 120: tolerant JSON

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def parse_json_object(text: str) -> dict[str, Any] | None:
    """Mechanism 120: a JSON object out of a model's text, or None.

    In order: the text as it is; without a surrounding ``` fence; with a leading "+" on numbers
    removed; then the first ``{`` to its matching ``}`` (text around it ignored). Only an object
    counts: a list or a bare value is unreadable. The "+" fix only touches a "+" that starts a
    value, never one inside a string such as a phone number after a space.
    """
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    for candidate in (stripped, _without_leading_plus(stripped)):
        value = _loads_object(candidate)
        if value is not None:
            return value
    first = _first_object(stripped)
    if first is None:
        return None
    return _loads_object(first) or _loads_object(_without_leading_plus(first))


def _loads_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _json_chars(text: str, start: int = 0) -> Iterator[tuple[int, str, bool]]:
    """Each character of ``text`` from ``start`` with whether it is inside a JSON string (its closing quote
    counts as inside, its opening quote not), escapes followed."""
    inside = escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        yield i, ch, inside
        if not inside:
            inside = ch == '"'
        elif escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            inside = False


def _without_leading_plus(text: str) -> str:
    """Drop a "+" that starts a number where a JSON value starts (after ":", "[" or ","), outside strings.

    "+0.5" becomes "0.5" and "+.5" becomes "0.5"; a "+" inside a string ("call +44 …") stays.
    """
    out: list[str] = []
    last = ""  # the last non-space character outside strings
    for i, ch, inside in _json_chars(text):
        if not inside:
            if ch == "+" and last in (":", "[", ",") and _starts_number(text, i + 1):
                if text[i + 1] == ".":
                    out.append("0")  # "+.5" -> "0.5": JSON has no bare leading dot either
                continue
            if not ch.isspace():
                last = ch
        out.append(ch)
    return "".join(out)


def _starts_number(text: str, at: int) -> bool:
    return text[at : at + 1].isdigit() or (text[at : at + 1] == "." and text[at + 1 : at + 2].isdigit())


def _first_object(text: str) -> str | None:
    """The first balanced ``{…}`` in ``text``, braces inside JSON strings ignored."""
    start = text.find("{")
    if start < 0:
        return None
    depth = 0
    for i, ch, inside in _json_chars(text, start):
        if inside:
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


# ------------------------------------------------------------------ mechanism 119: the call log


@dataclass(frozen=True)
class CallRecord:
    """Mechanism 119: one model call, in full, as the recorders get it."""

    purpose: str
    model: str
    system: str
    user: str
    temperature: float | None
    format: str  # "json_schema" | "json" (tolerant parse) | "embedding"
    answer: str | None  # the model's text; for an embedding, a short description of the vector
    status: int | None  # HTTP status; None when the gateway refused (RpcError) before any upstream call
    time: str  # ISO-8601 of the movable clock (mechanism 122) when the call started
    duration_s: float
    error: str | None = None


class CallLog:
    """Mechanism 119: the JSONL file of memory calls, rotated at ``max_bytes`` (one ``.1`` kept).

    ``max_bytes`` 0 disables the log. Writes run in a worker thread (off the event loop) under a
    lock, so concurrent calls never interleave lines; a failed write is logged and forgotten.
    A single record larger than ``max_bytes`` is still written, into a freshly rotated file.
    """

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    @classmethod
    def in_state_dir(cls, state_dir: Path, settings: MemorySettings) -> CallLog:
        return cls(state_dir / CALL_LOG_FILE, settings.call_log_bytes)

    async def append(self, record: CallRecord) -> None:
        if self.max_bytes <= 0:
            return
        line = json.dumps(asdict(record), ensure_ascii=False) + "\n"
        try:
            await anyio.to_thread.run_sync(self._write, line.encode("utf-8"))
        except OSError as exc:  # mechanism 119: the log never fails the call
            log.warning("memory call log not written: %s", exc)

    def _write(self, data: bytes) -> None:
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(data) > self.max_bytes:
                self.path.replace(self.path.with_name(self.path.name + ".1"))
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as handle:
                handle.write(data)


# ------------------------------------------------------------------ the calls


def output_cap(purpose: str, effort: str | None) -> int:
    """Issue 33: the tokens a ``purpose`` call may answer with, with the thinking ``effort`` still spends."""
    answer = OUTPUT_CAPS.get(purpose, DEFAULT_OUTPUT_CAP)
    if effort is None:
        return answer
    return min(MAX_OUTPUT_CAP, answer + REASONING_HEADROOM.get(effort, REASONING_HEADROOM["low"]))


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _no_deadline() -> float | None:
    return None


class MemoryModel:
    """The memory engine's model calls (mechanisms 55, 119-121); see the module docstring.

    ``deadline()`` returns the seconds left before the turn's ceiling, or None for no limit; the
    busy backoff never waits past it. ``clock`` is the movable clock (122), used for the log's
    times; durations are measured with a monotonic clock. ``recorders`` get every ``CallRecord``
    as well (tests, the scripted fake host).
    """

    def __init__(
        self,
        client: ModelCaller,
        settings: MemorySettings,
        default_model: str,
        *,
        call_log: CallLog | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        clock: Callable[[], datetime] = _utc_now,
        deadline: Callable[[], float | None] = _no_deadline,
        recorders: tuple[Callable[[CallRecord], None], ...] = (),
        server: str = OPENAI,
    ) -> None:
        self.client = client
        self.settings = settings
        self.default_model = default_model
        self.server = server  # issue 16: with each routed model, what its requests may carry
        # Issue 38: a refusal of json_schema, shared with the reply's calls where the client is the box's.
        structured = getattr(client, "structured", None)
        self.structured = structured if isinstance(structured, JsonSchemaRefused) else JsonSchemaRefused()
        self.call_log = call_log
        self.sleep = sleep
        self.clock = clock
        self.deadline = deadline
        self.recorders = recorders

    def model_for(self, purpose: MemoryPurpose) -> str:
        """Mechanism 55: the model routed for ``purpose``; unrouted, on OpenAI, the purpose's shipped default
        (issue 33), else the imp's default model. The arrival is a reply call with its own schema (101):
        unrouted, it goes where the reply goes (``box.common.memory_models``)."""
        return memory_model(purpose, self.settings.models, self.default_model, self.server)

    async def chat_json(
        self,
        purpose: MemoryPurpose,
        system: str,
        user: str,
        *,
        temperature: float | None,
        schema: dict[str, Any] | None = None,
        retries: int = JSON_RETRIES,
        max_tokens: int | None = None,
    ) -> dict[str, Any] | None:
        """One JSON object from the model for ``purpose``, or None when there is none to be had.

        With ``schema`` the call asks for strict structured output (``json_schema``); the answer is
        still parsed tolerantly. An unreadable answer is asked again up to ``retries`` times, with
        the bad reply and ``NOT_JSON_NOTE`` added to the conversation (120). A refusal, a
        non-retryable HTTP status or a gateway refusal ends the call at once.
        """
        model = self.model_for(purpose)
        profile = profile_for(model, self.server)  # issue 16: only what this model takes
        effort = profile.effort_for(
            LEAST_EFFORT
        )  # issue 33: the least thinking the model does; None: no reasoning
        cap = max_tokens if max_tokens is not None else output_cap(purpose, effort)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        asks = 1 + max(0, retries)
        while asks > 0:
            asks -= 1
            json_object = schema is not None and (
                self.structured.refused or profile.structured == "json_object"
            )  # issue 38: a server that takes no json_schema gets the schema in the prompt
            body: dict[str, Any] = {
                "model": model,
                "messages": with_schema_in_prompt(messages, fit_schema(schema, profile.schema_dialect))
                if json_object and schema is not None
                else messages,
            }
            if effort is not None:
                body["reasoning_effort"] = effort
            if temperature is not None and profile.takes_temperature(effort):
                body["temperature"] = temperature
            body[profile.output_cap_key] = cap
            if schema is not None:
                body["response_format"] = (
                    {"type": "json_object"}
                    if json_object
                    else profile.response_format(purpose, fit_schema(schema, profile.schema_dialect))
                )  # issue 38: the bounds this server takes, or the schema in the prompt
            started, wall = time.monotonic(), self.clock()
            attempt = await self._request(CHAT_PATH, body, purpose)
            switched = (
                attempt.result is not None
                and not json_object
                and self.structured.note(attempt.result.status, attempt.result.body, body)
            )
            content, problem = _chat_content(attempt)
            parsed = parse_json_object(content) if content is not None else None
            if content is not None and parsed is None:
                problem = "answer is not a JSON object"
            await self._record(
                CallRecord(
                    purpose=purpose,
                    model=model,
                    system=system,
                    user=_last_user(messages),
                    temperature=body.get("temperature"),  # what was sent (issue 16)
                    format="json_object" if json_object else "json_schema" if schema is not None else "json",
                    answer=content[:ANSWER_LOG_CHARS] if content is not None else None,
                    status=attempt.result.status if attempt.result is not None else None,
                    time=wall.isoformat(),
                    duration_s=round(time.monotonic() - started, 3),
                    error=problem,
                )
            )
            if switched:
                asks += 1  # issue 38: asked again at once as json_object; not a retry of the same request
                continue
            if parsed is not None:
                return parsed
            log.warning("memory %s call (%s) failed: %s", purpose, model, problem)
            if content is None:
                return None  # HTTP failure, refusal or no message: asking again would not help
            messages = [
                *messages,
                {"role": "assistant", "content": content},
                {"role": "user", "content": NOT_JSON_NOTE},
            ]
        return None

    async def embedding(self, model: str, text: str, dimensions: int) -> list[float] | None:
        """The embedding of ``text``: ``dimensions`` finite floats, or None (mechanisms 30, 63).

        The answer is checked, not trusted: ``data[0].embedding`` must be a list of exactly
        ``dimensions`` finite numbers; anything else is no vector this time (and a log line).
        """
        body = embedding_body(model, text, dimensions)
        started, wall = time.monotonic(), self.clock()
        attempt = await self._request(EMBEDDINGS_PATH, body, "embedding")
        vector, problem = vector_of(attempt, dimensions)
        await self._record(
            CallRecord(
                purpose="embedding",
                model=model,
                system="",
                user=text,
                temperature=None,
                format="embedding",
                answer=f"vector of {len(vector)} floats" if vector is not None else None,
                status=attempt.result.status if attempt.result is not None else None,
                time=wall.isoformat(),
                duration_s=round(time.monotonic() - started, 3),
                error=problem,
            )
        )
        if vector is None:
            log.warning("memory embedding (%s) failed: %s", model, problem)
        return vector

    async def _request(self, path: str, body: dict[str, Any], purpose: str) -> Asked:
        """One gateway request with the busy backoff (121); never raises for the model's failure."""
        return await ask_while_busy(
            self.client, path, body, purpose, sleep=self.sleep, deadline=self.deadline
        )

    async def _record(self, record: CallRecord) -> None:
        for recorder in self.recorders:
            recorder(record)
        if self.call_log is not None:
            await self.call_log.append(record)


def _last_user(messages: list[dict[str, Any]]) -> str:
    """The user text of the call; a re-ask logs the original request plus the note."""
    users = [str(m["content"]) for m in messages if m["role"] == "user"]
    return users[0] if len(users) == 1 else f"{users[0]}\n\n[re-ask] {users[-1]}"


def _chat_content(attempt: Asked) -> tuple[str | None, str | None]:
    """The answer text of a chat call, or None and why not."""
    result = attempt.result
    if result is None or result.status != 200:
        return None, attempt.error or "no answer"
    try:
        message = result.body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return None, "the answer has no message"
    if not isinstance(message, dict):
        return None, "the answer has no message"
    if message.get("refusal"):
        return None, f"the model refused: {str(message['refusal'])[:200]}"
    content = message.get("content")
    if not isinstance(content, str):
        return None, "the answer has no text"
    return content, None
