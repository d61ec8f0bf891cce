"""``impyard doctor``'s rules: from what was observed to a finding with its fix (issue 17).

Pure functions over plain values, so each rule's test is a table; the CLI (impyard/cli/doctor.py)
observes (Docker, the disk, the policy, the gateway) and prints. A finding is ``ok``, ``warn`` (works,
but not as it should: no lockdown, no Discord token) or ``fail`` (a chat does not work until it is fixed);
``impyard doctor`` exits 1 when any finding fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from pydantic import ValidationError

from box.common.envelope import Envelope
from box.common.failures import clip, invalid_fields
from box.common.memory_models import memory_model
from box.common.model_profiles import profile_for
from box.common.request_bodies import chat_body, responses_body
from box.common.structured import refuses_json_schema
from box.protocol.models import MemoryPurpose, ResponderSettings
from impyard.backends.base import BoxStartError
from impyard.backends.runtimes import GVISOR, RuntimeChoice, install_hint, resolve_runtime, runtime_words
from impyard.imps.config import MEMORY_PURPOSES, ImpConfig

Status = Literal["ok", "warn", "fail"]

MIB = 1024**2
FREE_FAIL_BYTES = 100 * MIB  # below this the database and the boxes' state run out of room mid-turn
FREE_WARN_BYTES = 1024 * MIB
# The memory engine's chat calls: every memory purpose but the reply's own and the embedding (issue 23; issue 38:
# all nine, as the README's rule lists them, not three, so `imp add` warns about every call that would be denied).
# Issue 33 routes some of them to gpt-4.1-mini on OpenAI by default (box.common.memory_models).
MEMORY_CALL_PURPOSES = cast(
    tuple[MemoryPurpose, ...], tuple(p for p in MEMORY_PURPOSES if p not in ("reply", "embedding"))
)
SAMPLE_TEXT = "doctor"
# The structured output the endpoint check asks for: the smallest schema a strict server accepts.
PROBE_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
PROBE_MAX_TOKENS = 32


@dataclass(frozen=True)
class Finding:
    item: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, object]:
        return {
            "item": self.item,
            "status": self.status,
            "ok": self.ok,
            "detail": self.detail,
            "fix": self.fix,
        }


def exit_code(findings: list[Finding]) -> int:
    """1 when anything stops a chat from working, else 0 (warnings do not)."""
    return 1 if any(finding.status == "fail" for finding in findings) else 0


# ------------------------------------------------------------------ the state dir


def state_finding(home: str, problem: str | None, free_bytes: int | None) -> Finding:
    """The state dir: writable (``problem`` is why not) and with room for the database and the boxes' state."""
    if problem is not None:
        return Finding("State dir", "fail", f"{home}: {problem}", "set IMPYARD_HOME to a writable directory")
    if free_bytes is None:
        return Finding("State dir", "ok", f"{home} (free space unknown)")
    free = f"{home}: {free_bytes / MIB:,.0f} MiB free"
    if free_bytes < FREE_FAIL_BYTES:
        return Finding(
            "State dir", "fail", free, f"free space on that disk (at least {FREE_WARN_BYTES // MIB} MiB)"
        )
    if free_bytes < FREE_WARN_BYTES:
        return Finding(
            "State dir", "warn", free, f"free space on that disk (at least {FREE_WARN_BYTES // MIB} MiB)"
        )
    return Finding("State dir", "ok", free)


# ------------------------------------------------------------------ Docker and the box image


@dataclass(frozen=True)
class DockerFacts:
    """What the Docker engine answered: ``engine_problem`` when it did not (or cannot confine a box)."""

    reachable: bool
    version: str = ""
    engine_problem: str | None = None
    expected_image: str = ""
    image_present: bool = False
    other_images: tuple[str, ...] = ()
    runtimes: tuple[str, ...] = ()  # the OCI runtimes the engine has registered (docker info: Runtimes)


