"""The imp config: ``imp.toml``'s typed model and the errors a broken one raises.

A broken file raises ``ImpConfigError`` naming the file, the line (where it can
be found), the key, the reason and the fix; nothing is ever half-loaded. The box
receives only ``ImpConfig.imp_spec()``: name, persona and responder/memory
settings, never owners, tokens or host paths (docs/architecture.md). The store that
adds, reads and removes imps is ``impyard.imps.store``; a file is read and checked by
``impyard.imps.validate`` and written back by ``impyard.imps.render``.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from box.common.attempts import attempt_timeout_s
from box.common.embedding import LOCAL_EMBEDDING_DIMS, LOCAL_EMBEDDING_MODEL
from box.common.model_profiles import timing_for
from box.protocol.models import ImpSpec, MemoryPurpose, MemorySettings, ModelName, ResponderSettings
from impyard.errors import ImpyardError
from impyard.toml_errors import Problem, ProblemsError

if TYPE_CHECKING:
    from impyard.backends.docker import DockerLimits

CONFIG_FILE = "imp.toml"
DEFAULT_PERSONA_FILE = "persona.md"
STATE_DIR = "state"
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
NAME_RULE = (
    "1-32 characters: lowercase letters, digits and dashes, starting with a letter (e.g. 'pip', 'desk-2')"
)
TOKEN_ENV_PREFIX = "IMPYARD_DISCORD_TOKEN_"
MAX_CONFIG_BYTES = 256 * 1024
MAX_PERSONA_CHARS = 100_000  # the persona goes into every model call
MAX_NEWS_BYTES = 64 * 1024
MAX_TOKEN_FILE_BYTES = 4096
MAX_GOT_CHARS = 60
DEFAULT_STARTER_PERSONA = "You are {name}, a helpful and friendly assistant.\n"

# Keys that would hold a secret: refused anywhere in imp.toml with a pointer to token_env / token_file.
SECRET_KEYS = frozenset(
    {"token", "bot_token", "discord_token", "api_key", "openai_api_key", "secret", "password"}
)
SECRET_FIX = (
    "secrets never go in imp.toml: set [discord] token_env (the name of an environment variable "
    "holding the token) or token_file (a file holding it), and remove this key"
)


# ------------------------------------------------------------------ errors


class ImpError(ImpyardError):
    """Any refusal of the imp store; the message is one line that says what to do."""


class ImpNameError(ImpError, ValueError):
    """The name is not a valid imp name."""


class ImpNotFound(ImpError, LookupError):
    """No imp of that name; the message lists the imps there are."""


class ImpExists(ImpError):
    """``add`` of a name that is already an imp."""


class ConfigProblem(Problem):
    def key_text(self) -> str:
        return f"key '{self.key}'"


class ImpConfigError(ProblemsError[ConfigProblem], ImpError):
    """An imp's config (or persona, news or token file) is broken; ``problems`` lists every finding.

    The message is one line per problem: ``<file>[:<line>]: key '<key>': <reason and fix>``.
    """


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid imp name, else raise ``ImpNameError`` saying what a name may be."""
    if isinstance(name, str) and NAME_PATTERN.match(name):
        return name
    shown = name if isinstance(name, str) and len(name) <= MAX_GOT_CHARS else f"{str(name)[:MAX_GOT_CHARS]}…"
    hint = ""
    if isinstance(name, str) and NAME_PATTERN.match(name.lower()):
        hint = f" (did you mean '{name.lower()}'?)"
    raise ImpNameError(f"invalid imp name {shown!r}: use {NAME_RULE}{hint}")


# ------------------------------------------------------------------ the config model


def _field(default: Any, doc: str, *, expect: str, example: Any = None, **constraints: Any) -> Any:
    """A config field: ``doc`` becomes the comment in a new imp.toml, ``expect`` the error text."""
    extra: dict[str, Any] = {"expect": expect}
    if example is not None:
        extra["example"] = example
    return Field(default=default, description=doc, json_schema_extra=extra, **constraints)


