"""Model profiles: which request parameters each model family and each model server takes (issue 16).

The request builders (``box.common.request_bodies``, ``box.memory.calls``, ``impyard doctor``) send only
what the configured model takes; the host refuses, when imp.toml is loaded, a ``[model]`` table that asks
for what no request could carry (``config_problems``), and ``impyard imp add`` / ``imp set`` name a model
that impyard has no profile for. Pure: no I/O, plain values in and out.

What a profile says:

* **reasoning** — the ``reasoning_effort`` values the model takes (none: not a reasoning model, so neither
  ``reasoning_effort`` nor the Responses ``reasoning`` is sent) and its own effort when none is sent;
* **temperature** — taken always, never, or only while the effective effort is ``none``;
* **output cap** — ``max_completion_tokens`` or ``max_tokens`` on chat/completions (the Responses API
  always takes ``max_output_tokens``);
* **structured output** — ``response_format`` json_schema with ``strict: true``, or without ``strict``;
* **vision**, **tools**, and whether the **Responses API** is served.

Sources (the OpenAI API reference, checked for issue 16): ``reasoning_effort`` — "gpt-5.1 defaults to none,
which does not perform reasoning. The supported reasoning values for gpt-5.1 are none, low, medium, and
high. [...] All models before gpt-5.1 default to medium reasoning effort, and do not support none. [...]
xhigh is supported for all models after gpt-5.1-codex-max" (gpt-5.2: none..xhigh); the reasoning guide
(temperature and top_p only with effort ``none`` on gpt-5.1 / gpt-5.2; gpt-5 takes only the default
temperature; the o-series none); o-series and gpt-5 refuse ``max_tokens`` (``max_completion_tokens``
instead); non-reasoning models (gpt-4.1, gpt-4o) refuse ``reasoning_effort`` / ``reasoning`` with 400
``unsupported_parameter``; o3-mini takes no images; gpt-5.2 takes function tools on chat/completions only
with effort ``none`` (the live 400 behind SPEC-001 ENV-21). Local servers: Ollama's "OpenAI compatibility" page
(``response_format``, ``max_tokens``, ``tools``, images); llama.cpp ``tools/server`` (``response_format``
json_schema read from ``json_schema.schema``, ``strict`` ignored; tools need ``--jinja``); vLLM's
OpenAI-compatible server (``response_format`` json_schema with ``strict``; tools need
``--enable-auto-tool-choice``); LM Studio "Structured Output" (the OpenAI ``response_format`` shape).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from box.common.schema_bounds import FINE_TUNED, GUIDED, LLAMA_GRAMMAR, OPENAI_STRICT, SchemaDialect

# The [model] server value for OpenAI itself, where a model's profile is picked by its name; every other
# server ([model] server in imp.toml) has one profile in SERVER_PROFILES for all the models it serves.
OPENAI: Final = "openai"
EFFORTS: Final[tuple[str, ...]] = ("none", "minimal", "low", "medium", "high", "xhigh")  # least to most
LEAST_EFFORT: Final = "none"

TemperatureRule = Literal["any", "effort_none", "never"]
Structured = Literal["strict", "schema"]  # json_schema with strict: true | json_schema without strict
# Issue 38: a server that refuses json_schema (llama-cpp-python's own server) gets {"type": "json_object"}, with
# the schema in the prompt (box.common.structured) and the answer checked as every answer is.
StructuredFallback = Literal["json_object"]


@dataclass(frozen=True)
class ModelProfile:
    """What one model family (or one server, for every model it serves) takes in a request."""

    family: str  # "gpt-5.1", "o3", "ollama", …; "unknown" for an OpenAI model impyard has no profile for
    efforts: tuple[str, ...] = ()  # reasoning_effort values it takes; () = no reasoning parameters at all
    default_effort: str | None = None  # its own effort when none is sent
    temperature: TemperatureRule = "any"
    output_cap_key: Literal["max_completion_tokens", "max_tokens"] = "max_completion_tokens"
    structured: Structured | StructuredFallback = "strict"
    vision: bool = True
    tools: bool = True
    responses_api: bool = True
    chat_tools_effort_none: bool = False  # function tools on chat/completions only with effort none (ENV-21)
    known: bool = True  # False: a name impyard has no profile for (a warning, never a refusal)
    # Issue 38: the bound keywords (maxLength, maxItems) its structured output takes (box.common.schema_bounds)
    schema_dialect: SchemaDialect = OPENAI_STRICT

    @property
    def reasoning(self) -> bool:
        return bool(self.efforts)

    def effort_for(self, wanted: str) -> str | None:
        """The ``reasoning_effort`` to send for the configured ``wanted``; None: send none.

        A model that does not reason gets none. One that does not take ``wanted`` gets the nearest effort it
        takes (a tie goes to the lesser): ``none`` on gpt-5 is ``minimal``, on o3 ``low`` — as little
        reasoning as the model does, which is what ENV-21's "none" asks for.
        """
        if not self.efforts:
            return None
        if wanted in self.efforts:
            return wanted
        rank = EFFORTS.index(wanted) if wanted in EFFORTS else EFFORTS.index(LEAST_EFFORT)
        return min(
            self.efforts, key=lambda effort: (abs(EFFORTS.index(effort) - rank), EFFORTS.index(effort))
        )

    def takes_temperature(self, effort_sent: str | None) -> bool:
        """Whether ``temperature`` may go with a call that sends ``effort_sent`` (None: no effort sent)."""
        if self.temperature == "any":
            return True
        if self.temperature == "never":
            return False
        effective = effort_sent if effort_sent is not None else self.default_effort
        return effective == LEAST_EFFORT

    def response_format(self, name: str, schema: dict[str, Any]) -> dict[str, Any]:
        """chat/completions ``response_format`` asking for ``schema`` the way this server takes it."""
        if self.structured == "json_object":  # issue 38: the schema goes in the prompt instead
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": self._json_schema(name, schema)}

    def text_format(self, name: str, schema: dict[str, Any]) -> dict[str, Any]:
        """The Responses API ``text`` asking for ``schema`` (the same fields, flat under ``format``)."""
        return {"format": {"type": "json_schema", **self._json_schema(name, schema)}}

    def _json_schema(self, name: str, schema: dict[str, Any]) -> dict[str, Any]:
        if self.structured == "strict":
            return {"name": name, "strict": True, "schema": schema}
        return {"name": name, "schema": schema}


# The OpenAI families, most specific first: a model's name is its family's name, or that name and "-…"
# (a size, a snapshot date: gpt-4.1-mini, gpt-5.1-2025-11-13).
O_EFFORTS: Final = ("low", "medium", "high")
OPENAI_FAMILIES: Final[tuple[ModelProfile, ...]] = (
    ModelProfile(
        "gpt-5.2",
        ("none", "low", "medium", "high", "xhigh"),
        "none",
        "effort_none",
        chat_tools_effort_none=True,
    ),
    ModelProfile("gpt-5.1", ("none", "low", "medium", "high"), "none", "effort_none"),
    ModelProfile("gpt-5", ("minimal", "low", "medium", "high"), "medium", "never"),  # gpt-5, -mini, -nano
    ModelProfile("o4-mini", O_EFFORTS, "medium", "never"),
    ModelProfile("o3-mini", O_EFFORTS, "medium", "never", vision=False),
    ModelProfile("o3", O_EFFORTS, "medium", "never"),
    ModelProfile("o1", O_EFFORTS, "medium", "never"),
    ModelProfile("gpt-4.1"),  # gpt-4.1, -mini, -nano: no reasoning, temperature 0-2
    ModelProfile("gpt-4o"),  # gpt-4o, gpt-4o-mini
)
# An OpenAI model impyard has no profile for: nothing a model might refuse beyond the basics.
UNKNOWN_OPENAI: Final = ModelProfile("unknown", known=False)

# Servers other than OpenAI: one profile for every model they serve. No reasoning parameters (their
# names and values differ per model), no Responses API (impyard's Responses path needs OpenAI's stateless
# reasoning items), max_tokens as the output cap.


def _server(name: str, structured: Structured | StructuredFallback) -> ModelProfile:
    return ModelProfile(name, structured=structured, output_cap_key="max_tokens", responses_api=False)


SERVER_PROFILES: Final[dict[str, ModelProfile]] = {
    "ollama": _server("ollama", "schema"),  # strict is not read: the schema alone constrains the output
    "llama.cpp": _server("llama.cpp", "schema"),  # reads json_schema.schema; strict ignored
    "vllm": _server("vllm", "strict"),
    "lmstudio": _server("lmstudio", "strict"),
    "compatible": _server("compatible", "strict"),  # any other OpenAI-compatible service
    "llama-cpp-python": _server(
        "llama-cpp-python", "json_object"
    ),  # issue 38: its server refuses json_schema
}


# Issue 38: how each server's structured output reads bounds (box.common.schema_bounds); a server not named
# here keeps OpenAI's strict subset. Set apart from the table above, so each concern keeps its own lines.
SERVER_SCHEMA_DIALECTS: Final[dict[str, SchemaDialect]] = {
    "ollama": LLAMA_GRAMMAR,  # its runner hands the schema to llama.cpp's json-schema-to-grammar
    "llama.cpp": LLAMA_GRAMMAR,
    "llama-cpp-python": LLAMA_GRAMMAR,  # llama.cpp underneath: the schema in its prompt keeps the bounds
    "lmstudio": LLAMA_GRAMMAR,  # llama.cpp's grammar for GGUF models
    "vllm": GUIDED,
}
for _name, _dialect in SERVER_SCHEMA_DIALECTS.items():
    SERVER_PROFILES[_name] = replace(SERVER_PROFILES[_name], schema_dialect=_dialect)


def base_model(model: str) -> str:
    """A fine-tuned model's base (``ft:gpt-4.1-mini-2025-04-14:org::id`` → ``gpt-4.1-mini-2025-04-14``)."""
    name = model.strip().lower()
    if name.startswith("ft:"):
        name = name[3:].split(":", 1)[0]
    return name