def docker_findings(facts: DockerFacts, backends: set[str]) -> list[Finding]:
    """The engine and the image. Imps on ``auto`` fall back to the unconfined process backend when no engine
    answers (a warning); an imp on ``docker`` cannot start (a failure). A missing image always stops a box
    that Docker would run. ``backends``: the imps' ``[box] backend`` (none yet: ``auto``, what a new imp gets)."""
    backends = backends or {"auto"}
    docker_needed = backends != {"process"}
    strict = "docker" in backends
    if not facts.reachable:
        status: Status = "fail" if strict else ("warn" if docker_needed else "ok")
        fallback = (
            "imps on backend docker cannot start"
            if strict
            else "boxes run on the process backend: NO lockdown"
        )
        return [
            Finding(
                "Docker engine", status, f"{facts.engine_problem or 'not reachable'}; {fallback}",
                "apt-get install docker.io; start dockerd (or add this user to the docker group)",
            ),
            Finding("Box image", "warn" if docker_needed else "ok", "not checked (no Docker engine)",
                    "impyard box build, once Docker runs" if docker_needed else ""),
        ]  # fmt: skip
    engine = Finding("Docker engine", "ok", f"reachable, version {facts.version or '?'}")
    if facts.engine_problem is not None:
        engine = Finding(
            "Docker engine", "fail" if docker_needed else "warn", facts.engine_problem,
            "fix the engine as the detail says (impyard box check shows what a box observes)",
        )  # fmt: skip
    if facts.image_present:
        image = Finding("Box image", "ok", f"{facts.expected_image}, built from this code")
    else:
        others = ", ".join(facts.other_images[:3]) + (" …" if len(facts.other_images) > 3 else "")
        why = (
            f"{facts.expected_image} is not built; the box images here ({others}) are of other box code"
            if facts.other_images
            else f"{facts.expected_image} is not built"
        )
        image = Finding(
            "Box image", "fail" if docker_needed else "ok", why, "impyard box build (./run.sh does it too)"
        )
    return [engine, image]


def runtime_finding(facts: DockerFacts, choices: dict[str, RuntimeChoice]) -> Finding:
    """The OCI runtime each imp's Docker boxes run under (issue 22): ``choices`` maps the imps on a Docker
    backend (none yet: what a new imp gets) to their setting. runsc asked for but not registered stops those
    imps' boxes (a failure whose fix is the daemon.json lines); ``auto`` without runsc runs runc (ok, with how
    to add gVisor)."""
    if not choices:
        return Finding("Box runtime", "ok", "no imp runs Docker boxes")
    if not facts.reachable or not facts.runtimes:
        why = "no Docker engine" if not facts.reachable else "the engine listed no runtimes"
        return Finding("Box runtime", "warn", f"not checked ({why})", "start dockerd, then impyard doctor")
    chosen: dict[str, list[str]] = {}
    refused: list[str] = []
    problem = ""
    for imp, choice in choices.items():
        try:
            chosen.setdefault(resolve_runtime(choice, facts.runtimes), []).append(imp)
        except BoxStartError as exc:
            refused.append(imp)
            problem = problem or str(exc).split(": ")[0]
    if refused:
        return Finding(
            "Box runtime", "fail", f"{', '.join(refused)}: {problem}; no box of theirs starts",
            f"{install_hint()}; or set IMPYARD_BOX_RUNTIME=runc",
        )  # fmt: skip
    detail = "; ".join(
        f"{runtime_words(runtime)} for {', '.join(imps)}" for runtime, imps in sorted(chosen.items())
    )
    if GVISOR not in facts.runtimes:
        return Finding(
            "Box runtime", "ok", f"{detail}; gVisor (runsc) is not registered with this engine",
            f"for a user-space kernel under every box: {install_hint()}",
        )  # fmt: skip
    return Finding("Box runtime", "ok", detail)


# ------------------------------------------------------------------ the policy


def policy_finding(rules: int, sources: int, directory: str, warnings: list[str]) -> Finding:
    detail = f"{rules} rules from {sources} file(s) (operator directory {directory})"
    if warnings:
        return Finding("Policy", "warn", f"{detail}; {warnings[0]}", "see: impyard policy check")
    return Finding("Policy", "ok", detail)


def broken_policy_finding(first_problem: str, more: int) -> Finding:
    detail = first_problem + (f" (and {more} more)" if more else "")
    return Finding("Policy", "fail", detail, "fix the file and line named; check with: impyard policy check")


