"""The governance policy's shape (docs/security.md): pydantic models for ``policies/*.toml``.

Every table refuses unknown keys, so a typo is an error, never a silently
ignored (and therefore permissive) setting. ``policy.py`` loads and overlays
files; ``judge.py`` applies the rules.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from box.protocol.models import ModelPath

RuleMethod = Literal["model.request", "discord.send", "http.fetch", "*"]
ActName = Literal["discord.send"]
TrustMode = Literal["auto", "gate", "earned"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
PURPOSE_PATTERN = r"^(\*|[a-z][a-z0-9_]{0,39})$"
HOST_PATTERN = r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?)*$"
RuleName = Annotated[str, Field(pattern=NAME_PATTERN)]
ModelName = Annotated[str, Field(min_length=1, max_length=128)]
HostPattern = Annotated[str, Field(pattern=HOST_PATTERN, max_length=253)]

# Every number in a policy is finite and within a sane range (issue 11 #10): `inf`, `nan` or 1e300 would
# load, then overflow or disable a limit at run time. Upper bounds are far above any real setting.
MAX_USD = 1_000_000.0  # a budget, USD per day or month
MAX_USD_PER_UNIT = 100_000.0  # a price, USD per million tokens or per image
MAX_BYTES = 1 << 30  # 1 GiB
MAX_TOKENS = 10_000_000
MAX_COUNT = 1_000_000  # images, files, characters, requests per minute, approvals
Usd = Annotated[float, Field(ge=0, le=MAX_USD, allow_inf_nan=False)]
UsdPerUnit = Annotated[float, Field(ge=0, le=MAX_USD_PER_UNIT, allow_inf_nan=False)]
Multiplier = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
Bytes = Annotated[int, Field(gt=0, le=MAX_BYTES)]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
Count = Annotated[int, Field(gt=0, le=MAX_COUNT)]
CountOrZero = Annotated[int, Field(ge=0, le=MAX_COUNT)]

# Which rule keys belong to which method; a key on the wrong method is an error, not ignored.
MODEL_KEYS = frozenset(
    {
        "paths",
        "purposes",
        "max_body_bytes",
        "max_tokens",
        "max_images",
        "image_hosts",
        "stored_context_tokens",
    }
)
SEND_KEYS = frozenset({"channels", "max_content_chars", "max_files", "max_file_bytes", "trust"})
FETCH_KEYS = frozenset({"hosts", "max_fetch_bytes", "allow_loopback"})
METHOD_KEYS = {"model.request": MODEL_KEYS, "discord.send": SEND_KEYS, "http.fetch": FETCH_KEYS}
# What an allow rule must spell out, so that "allow" never means "allow anything".
REQUIRED_FOR_ALLOW = {"model.request": "purposes", "discord.send": "channels", "http.fetch": "hosts"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rule(Strict):
    """One rule. Selectors (scope, method, paths, purposes, channels, hosts) decide whether it
    matches; the first match decides. An allow rule's limits then deny with this rule's name.

    ``purposes`` selects by purpose *and* model (issue 16): a rule matches a model.request only when it
    lists the request's purpose (or ``"*"``) with the request's model (or ``"*"``); a model it does not
    list is tried against the next rule, never denied by this one."""

    name: RuleName
    scope: Annotated[str, Field(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$")] = "*"
    method: RuleMethod
    action: Literal["allow", "deny"]
    reason: Annotated[str, Field(max_length=500)] = ""  # told to the box when this rule denies

    # model.request: selectors
    paths: list[ModelPath] | None = None
    purposes: dict[Annotated[str, Field(pattern=PURPOSE_PATTERN)], list[ModelName]] | None = (
        None  # purpose -> the models it selects ("*" = any purpose / any model)
    )
    # model.request: limits
    max_body_bytes: Bytes | None = None
    max_tokens: Tokens | None = (
        None  # caps max_tokens / max_completion_tokens / max_output_tokens (and is sent when unset)
    )
    max_images: Count | None = None
    # model.request: what the provider may do beyond the body (issue 11 #4); by default nothing
    image_hosts: list[HostPattern] | None = (
        None  # https image URLs on these hosts (else inline data: images only)
    )
    stored_context_tokens: Tokens | None = (
        None  # admits previous_response_id / conversation, reserving this many input tokens
    )

    # discord.send: selector ("own" = the session's channel, "staff" = [channels].staff, or ids)
    channels: list[Annotated[str, Field(min_length=1, max_length=128)]] | None = None
    # discord.send: limits and trust
    max_content_chars: Count | None = None
    max_files: CountOrZero | None = None
    max_file_bytes: Bytes | None = None
    trust: TrustMode | None = None  # overrides the [trust] ladder for sends this rule allows

    # discord.send and http.fetch: per target (channel or host) per minute
    rate_per_minute: Count | None = None

    # http.fetch: selector (exact host or "*.example.com") and limits
    hosts: list[HostPattern] | None = None
    max_fetch_bytes: Bytes | None = None
    allow_loopback: bool = False  # tests only: lets a loopback destination through

    @model_validator(mode="after")
    def _keys_fit_the_method(self) -> Rule:
        present = {
            key
            for key in self.model_fields_set
            if getattr(self, key) is not None and getattr(self, key) is not False
        }
        for method, keys in METHOD_KEYS.items():
            stray = sorted(present & keys)
            if stray and self.method != method:
                raise ValueError(
                    f"{', '.join(stray)} only apply to {method} rules (this rule is for {self.method})"
                )
        if self.action == "allow":
            if self.method == "*":
                raise ValueError('an allow rule must name one method; method = "*" is for deny rules only')
            required = REQUIRED_FOR_ALLOW[self.method]
            if getattr(self, required) is None:
                raise ValueError(
                    f"an allow rule for {self.method} must list {required} (allow never means anything)"
                )
        if self.purposes is not None and any(not models for models in self.purposes.values()):
            raise ValueError('each purpose needs at least one model (use ["*"] for any model)')
        return self


class BudgetLimit(Strict):
    """USD per UTC day and per UTC month; a missing value means no limit in that window."""

    daily_usd: Usd | None = None
    monthly_usd: Usd | None = None


class Budgets(Strict):
    all: BudgetLimit = BudgetLimit()  # all imps together
    per_imp: BudgetLimit = BudgetLimit()  # each imp, unless listed under imps
    imps: dict[Annotated[str, Field(pattern=NAME_PATTERN)], BudgetLimit] = Field(default_factory=dict)


class Price(Strict):
    """USD per million tokens (input, cached input, output) and USD per generated image."""

    input: UsdPerUnit | None = None
    cached_input: UsdPerUnit | None = None  # defaults to input when missing
    output: UsdPerUnit | None = None
    image: UsdPerUnit | None = None  # the most one generated image may cost
    # The most input tokens one input image may cost (priced at `input`); image inputs to a model without it
    # are refused, since their cost could not be reserved (issue 11 #3).
    image_input_tokens: Tokens | None = None
    # A multiplier on this model's prices for each non-default service_tier it may be asked for
    # ("priority" = 2.0); any tier not listed is refused (issue 11 #3).
    service_tiers: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")], Multiplier] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _has_a_price(self) -> Price:
        if self.input is None and self.output is None and self.image is None:
            raise ValueError("a price needs at least one of input, output, image")
        return self


class TrustSettings(Strict):
    """The trust ladder for one act (docs/security.md)."""

    own_channel: TrustMode = "auto"  # the session's own channel when it is trusted (DMs always are)
    untrusted: Literal["gate", "earned"] = "gate"  # the session's own channel when it is not trusted
    other_channel: Literal["gate", "earned"] = (
        "gate"  # never auto on the target's trust; only a rule may say auto
    )
    earned_after: Count = 5  # clean approvals before "earned" becomes auto


class ChannelSettings(Strict):
    staff: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default_factory=list)


class GateSettings(Strict):
    deadline_hours: Annotated[float, Field(gt=0, le=24 * 30, allow_inf_nan=False)] = 24.0


class UpstreamSettings(Strict):
    timeout_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = 120.0
    max_request_bytes: Bytes = 1_048_576
    max_response_bytes: Bytes = 16_777_216
    # The output cap sent (and reserved) when a body sets none, within the matched rule's max_tokens (issue 11 #3).
    default_output_tokens: Tokens = 4_096


class HttpSettings(Strict):
    timeout_s: Annotated[float, Field(gt=0, le=300, allow_inf_nan=False)] = 15.0
    max_bytes: Bytes = 2_000_000


class PolicyFile(Strict):
    """One ``*.toml`` file. Every section is optional; ``policy.py`` overlays files."""

    rules: list[Rule] = Field(default_factory=list)
    budgets: Budgets = Budgets()
    prices: dict[ModelName, Price] = Field(default_factory=dict)
    trust: dict[ActName, TrustSettings] = Field(default_factory=dict)
    channels: ChannelSettings = ChannelSettings()
    gates: GateSettings = GateSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    http: HttpSettings = HttpSettings()

    @model_validator(mode="after")
    def _unique_rule_names(self) -> PolicyFile:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError(f"two rules are named {rule.name!r}; rule names must be unique")
            seen.add(rule.name)
        return self