def profile_for(model: str, server: str = OPENAI) -> ModelProfile:
    """The profile of ``model`` on ``server``; a server impyard does not know is an OpenAI-compatible one."""
    if server != OPENAI:
        return SERVER_PROFILES.get(server, SERVER_PROFILES["compatible"])
    name = base_model(model)
    for profile in OPENAI_FAMILIES:
        if name == profile.family or name.startswith(profile.family + "-"):
            return _fine_tuned(profile) if model.strip().lower().startswith("ft:") else profile
    return UNKNOWN_OPENAI


def _fine_tuned(profile: ModelProfile) -> ModelProfile:
    """Issue 38: a fine-tuned model's strict schemas take no bound keywords at all (the Structured Outputs
    guide: "When using fine-tuned models, additional constraints are unsupported")."""
    return replace(profile, schema_dialect=FINE_TUNED)


# ------------------------------------------------------------------ what a [model] table may ask for


@dataclass(frozen=True)
class SettingProblem:
    """A ``[model]`` key that asks for what the configured model cannot take, and the one-line fix."""

    key: str
    reason: str


def _where(model: str, server: str) -> str:
    return model if server == OPENAI else f"{model} on {server}"


def config_problems(
    *,
    models: dict[str, str],
    server: str = OPENAI,
    reasoning_effort: str | None = None,
    temperature: float | None = None,
    tools: bool = False,
    use_responses_api: bool = False,
) -> list[SettingProblem]:
    """What no request could carry, for a ``[model]`` table: ``models`` maps each model key that is set
    (``model``, ``vision_model``, …) to its model; ``reasoning_effort`` and ``temperature`` are given only
    when set explicitly (a default is adapted per model, never refused)."""
    problems: list[SettingProblem] = []
    for key, model in models.items():
        profile = profile_for(model, server)
        where = _where(model, server)
        if reasoning_effort is not None and reasoning_effort != LEAST_EFFORT and not profile.reasoning:
            problems.append(
                SettingProblem(
                    "reasoning_effort",
                    f'{key} {where} does not reason, so it takes no reasoning_effort (got "{reasoning_effort}"): '
                    'remove reasoning_effort (or set it to "none"), or use a reasoning model such as gpt-5.1',
                )
            )
        elif reasoning_effort is not None and profile.reasoning and reasoning_effort not in profile.efforts:
            nearest = profile.effort_for(reasoning_effort)
            problems.append(
                SettingProblem(
                    "reasoning_effort",
                    f'{key} {where} does not take reasoning_effort "{reasoning_effort}" (it takes '
                    f'{", ".join(profile.efforts)}): set reasoning_effort = "{nearest}"',
                )
            )
        if temperature is not None:
            effort = profile.effort_for(reasoning_effort or LEAST_EFFORT)
            if profile.temperature == "never":
                problems.append(
                    SettingProblem(
                        "temperature",
                        f"{key} {where} takes no temperature (only its own): remove temperature",
                    )
                )
            elif profile.temperature == "effort_none" and effort != LEAST_EFFORT:
                problems.append(
                    SettingProblem(
                        "temperature",
                        f'{key} {where} takes temperature only with reasoning_effort = "none" (got '
                        f'"{reasoning_effort}"): remove temperature or set reasoning_effort = "none"',
                    )
                )
        if (
            tools
            and not use_responses_api
            and profile.chat_tools_effort_none
            and profile.effort_for(reasoning_effort or LEAST_EFFORT) != LEAST_EFFORT
        ):
            problems.append(
                SettingProblem(
                    "reasoning_effort",
                    f'{key} {where} takes tools on /chat/completions only with reasoning_effort = "none" '
                    f'(ENV-21; got "{reasoning_effort}"): set reasoning_effort = "none", or use_responses_api = true',
                )
            )
        if tools and not profile.tools:
            problems.append(
                SettingProblem("tools", f"{key} {where} cannot call tools: remove tools (tools = [])")
            )
        if use_responses_api and not profile.responses_api:
            problems.append(
                SettingProblem(
                    "use_responses_api",
                    f"{where} has no Responses API impyard can use: set use_responses_api = false",
                )
            )
        if key == "vision_model" and not profile.vision:
            problems.append(
                SettingProblem(
                    "vision_model",
                    f"vision_model {where} cannot see images: name a model that can (e.g. gpt-5.1), or remove it",
                )
            )
    unique: dict[tuple[str, str], SettingProblem] = {}
    for problem in problems:
        unique.setdefault((problem.key, problem.reason), problem)
    return list(unique.values())