# ------------------------------------------------------------------ each imp's model calls


@dataclass(frozen=True)
class ModelUse:
    """One kind of model call an imp's boxes make: its purpose, path and model, the imp.toml key that chose
    the model, and a body shaped as the box shapes it (what the gateway judges and prices)."""

    purpose: str
    path: str
    model: str
    key: str
    body: dict[str, Any] = field(compare=False, hash=False)


def _memory_body(model: str, server: str) -> dict[str, Any]:
    profile = profile_for(model, server)  # issue 38: shaped as the memory's calls are (box.memory.calls)
    return {
        "model": model,
        "messages": [{"role": "system", "content": SAMPLE_TEXT}, {"role": "user", "content": SAMPLE_TEXT}],
        "response_format": profile.response_format("doctor", PROBE_SCHEMA),
    }


def model_uses(config: ImpConfig) -> list[ModelUse]:
    """Every (purpose, path, model) the imp's boxes call: its reply models, and with memory on the memory
    engine's calls (a model per purpose from ``[memory] models``, else its shipped default on OpenAI, else
    ``[model] model``: ``box.common.memory_models``) and, with the
    gateway embedder, its embedding model. Tools are left out of the bodies: they do not change the model."""
    spec = config.imp_spec()
    settings: ResponderSettings = spec.responder
    uses: list[ModelUse] = []
    for key in ("model", "vision_model", "factual_model", "retry_model"):
        model = getattr(config.model, key)
        if model is None:
            continue
        if config.model.use_responses_api:
            path, body = "/responses", responses_body(settings, model, SAMPLE_TEXT, [_user()], [])
        else:
            path, body = "/chat/completions", chat_body(settings, model, [_user()], [])
        uses.append(ModelUse("reply", path, model, f"model.{key}", body))
    if config.memory.enabled:
        for purpose in MEMORY_CALL_PURPOSES:
            if purpose == "introspection" and not config.memory.introspection:
                continue  # mechanism 52 off: no introspection call is made
            model = memory_model(purpose, config.memory.models, config.model.model, config.model.server)
            body = _memory_body(model, config.model.server)
            uses.append(
                ModelUse(purpose, "/chat/completions", model, _memory_key(purpose, model, config), body)
            )
        if config.memory.embedder in ("gateway", "local"):  # local: judged by the policy too (issue 33)
            model, dimensions = spec.memory.embedding_model, spec.memory.dimensions
            body = {"model": model, "input": [SAMPLE_TEXT], "dimensions": dimensions}
            key = "memory.embedding_model" if config.memory.embedder == "gateway" else "memory.embedder"
            uses.append(ModelUse("embedding", "/embeddings", model, key, body))
    return list(dict.fromkeys(uses))  # one check per (purpose, path, model)


def _memory_key(purpose: MemoryPurpose, model: str, config: ImpConfig) -> str:
    """The imp.toml key that chose a memory call's model: its own ``[memory] models`` entry, the reply's for an
    unrouted arrival (box.common.memory_models), a shipped default's purpose, or ``[model] model``."""
    routed = config.memory.models
    if purpose in routed:
        return f"memory.models.{purpose}"
    if purpose == "arrival" and "reply" in routed:
        return "memory.models.reply"
    return f"memory.models.{purpose}" if model != config.model.model else "model.model"


def _user() -> dict[str, Any]:
    return {"role": "user", "content": SAMPLE_TEXT}


@dataclass(frozen=True)
class Refusal:
    """What the gateway's dry run answered a use it does not allow: its verdict, rule and reason."""

    use: ModelUse
    verdict: str
    rule: str
    reason: str