def _box_default(settings: type[BaseModel], key: str) -> Any:
    """The box's default for ``key``: box/protocol/models.py is the one source of every responder/memory default."""
    return settings.model_fields[key].get_default(call_default_factory=True)


def _section(cls: type[BaseModel], doc: str, example: str) -> Any:
    return Field(
        default_factory=cls,
        description=doc,
        json_schema_extra={"expect": f"a table: write [{example}] on its own line and the keys under it"},
    )


class _Strict(BaseModel):
    # Strict: a hand-written "60" is not silently a number, "yes" not a bool; unknown keys are typos.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _check_relative_path(value: str | None) -> str | None:
    """Paths in imp.toml: absolute, or relative to the imp's directory without leaving it or entering state/."""
    if value is None:
        return None
    if not value.strip() or "\x00" in value:
        raise ValueError("must be a file path (relative to the imp's directory, or absolute)")
    path = Path(value)
    if path.is_absolute():
        return value
    if ".." in path.parts:
        raise ValueError(
            f"must stay inside the imp's directory (got {value!r}): drop the '..' or use an absolute path"
        )
    if path.parts and path.parts[0] == STATE_DIR:
        raise ValueError(
            f"must not be under {STATE_DIR}/ (got {value!r}): the box writes there, so it must never "
            "feed the host's config; move the file next to imp.toml"
        )
    return value


def _snowflake(value: Any) -> Any:
    # Discord ids are often pasted as bare TOML integers; store them as strings of digits.
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    return value


Snowflake = Annotated[str, Field(pattern=r"^[0-9]{1,20}$")]
RegexPair = Annotated[list[str], Field(min_length=2, max_length=2)]
Seconds = Annotated[float, Field(allow_inf_nan=False)]


