"""``impyard doctor``'s rules: from what was observed to a finding with its fix (issue 17).

Pure functions over plain values, so each rule's test is a table; the CLI (impyard/cli/doctor.py)
observes (Docker, the disk, the policy, the gateway) and prints. A finding is ``ok``, ``warn`` (works,
but not as it should: no lockdown, no Discord token) or ``fail`` (a chat does not work until it is fixed);
``impyard doctor`` exits 1 when any finding fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from box.common.request_bodies import chat_body, responses_body
from box.protocol.models import ResponderSettings
from impyard.backends.base import BoxStartError
from impyard.backends.runtimes import GVISOR, RuntimeChoice, install_hint, resolve_runtime, runtime_words
from impyard.imps.config import MEMORY_PURPOSES, ImpConfig

Status = Literal["ok", "warn", "fail"]

MIB = 1024**2
FREE_FAIL_BYTES = 100 * MIB  # below this the database and the boxes' state run out of room mid-turn
FREE_WARN_BYTES = 1024 * MIB
# The memory engine's chat calls: every memory purpose but the reply's own and the embedding (issue 23; issue 38:
# all nine, as the README's rule lists them, not three, so `imp add` warns about every call that would be denied).
MEMORY_CALL_PURPOSES: tuple[str, ...] = tuple(p for p in MEMORY_PURPOSES if p not in ("reply", "embedding"))
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


def _memory_body(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "system", "content": SAMPLE_TEXT}, {"role": "user", "content": SAMPLE_TEXT}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "doctor", "strict": True, "schema": PROBE_SCHEMA},
        },
    }


def model_uses(config: ImpConfig) -> list[ModelUse]:
    """Every (purpose, path, model) the imp's boxes call: its reply models, and with memory on the memory
    engine's calls (a model per purpose from ``[memory] models``, else ``[model] model``) and, with the
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
            routed_as = purpose
            if purpose == "arrival" and purpose not in config.memory.models:
                routed_as = (
                    "reply"  # box/memory/calls.py model_for: unrouted, the arrival goes where the reply goes
                )
            routed = config.memory.models.get(routed_as)  # type: ignore[call-overload]
            model = routed or config.model.model
            key = f"memory.models.{routed_as}" if routed else "model.model"
            uses.append(ModelUse(purpose, "/chat/completions", model, key, _memory_body(model)))
        if config.memory.embedder == "gateway":
            model = config.memory.embedding_model
            body = {"model": model, "input": [SAMPLE_TEXT], "dimensions": config.memory.dimensions}
            uses.append(ModelUse("embedding", "/embeddings", model, "memory.embedding_model", body))
    return list(dict.fromkeys(uses))  # one check per (purpose, path, model)


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