def imp_finding(
    name: str, uses: list[ModelUse], refusals: list[Refusal], backend: str, policy_dir: str
) -> Finding:
    """One imp: every model call it makes allowed by the policy, priced and within its budget."""
    item = f"Imp {name}"
    if refusals:
        first = refusals[0]
        more = f" (and {len(refusals) - 1} more)" if len(refusals) > 1 else ""
        detail = (
            f"{first.use.purpose} with {first.use.model}: {first.verdict.replace('_', ' ')} "
            f"by {first.rule}: {first.reason}{more}"
        )
        return Finding(item, "fail", detail, refusal_fix(name, first, policy_dir))
    calls = ", ".join(f"{use.purpose} {use.model}" for use in uses)
    if backend == "process":
        return Finding(
            item, "warn", f"box.backend is process: NO lockdown; calls allowed and priced: {calls}",
            f"impyard imp set {name} box.backend=auto (with Docker running)",
        )  # fmt: skip
    return Finding(item, "ok", f"allowed and priced: {calls}")


def refusal_fix(name: str, refusal: Refusal, policy_dir: str) -> str:
    use = refusal.use
    if refusal.verdict == "budget_exhausted":
        return f"raise the limit (impyard budget set {name} --daily USD) or wait for the next day or month"
    if refusal.rule == "prices":
        return f'add [prices."{use.model}"] to a policy file in {policy_dir} (USD per million tokens)'
    return (
        f"allow {use.model} for purpose {use.purpose} in a policy file in {policy_dir} "
        f"(see impyard policy check), or choose an allowed model: impyard imp set {name} {use.key}=MODEL"
    )


def broken_imp_finding(name: str, problem: str) -> Finding:
    return Finding(f"Imp {name}", "fail", problem, f"impyard imp edit {name}")


# ------------------------------------------------------------------ the model endpoint


def embedding_length_finding(
    imp: str, model: str, asked: int, got: int | None, bounds: tuple[int, int], *, learned: bool = False
) -> Finding:
    """Issue 33: what the length of an embedding model's vectors means for recall by meaning. ``got`` is what it
    answered (None: not called; ``learned`` then says the gateway saw it ignore ``dimensions`` before)."""
    item = f"Embedder {imp}"
    if got is None:
        if learned:
            return Finding(
                item, "warn", f"{model} was seen to ignore dimensions and answer {asked}-dimension vectors: "
                f"{imp}'s boxes ask for {asked} (learned)",
                f"say so in imp.toml: impyard imp set {imp} memory.dimensions={asked}",
            )  # fmt: skip
        return Finding(item, "ok", f"{model}, {asked} dimensions (not called)")
    if got == asked:
        return Finding(item, "ok", f"{model} answers {got}-dimension vectors, as asked")
    low, high = bounds
    if not low <= got <= high:
        return Finding(
            item, "fail", f"{model} ignores dimensions={asked} and answers {got}-dimension vectors, which the box "
            f"cannot take ({low} to {high}): {imp} recalls by person and recency only, never by meaning",
            f'use another embedding model, or the host\'s own: impyard imp set {imp} memory.embedder=local',
        )  # fmt: skip
    return Finding(
        item, "warn", f"{model} ignores dimensions={asked} and answers {got}-dimension vectors: learned, {imp}'s "
        f"next box asks for {got} (a box started before keeps refusing them: no recall by meaning)",
        f"say so in imp.toml: impyard imp set {imp} memory.dimensions={got}",
    )  # fmt: skip


def other_lengths_finding(imp: str, embedder: str, dims: int, lengths: dict[int, int]) -> Finding | None:
    """Issue 33: memories whose vectors the imp's embedder cannot compare with (another length: embedded by
    another embedder, before a switch), or None when there are none."""
    others = {length: count for length, count in lengths.items() if length != dims}
    if not others:
        return None
    counted = ", ".join(f"{count} at {length}" for length, count in sorted(others.items()))
    total = sum(others.values())
    back = "gateway" if embedder == "local" else "local"
    return Finding(
        f"Memories {imp}", "warn", f"{total} of {imp}'s memories were embedded by another embedder ({counted} "
        f"dimensions; its {embedder} embedder gives {dims}): found by person and recency, not by meaning",
        f"keep it so (new memories are found by meaning), or go back to the embedder that made them, e.g. "
        f"impyard imp set {imp} memory.embedder={back}",
    )  # fmt: skip


def no_key_finding(base: str) -> Finding:
    return Finding(
        "Model endpoint", "fail", f"OPENAI_API_KEY not set (base {base})",
        "export OPENAI_API_KEY=sk-… (and OPENAI_BASE_URL for an OpenAI-compatible server)",
    )  # fmt: skip


