"""``http.fetch``: the gateway's act that fetches a public page for a box (docs/security.md).

judge → rate limit (per imp and host) → the fetch, where the destination's addresses are checked as it is
fetched (rule ``egress``: allow-listed public hosts only, ``impyard.gateway.fetch``) and the page's text is
extracted within bounds. The act fills in the request's audit row; the core writes it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from box.protocol import ErrorCode, RpcError
from box.protocol.models import HttpFetchParams, HttpFetchResult
from impyard.backends.base import BoxSpec
from impyard.gateway.act import Act, Decision, Request, denied, enforce, refusal
from impyard.gateway.fetch import FetchFailed, FetchRefused, HttpFetcher
from impyard.gateway.judge import RequestFacts, http_fetch_facts, judge
from impyard.gateway.policy import Policy
from impyard.gateway.policy_models import Rule

EGRESS_RULE = "egress"


class FetchAct(Act):
    """Serves ``http.fetch`` through ``fetcher``."""

    methods: ClassVar[frozenset[str]] = frozenset({"http.fetch"})

    def __init__(self, fetcher: HttpFetcher) -> None:
        self.fetcher = fetcher

    def policy_changed(self, policy: Policy) -> None:
        self.fetcher.settings = policy.http

    async def dry_run(self, spec: BoxSpec, method: str, params: BaseModel) -> Decision | None:
        if not isinstance(params, HttpFetchParams):
            return None
        decision, _, _ = self._decide_fetch(spec, params, commit=False)
        return decision

    def _decide_fetch(
        self, spec: BoxSpec, params: HttpFetchParams, *, commit: bool
    ) -> tuple[Decision, RequestFacts, Rule | None]:
        """judge → rate limit; the destination's addresses are checked when it is fetched (rule egress).
        ``commit`` takes the rate-meter event (the live fetch)."""
        facts = http_fetch_facts(spec.imp, spec.channel_id, params)
        verdict = judge(facts, self.gateway.policy)
        if not verdict.allowed:
            return denied(verdict.rule, verdict.reason), facts, None
        assert verdict.matched is not None
        rule = verdict.matched
        limited = self.gateway.rate(rule, (spec.imp, facts.host or ""), commit=commit)
        if limited is not None:
            return limited, facts, rule
        return Decision("allowed", rule.name, "allowed"), facts, rule

    async def handle(self, request: Request) -> HttpFetchResult:
        spec, params, record = request.spec, request.params, request.record
        assert isinstance(params, HttpFetchParams)
        decision, facts, rule = self._decide_fetch(spec, params, commit=True)
        record.detail = f"GET {facts.host}"
        enforce(decision, record)
        assert rule is not None
        caps = [
            params.max_bytes,
            self.gateway.policy.http.max_bytes,
            *([rule.max_fetch_bytes] if rule.max_fetch_bytes else []),
        ]
        try:
            response = await self.fetcher.fetch(
                params.url, max_bytes=min(caps), allow_loopback=rule.allow_loopback
            )
        except (
            FetchRefused
        ) as exc:  # the destination (egress), or the page's text (bounded extraction, issue 11 #7)
            raise refusal(denied(exc.rule or EGRESS_RULE, str(exc)), record) from None
        except FetchFailed as exc:
            record.verdict = "unreachable"
            raise RpcError(ErrorCode.UPSTREAM_UNREACHABLE, str(exc), {"reason": str(exc)}) from None
        record.verdict = "allowed"
        record.detail += f" status={response.status} truncated={response.truncated}"
        return HttpFetchResult(
            status=response.status,
            content_type=response.content_type,
            text=response.text,
            truncated=response.truncated,
        )