class ModelConfig(_Strict):
    """``[model]``: how the responder calls the model (SPEC-001).

    Every key the box also knows takes its default from ``ResponderSettings``, so the two cannot drift.
    """

    model: str = _field(
        _box_default(ResponderSettings, "model"),
        "The default reply model.",
        expect="a model name in quotes, at most 128 characters",
        min_length=1,
        max_length=128,
    )
    server: Literal["openai", "ollama", "llama.cpp", "vllm", "lmstudio", "compatible", "llama-cpp-python"] = (
        _field(
            _box_default(ResponderSettings, "server"),
            "Where OPENAI_BASE_URL points: openai (each model's profile by its name), ollama, llama.cpp, vllm, "
            "lmstudio, llama-cpp-python, or compatible (another OpenAI-compatible service); decides which "
            "parameters are sent and the turn's time limits (docs/models.md).",
            expect='one of "openai", "ollama", "llama.cpp", "vllm", "lmstudio", "compatible", "llama-cpp-python"',
        )
    )
    vision_model: str | None = _field(
        _box_default(ResponderSettings, "vision_model"),
        "Used when the message carries images (default: model).",
        expect="a model name in quotes, at most 128 characters",
        example="gpt-4.1",
        min_length=1,
        max_length=128,
    )
    factual_model: str | None = _field(
        _box_default(ResponderSettings, "factual_model"),
        "Used for factual look-ups (default: model).",
        expect="a model name in quotes, at most 128 characters",
        example="gpt-4.1",
        min_length=1,
        max_length=128,
    )
    retry_model: str | None = _field(
        _box_default(ResponderSettings, "retry_model"),
        "Used after a rate limit until a call succeeds again (ENV-15; default: none).",
        expect="a model name in quotes, at most 128 characters",
        example="gpt-4.1-nano",
        min_length=1,
        max_length=128,
    )
    max_tokens: int = _field(
        _box_default(ResponderSettings, "max_tokens"),
        "Most tokens one reply may use.",
        expect="a whole number from 1 to 128000",
        ge=1,
        le=128_000,
    )
    temperature: float | None = _field(
        _box_default(ResponderSettings, "temperature"),
        "Sampling temperature (default: the model's own).",
        expect="a number from 0 to 2",
        example=0.7,
        ge=0,
        le=2,
        allow_inf_nan=False,
    )
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] = _field(
        _box_default(ResponderSettings, "reasoning_effort"),
        "Reasoning effort sent when tools are attached (ENV-21) and on Responses calls (ENV-22); only to a "
        "model that reasons, as the nearest effort it takes (docs/models.md).",
        expect='one of "none", "minimal", "low", "medium", "high", "xhigh"',
    )
    use_responses_api: bool = _field(
        _box_default(ResponderSettings, "use_responses_api"),
        "Call /responses instead of /chat/completions (ENV-22).",
        expect="true or false",
    )
    responses_tool_rounds: int = _field(
        _box_default(ResponderSettings, "responses_tool_rounds"),
        "Tool rounds on the Responses API before a forced tool-less answer (ENV-23).",
        expect="a whole number from 1 to 16",
        ge=1,
        le=16,
    )
    tool_rounds: int = _field(
        _box_default(ResponderSettings, "tool_rounds"),
        "Tool rounds on chat/completions.",
        expect="a whole number from 0 to 16",
        ge=0,
        le=16,
    )
    tools: list[Literal["web_fetch", "search"]] = _field(
        _box_default(ResponderSettings, "tools"),
        "Function tools the responder may call: web_fetch (only hosts a policy http.fetch rule allows), search (memory).",
        expect='a list like ["web_fetch"]',
    )
    history_limit: int = _field(
        _box_default(ResponderSettings, "history_limit"),
        "Most history messages sent to the model (ENV-07).",
        expect="a whole number from 0 to 500",
        ge=0,
        le=500,
    )
    history_per_channel: int = _field(
        _box_default(ResponderSettings, "history_per_channel"),
        "History messages kept per channel when shrinking (ENV-11).",
        expect="a whole number from 0 to 500",
        ge=0,
        le=500,
    )
    short_path: list[RegexPair] = _field(
        _box_default(ResponderSettings, "short_path"),
        "[channel_regex, user_regex] pairs archived without a model call (ENV-05; Python re syntax).",
        expect='a list of [channel_regex, user_regex] pairs, e.g. [["^announcements$", ".*"]]',
        example=[["^announcements$", ".*"]],
    )
    news_file: str | None = _field(
        None,
        "A file whose text goes into the prompt's ## Context (ENV-10; relative to the imp's directory).",
        expect="a file path in quotes",
        example="news.md",
    )

    # Issue 38: pictures are asked of the model only where they can be made (docs/conversation.md).
    images: bool | None = _field(
        _box_default(ResponderSettings, "images"),
        "Whether the envelope asks for pictures (the image model on the same server): unset = yes on server "
        "openai, no on any other (a local server makes none); the policy must allow purpose image as well.",
        expect="true or false",
        example=True,
    )

    @field_validator("short_path")
    @classmethod
    def _regexes_compile(cls, pairs: list[list[str]]) -> list[list[str]]:
        for index, pair in enumerate(pairs):
            for which, pattern in zip(("channel_regex", "user_regex"), pair, strict=True):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(
                        f"rule {index + 1}'s {which} {pattern!r} is not a valid regular expression ({exc}); "
                        "fix it, or escape special characters with \\"
                    ) from None
        return pairs

    @field_validator("news_file")
    @classmethod
    def _news_path(cls, value: str | None) -> str | None:
        return _check_relative_path(value)


def _box_bounds(settings: type[BaseModel], key: str) -> dict[str, Any]:
    """The box's ``ge``/``le`` for ``key``: imp.toml refuses what the box would refuse, with the same bounds."""
    bounds: dict[str, Any] = {}
    for item in settings.model_fields[key].metadata:
        for name in ("ge", "le", "min_length", "max_length"):
            if getattr(item, name, None) is not None:
                bounds[name] = getattr(item, name)
    return bounds