def http_fix(status: int, model: str, imp: str) -> str:
    if status in (401, 403):
        return "the server refused the key: check OPENAI_API_KEY (and OPENAI_BASE_URL)"
    if status == 404:
        return f"the server does not serve {model} here: check OPENAI_BASE_URL (with its /v1) or impyard imp set {imp} model.model=MODEL"
    if status == 429:
        return "rate limited or out of quota at the provider: check the account, then try again"
    if status >= 500:
        return "the model server failed: try again later, or check the server"
    return "see the server's message (impyard audit tail shows the call)"


# ------------------------------------------------------------------ the endpoint asked what the imp asks (issue 38)

# The reply call doctor makes: the imp's own request builder (box.common.request_bodies.chat_body) with its own
# [model] settings and server profile, and a prompt of the shape the box sends (a system prompt, a message).
ENVELOPE_PROBE_SYSTEM = (
    "You are {name}, replying in a chat. Fill in the reply envelope: `answer` is your reply to the message; "
    'every other field that does not apply is null (or false, or its "none" value).'
)
ENVELOPE_PROBE_MESSAGE = "Hello! Say hello back in one short sentence."
SLOW_SHARE = 0.5  # an envelope call that takes this share of an attempt's limit leaves no room for a second
_NO_CHANNEL_WORDS = ("", "none", "null", "here", "this channel")
_CHANNEL_ID = re.compile(r"^(?:<#)?[0-9]{1,20}>?$")


@dataclass(frozen=True)
class EndpointTiming:
    """The timing in force for the imp (issue 38): its turn ceiling, one attempt's limit, and where from."""

    turn_ceiling_s: float
    attempt_timeout_s: float | None
    source: str  # "server llama.cpp" or "[sessions] turn_ceiling_s"

    def words(self) -> str:
        attempt = f"{self.attempt_timeout_s:g} s" if self.attempt_timeout_s is not None else "no limit"
        return f"turn ceiling {self.turn_ceiling_s:g} s, each attempt {attempt} (from {self.source})"


def endpoint_timing(config: ImpConfig) -> EndpointTiming:
    explicit = "turn_ceiling_s" in config.sessions.model_fields_set
    source = "[sessions] turn_ceiling_s" if explicit else f"server {config.model.server}"
    return EndpointTiming(config.turn_ceiling_s, config.imp_spec().responder.attempt_timeout_s, source)


def envelope_probe_body(config: ImpConfig, *, json_object: bool = False) -> dict[str, Any]:
    """The reply call as the imp's box builds it (issue 38: the output cap key, strict or not, the envelope
    schema or ``json_object`` with the schema in the prompt — whatever the imp's server profile says)."""
    settings = config.imp_spec().responder
    messages = [
        {"role": "system", "content": ENVELOPE_PROBE_SYSTEM.format(name=config.name)},
        {"role": "user", "content": ENVELOPE_PROBE_MESSAGE},
    ]
    return chat_body(settings, settings.model, messages, [], json_object=json_object)


def profile_words(config: ImpConfig) -> str:
    """What the imp's requests carry, in words: ``server llama.cpp: max_tokens, json_schema without strict``."""
    profile = profile_for(config.model.model, config.model.server)
    structured = {
        "strict": "json_schema strict",
        "schema": "json_schema without strict",
        "json_object": "json_object with the schema in the prompt",
    }[profile.structured]
    return f"server {config.model.server}: {profile.output_cap_key}, {structured}"


def channel_problem(channel: str | None) -> str | None:
    """A ``channel`` the probe's answer named though none was asked for (ENV-09): None when it is null, "none" or
    the like, or a channel id; else what a small model does with free fields (issue 38)."""
    wanted = (channel or "").strip().lower().lstrip("#")
    if wanted in _NO_CHANNEL_WORDS or _CHANNEL_ID.match(wanted):
        return None
    return f"its channel names {clip(json.dumps(channel), 60)}, no channel it can address"