def model_notes(model: str, server: str = OPENAI) -> list[str]:
    """Warnings (never refusals) about ``model``: a name impyard has no profile for."""
    if profile_for(model, server).known:
        return []
    families = ", ".join(profile.family for profile in OPENAI_FAMILIES)
    return [
        f"impyard has no profile for model {model!r}: it sends it no reasoning parameters and the basic ones "
        f"otherwise (known families: {families}); for a local or other server set model.server "
        "(docs/models.md)"
    ]


# ------------------------------------------------------------------ issue 38: how long a server may take


@dataclass(frozen=True)
class ServerTiming:
    """How long a turn, and one model attempt in it, may take on a server; and whether a call given up is
    ended upstream. ``[sessions] turn_ceiling_s`` in imp.toml, where written, wins; the attempt timeout is
    then derived from the ceiling as ever (``box.common.attempts.attempt_timeout_s``: ENV-12's three attempts
    and their backoffs fit in it)."""

    turn_ceiling_s: float
    # A local server (every server but OpenAI): its compute is the host's own, and a call no one waits for
    # only slows the next, so a model call ends with the box that asked (its turn ended), and every call of
    # the box (memory, pictures) may take as long as a reply attempt. OpenAI: a call outlives its box and is
    # charged what it cost (issue 19 #4b); a reply attempt the box gives up is ended upstream all the same.
    local: bool


# OpenAI: a reply in seconds; 120 s holds ENV-12's three attempts of 35 s.
HOSTED_TIMING: Final = ServerTiming(turn_ceiling_s=120.0, local=False)
# A local server on a CPU: a 0.5B model ran ~11 tokens/s (issue 38), a normal reply ~26 s, a full
# 1,024-token answer ~95 s, one that ran away to the cap up to 275 s while another call held the server; a
# turn made 2-7 reply calls. 900 s (15 minutes) holds seven normal calls with the memory's after them, and
# gives each attempt 269 s: a whole 1,024-token answer at 4 tokens/s (a 3B model on a few cores).
LOCAL_TIMING: Final = ServerTiming(turn_ceiling_s=900.0, local=True)


def timing_for(server: str) -> ServerTiming:
    """The timing defaults of ``server`` (the ``[model] server`` value): OpenAI's, or a local server's."""
    return HOSTED_TIMING if server == OPENAI else LOCAL_TIMING