MEMORY_PURPOSES: tuple[str, ...] = typing.get_args(MemoryPurpose)
# Written into imp.toml by the commands that create an imp for an operator (`impyard imp add`,
# `impyard chat`'s first imp): new imps remember (issue 23). The box's own default, and so a config
# without the key, stays off: imps built by code (tests, tools) never make memory calls they did not ask for.
# Issue 33: and they embed with the host's local model (no network, no cost). Written here, not made the box's
# default: an imp without the key keeps the gateway embedder its stored vectors were made with.
NEW_IMP_MEMORY: dict[str, Any] = {"enabled": True, "embedder": "local"}


def new_imp_settings(settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """``ImpStore.add`` settings for an imp an operator creates: memory on unless ``settings`` say otherwise."""
    out = dict(settings or {})
    out["memory"] = {**NEW_IMP_MEMORY, **dict(out.get("memory") or {})}
    return out


def _bounded(key: str, doc: str, expect: str, **extra: Any) -> Any:
    """A ``[memory]`` field whose default and bounds are the box's (``MemorySettings``)."""
    bounds = _box_bounds(MemorySettings, key)
    return _field(
        _box_default(MemorySettings, key),
        doc,
        expect=expect.format(**bounds),
        allow_inf_nan=False,
        **bounds,
        **extra,
    )


class MemoryConfig(_Strict):
    """``[memory]``: the memory engine inside the box (issue 23); every key mirrors ``MemorySettings``.

    Defaults and bounds are the box's own, so the two cannot drift.
    """

    enabled: bool = _field(
        _box_default(MemorySettings, "enabled"),
        "The imp remembers what happens to it (new imps are created with true; false, or no key, turns it off).",
        expect="true or false",
    )
    embedder: Literal["gateway", "hashing", "local"] = _field(
        _box_default(MemorySettings, "embedder"),
        "local: all-MiniLM-L6-v2 computed by the host (no network, no key, no cost; 384 dimensions; new imps get "
        "it); gateway: embeddings from embedding_model through the gateway (metered, audited); "
        "hashing: a 64-dimension word-hashing embedder for tests (no calls, weak recall). "
        "Changing it leaves older memories unsearchable by meaning (found by person and recency).",
        expect='one of "local", "gateway", "hashing"',
    )
    embedding_model: str = _field(
        _box_default(MemorySettings, "embedding_model"),
        "The embedding model of the gateway embedder (purpose embedding, path /embeddings; the policy must allow "
        "it); not used by the local or hashing embedder.",
        expect="a model name in quotes, at most 128 characters",
        **_box_bounds(MemorySettings, "embedding_model"),
    )
    dimensions: int = _bounded(
        "dimensions",
        "Vector length asked of the embedding model: small keeps 100,000 memories in the box's memory limit "
        "(changing it leaves older memories unsearchable until re-embedded; the hashing embedder always gives 64, "
        "the local one 384).",
        "a whole number from {ge} to {le}",
    )
    models: dict[MemoryPurpose, ModelName] = _field(
        _box_default(MemorySettings, "models"),
        'A model per memory call (mechanism 55), e.g. { appraisal = "gpt-4.1-nano" }; purposes: '
        + ", ".join(p for p in MEMORY_PURPOSES if p != "embedding")
        + ". A purpose not listed uses [model] model; the policy must allow each.",
        expect='a table of purpose = "model name" (1 to 128 characters), e.g. { appraisal = "gpt-4.1-nano" }',
        example={"appraisal": "gpt-4.1-nano", "summary": "gpt-4.1-nano"},
    )
    valence_bias: float = _bounded(
        "valence_bias",
        "Temperament (mechanism 60): added to how good or bad each moment feels; below 0 gloomier, above 0 sunnier.",
        "a number from {ge:g} to {le:g}",
    )
    intensity_amplification: float = _bounded(
        "intensity_amplification",
        "Temperament (mechanism 60): how strongly moments are felt; 1 as appraised, below 1 calmer, above 1 stronger.",
        "a number from {ge:g} to {le:g}",
    )
    avoidance_weight: float = _bounded(
        "avoidance_weight",
        "Temperament (mechanism 96): how much more a bad experience weighs than a good one of the same strength.",
        "a number from {ge:g} to {le:g}",
    )
    introspection: bool = _field(
        _box_default(MemorySettings, "introspection"),
        "The imp may look inward before answering (mechanism 52).",
        expect="true or false",
    )
    timezone: str = _field(
        _box_default(MemorySettings, "timezone"),
        'The imp\'s local time zone (IANA name, e.g. "Europe/Oslo"): ages and times of day in its memories.',
        expect='an IANA time zone name in quotes, e.g. "Europe/Oslo" or "UTC"',
        **_box_bounds(MemorySettings, "timezone"),
    )
    call_log_bytes: int = _bounded(
        "call_log_bytes",
        "Most bytes of the box's memory-call log under state/ (mechanism 119; rotated; 0: no log).",
        "a whole number of bytes from {ge} to {le}",
    )

    @field_validator("models", mode="before")
    @classmethod
    def _known_purposes(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # the type check says what a table is
        for key in value:
            if key == "embedding":
                raise ValueError(
                    "the embedding model is embedding_model, not models.embedding: move it there"
                )
            if key not in MEMORY_PURPOSES:
                known = [p for p in MEMORY_PURPOSES if p != "embedding"]
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise ValueError(
                    f"{json.dumps(str(key))[:MAX_GOT_CHARS]} is not a memory purpose; {hint}"
                    f"the purposes are {', '.join(known)}"
                )
        return value

    @field_validator("embedding_model")
    @classmethod
    def _not_the_local_name(cls, value: str) -> str:
        if (
            value == LOCAL_EMBEDDING_MODEL
        ):  # issue 33: a reserved name, answered by the host, never sent upstream
            raise ValueError(
                f'"{value}" is the host\'s local embedder: set embedder = "local" and leave embedding_model out'
            )
        return value

    @field_validator("timezone")
    @classmethod
    def _zone_exists(cls, value: str) -> str:
        text = value.strip()
        try:
            if not text or text.startswith(("/", ".")) or ".." in text:
                raise ValueError(text)
            ZoneInfo(text)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise ValueError(
                f"{json.dumps(value)[:MAX_GOT_CHARS]} is not a time zone: use an IANA name such as "
                '"Europe/Oslo", "America/New_York" or "UTC"'
            ) from None
        return text


class DiscordConfig(_Strict):
    """``[discord]``: the imp's bot. The token is read on the host only, from token_env or token_file."""

    token_env: str | None = _field(
        None,
        "Environment variable holding the bot token (default: IMPYARD_DISCORD_TOKEN_<NAME>).",
        expect='the name of an environment variable, e.g. "IMPYARD_DISCORD_TOKEN_PIP" (its name, never the token)',
        example="IMPYARD_DISCORD_TOKEN_PIP",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
    )
    token_file: str | None = _field(
        None,
        "A file holding the bot token, used instead of token_env (keep it chmod 600).",
        expect="a file path in quotes",
        example="discord.token",
    )
    application_id: Snowflake | None = _field(
        None,
        "The bot's application id (for slash-command sync).",
        expect="a Discord id (digits)",
        example="123456789012345678",
    )
    owner_channel: Snowflake | None = _field(
        None,
        "Channel id where approval cards are posted.",
        expect="a Discord channel id (digits)",
        example="123456789012345678",
    )
    staff_channel: Snowflake | None = _field(
        None,
        "Channel id for staff notes and hack alerts (ENV-03).",
        expect="a Discord channel id (digits)",
        example="123456789012345678",
    )
    presence: bool = _field(
        False,
        'Show what the imp is doing as its bot\'s Discord status after each answered turn ("talking in #general").',
        expect="true or false",
    )  # seed 003: the status side-effect consumer; off by default

    @field_validator("application_id", "owner_channel", "staff_channel", mode="before")
    @classmethod
    def _ids_as_text(cls, value: Any) -> Any:
        return _snowflake(value)

    @field_validator("token_file")
    @classmethod
    def _token_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("token_env") is not None:
            raise ValueError("set token_env or token_file, not both: remove one of them")
        return _check_relative_path(value)


class BoxConfig(_Strict):
    """``[box]``: where and how confined the imp's boxes run (docs/box.md)."""

    backend: Literal["auto", "docker", "process"] = _field(
        "auto",
        "docker; process (no lockdown, development only); auto = docker, else process with a warning.",
        expect='one of "auto", "docker", "process"',
    )
    runtime: Literal["auto", "runsc", "runc"] = _field(
        "auto",
        "The Docker box's OCI runtime: runsc (gVisor, a user-space kernel); runc (the host's kernel); "
        "auto = runsc when the engine has it registered, else runc. IMPYARD_BOX_RUNTIME overrides it.",
        expect='one of "auto", "runsc", "runc"',
    )  # issue 22
    memory: str = _field(
        "512m", "Memory per box (also its swap limit).", expect='a size from "64m" to "64g", e.g. "512m"'
    )
    cpus: float = _field(
        1.0, "CPU cores per box.", expect="a number from 0.1 to 64", ge=0.1, le=64, allow_inf_nan=False
    )
    pids_limit: int = _field(
        128, "Most processes per box.", expect="a whole number from 16 to 4096", ge=16, le=4096
    )
    state_quota: str = _field(
        "256m",
        "Most the imp's state dir (/state) may hold on disk; a box past it is killed (Docker backend).",
        expect='a size from "1m" to "1024g", e.g. "256m"',
    )
    state_max_files: int = _field(
        100_000, "Most files and directories in the state dir.", expect="a whole number from 100 to 10000000",
        ge=100, le=10_000_000,
    )  # fmt: skip
    spares: int = _field(
        1, "Spare boxes kept started for the imp while it has had a conversation within spares_idle_s; 0: none "
        "(issue 37: a conversation's first message claims one instead of waiting for a box to start).",
        expect="a whole number from 0 to 8", ge=0, le=8,
    )  # fmt: skip
    spares_idle_s: Seconds = _field(
        3600.0, "Seconds without a conversation of the imp after which its spare boxes close.",
        expect="a number of seconds from 1 to 86400", ge=1, le=86_400,
    )  # fmt: skip

    @field_validator("memory")
    @classmethod
    def _memory_size(cls, value: str) -> str:
        match = re.fullmatch(r"([1-9][0-9]{0,6})([kmg])", value.strip().lower())
        size = int(match.group(1)) * {"k": 1, "m": 1024, "g": 1024**2}[match.group(2)] if match else 0
        if not 64 * 1024 <= size <= 64 * 1024**2:
            raise ValueError(f'must be a size from "64m" to "64g", e.g. "512m" (got {json.dumps(value)})')
        return value.strip().lower()

    @field_validator("state_quota")
    @classmethod
    def _state_quota_size(cls, value: str) -> str:
        match = re.fullmatch(r"([1-9][0-9]{0,6})([mg])", value.strip().lower())
        size = int(match.group(1)) * {"m": 1, "g": 1024}[match.group(2)] if match else 0
        if not 1 <= size <= 1024 * 1024:
            raise ValueError(f'must be a size from "1m" to "1024g", e.g. "256m" (got {json.dumps(value)})')
        return value.strip().lower()

    def docker_limits(self) -> DockerLimits:
        from impyard.backends.docker import DockerLimits
        from impyard.backends.statedir import StateQuota, parse_size

        quota = StateQuota(max_bytes=parse_size(self.state_quota), max_entries=self.state_max_files)
        return DockerLimits(memory=self.memory, cpus=self.cpus, pids_limit=self.pids_limit, state_quota=quota)


class SessionsConfig(_Strict):
    """``[sessions]``: the warm box sessions of docs/conversation.md."""

    mode: Literal["warm", "cold"] = _field(
        "warm",
        "warm: one box per channel kept between turns; cold: a fresh box per message.",
        expect='one of "warm", "cold"',
    )
    idle_s: Seconds = _field(
        60.0,
        "Seconds a session waits between turns before its box closes.",
        expect="a number of seconds from 1 to 3600",
        ge=1,
        le=3600,
    )
    turn_ceiling_s: Seconds = _field(
        120.0,
        "Seconds one turn may take; then the box is told to stop, then killed. Unset: from [model] server "
        "(120 for openai, 900 for a local server; docs/models.md).",
        expect="a number of seconds from 5 to 3600",
        ge=5,
        le=3600,
    )
    session_ceiling_s: Seconds = _field(
        1800.0,
        "Seconds one session may live; it closes after its current turn.",
        expect="a number of seconds from 5 to 86400",
        ge=5,
        le=86_400,
    )
    queue_limit: int = _field(
        50,
        "Messages a channel may queue before it gets a 'too busy' notice.",
        expect="a whole number from 1 to 1000",
        ge=1,
        le=1000,
    )
    failure_notice: str = _field(
        "Sorry — I couldn't answer that just now.",
        "Posted when a respond turn fails (empty: post nothing).",
        expect="text in quotes, at most 2000 characters",
        max_length=2000,
    )

    @field_validator("session_ceiling_s")
    @classmethod
    def _session_outlasts_turn(cls, value: float, info: ValidationInfo) -> float:
        turn = info.data.get("turn_ceiling_s")
        if turn is not None and value < turn:
            raise ValueError(
                f"must be at least turn_ceiling_s ({turn:g}), since a session holds whole turns (got {value:g}); "
                "raise it or lower turn_ceiling_s"
            )
        return value


MAX_PERSON_NAME_CHARS = 64


def person_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be what an imp calls the person at the terminal, in words; None when it can."""
    if not name.strip():
        return "is empty: give a name, e.g. Ana"
    if len(name) > MAX_PERSON_NAME_CHARS:
        return f"is {len(name)} characters long: give one of at most {MAX_PERSON_NAME_CHARS}"
    if any(unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn") for char in name):
        return "has a control or invisible character: give a name of printable characters"
    return None


class TerminalConfig(_Strict):
    """``[terminal]``: the terminal chat (``impyard chat``)."""

    name: str | None = _field(
        None,
        "What the imp calls you in impyard chat (default: your account's full name or login; root is 'operator').",
        expect=f"a name in quotes, 1 to {MAX_PERSON_NAME_CHARS} printable characters",
        example="Ana",
    )

    @field_validator("name")
    @classmethod
    def _a_name(cls, value: str | None) -> str | None:
        problem = None if value is None else person_name_problem(value)
        if problem is not None:
            raise ValueError(f"the name {problem}")
        return value if value is None else value.strip()


class ImpConfig(_Strict):
    """One imp's config, as read from ``imps/<name>/imp.toml``. Every key but ``name`` has a default."""

    name: str = _field(..., "The imp's name: the same as its directory's.", expect=f"a name of {NAME_RULE}")
    persona_file: str = _field(
        DEFAULT_PERSONA_FILE,
        "The persona text, relative to this directory (or absolute).",
        expect="a file path in quotes",
    )
    owners: list[str] = _field(
        [],
        'Who may approve this imp\'s gated acts, e.g. ["discord:123456789012345678"].',
        expect='a list of owners like "discord:123456789012345678"',
        example=["discord:123456789012345678"],
    )
    model: ModelConfig = _section(ModelConfig, "How the responder calls the model.", "model")
    memory: MemoryConfig = _section(MemoryConfig, "The memory engine.", "memory")
    discord: DiscordConfig = _section(
        DiscordConfig, "The imp's Discord bot; never the token itself.", "discord"
    )
    box: BoxConfig = _section(BoxConfig, "The box the imp runs in.", "box")
    sessions: SessionsConfig = _section(SessionsConfig, "Warm box sessions, per channel.", "sessions")
    terminal: TerminalConfig = _section(TerminalConfig, "The terminal chat (impyard chat).", "terminal")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        try:
            return validate_name(value)
        except ImpNameError as exc:
            raise ValueError(str(exc).replace("invalid imp name", "not a valid name", 1)) from None

    @field_validator("owners")
    @classmethod
    def _owner_ids(cls, owners: list[str]) -> list[str]:
        for owner in owners:
            if not re.fullmatch(r"discord:[0-9]{1,20}", owner):
                raise ValueError(
                    f'{json.dumps(owner)[:MAX_GOT_CHARS]} is not an owner: write "discord:<user id>", '
                    'e.g. "discord:123456789012345678" (Discord: Developer Mode → right-click the user → Copy User ID)'
                )
        return list(dict.fromkeys(owners))  # duplicates are harmless: keep the first

    @field_validator("persona_file")
    @classmethod
    def _persona_path(cls, value: str) -> str:
        return _check_relative_path(value) or value

    @property
    def token_env(self) -> str:
        """The environment variable the Discord token is read from (when no token_file is set)."""
        return self.discord.token_env or default_token_env(self.name)

    @property
    def turn_ceiling_s(self) -> float:
        """Issue 38: ``[sessions] turn_ceiling_s`` where written, else the ``[model] server``'s own (a local
        server's is long: ``box.common.model_profiles.timing_for``), never past the session's ceiling."""
        if "turn_ceiling_s" in self.sessions.model_fields_set:
            return self.sessions.turn_ceiling_s
        return min(timing_for(self.model.server).turn_ceiling_s, self.sessions.session_ceiling_s)

    def token_source(self) -> str:
        """Where the Discord token comes from, in words (never the token)."""
        if self.discord.token_file:
            return f"file {self.discord.token_file}"
        return f"env {self.token_env}"

    def imp_spec(self, persona: str = "", news: str | None = None) -> ImpSpec:
        """What the box receives in ``box.init``: name, persona, responder and memory settings — no secrets.

        Responder settings are passed by name: every ``[model]`` key that ``ResponderSettings``
        knows goes to the box, so a setting the box learns later flows without a change here.
        """
        known = set(ResponderSettings.model_fields)
        responder = {key: value for key, value in self.model.model_dump().items() if key in known}
        # The box cannot read host files or know channels: the host hands it the news text (ENV-10)
        # and the staff channel its staff notes go to (ENV-03; the gateway still judges that send).
        responder["news"] = news
        responder["staff_channel"] = self.discord.staff_channel
        # Issue 19 #6: a hung upstream gets ENV-12's three attempts inside the turn ceiling, not one.
        responder["attempt_timeout_s"] = attempt_timeout_s(
            self.turn_ceiling_s,
            base_backoff_s=responder.get(
                "retry_backoff_s", ResponderSettings.model_fields["retry_backoff_s"].default
            ),
        )
        memory = {k: v for k, v in self.memory.model_dump().items() if k in MemorySettings.model_fields}
        if self.memory.embedder == "local":  # issue 33: the box asks the host's model, by its reserved name
            memory.update(embedding_model=LOCAL_EMBEDDING_MODEL, dimensions=LOCAL_EMBEDDING_DIMS)
        return ImpSpec(
            name=self.name,
            persona=persona,
            responder=ResponderSettings(**responder),
            memory=MemorySettings(**memory),
        )


def default_token_env(name: str) -> str:
    """``IMPYARD_DISCORD_TOKEN_<NAME>``: the name upper-cased, dashes as underscores."""
    return TOKEN_ENV_PREFIX + name.upper().replace("-", "_")