def envelope_problem(body: Any) -> str | None:
    """Why a 200 answer to the envelope probe is not a usable reply (issue 38), or None when it is: a message,
    not cut at the output cap, whose content is a valid envelope with an answer and a resolvable channel."""
    try:
        choice = body["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return "the answer has no message"
    if choice.get("finish_reason") == "length":
        return "the answer was cut at its output cap (finish_reason length): not a whole JSON object"
    if not isinstance(content, str):
        return "the answer has no text"
    try:
        envelope = Envelope.model_validate(json.loads(content))
    except ValidationError as exc:
        return f"the answer is not a valid reply envelope: {invalid_fields(exc)}"
    except ValueError:
        return f"the answer is not JSON: {clip(content, 80)}"
    if not (envelope.answer or "").strip() and envelope.answer_needed:
        return "the envelope has no answer"
    return channel_problem(envelope.channel)


def endpoint_finding(
    config: ImpConfig,
    base: str,
    timing: EndpointTiming,
    *,
    status: int,
    body: Any,
    elapsed_s: float,
    fell_back: bool,
) -> Finding:
    """The endpoint row from the imp's own reply call (issue 38): usable or not, how long it took, the timing
    in force, and whether the server needed ``json_object`` in place of ``json_schema``."""
    model, imp = config.model.model, config.name
    where = f"{model} at {base} ({profile_words(config)})"
    if not 200 <= status < 300:
        message = error_words(body)
        if fell_back or refuses_json_schema(status, body):
            return Finding(
                "Model endpoint", "fail",
                f"{where}: this server cannot give structured output: it refused response_format json_schema "
                f"and json_object (HTTP {status}: {message})",
                "use a server that takes response_format json_schema or json_object: llama.cpp's llama-server, "
                "Ollama, vLLM or LM Studio (docs/models.md)",
            )  # fmt: skip
        return Finding(
            "Model endpoint", "fail", f"{where}: HTTP {status}: {message}", http_fix(status, model, imp)
        )
    problem = envelope_problem(body)
    took = f"answered a reply envelope in {elapsed_s:.1f} s; {timing.words()}"
    if problem is not None:
        return Finding("Model endpoint", "fail", f"{where} {took}, but {problem}", _answer_fix(problem, imp))
    if fell_back:
        return Finding(
            "Model endpoint", "warn",
            f"{where} refused response_format json_schema; with json_object and the schema in the prompt it {took}",
            f'impyard imp set {imp} model.server=llama-cpp-python (each box otherwise learns it from one refused call)',
        )  # fmt: skip
    limit = timing.attempt_timeout_s
    if limit is not None and elapsed_s > limit * SLOW_SHARE:
        return Finding(
            "Model endpoint", "warn", f"{where} {took}: slow, a turn makes several such calls",
            f"a smaller model or a faster machine, or a longer ceiling: impyard imp set {imp} "
            f"sessions.turn_ceiling_s=SECONDS (now {timing.turn_ceiling_s:g})",
        )  # fmt: skip
    return Finding("Model endpoint", "ok", f"{where} {took} (metered as {imp}'s)")


def _answer_fix(problem: str, imp: str) -> str:
    if "output cap" in problem:
        return f"a longer cap (impyard imp set {imp} model.max_tokens=N), or a larger model that stops on its own"
    if "not a valid reply envelope" in problem or "channel" in problem:
        return "a model this small fills the envelope's free fields wrongly: try a larger instruct model (docs/models.md)"
    return "use a model and server with structured output (response_format json_schema or json_object): the imp's replies need it"


def slow_finding(config: ImpConfig, base: str, timing: EndpointTiming, waited_s: float) -> Finding:
    """The server took the call and did not answer within the imp's own attempt limit (issue 38: slow, not
    unreachable)."""
    return Finding(
        "Model endpoint", "fail",
        f"{config.model.model} at {base} ({profile_words(config)}) took the call but did not answer within "
        f"{waited_s:g} s; {timing.words()}",
        "the server is up but too slow for these limits: a smaller model or a faster machine, or a longer "
        f"ceiling: impyard imp set {config.name} sessions.turn_ceiling_s=SECONDS",
    )  # fmt: skip


def error_words(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return clip(str(body["error"].get("message", "")), 200) or "no message"
    return clip(json.dumps(body), 200) if body is not None else "no body"
