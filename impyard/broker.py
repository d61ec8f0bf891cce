"""The model broker: the one place the real model key is used (docs/architecture.md, docs/protocol.md, docs/security.md).

It sends an already-judged, already-reserved request to the upstream
(``OPENAI_BASE_URL``, default OpenAI) with ``OPENAI_API_KEY``, bounded in
request size, response size and time, and returns the upstream's status, JSON
body and a few selected headers. HTTP errors (400, 429, 5xx) are results, not
exceptions: the box's responder applies its own retry rules. Only a failure
to get an answer at all raises ``UpstreamUnreachable``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import anyio

try:  # the HTTP client the openai SDK ships with (httpx, published as httpx2 in newer releases)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed openai
    import httpx  # type: ignore[no-redef]

from impyard.audit import redact, redact_url, url_secrets
from impyard.errors import ImpyardError
from impyard.policy_models import UpstreamSettings

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
PURPOSE_HEADER = "X-Impyard-Purpose"  # lets an upstream (and the test fake) see why the box asked
SELECTED_HEADERS = ("retry-after", "retry-after-ms", "x-request-id")
CONNECT_TIMEOUT_S = 10.0
NO_KEY_MESSAGE = (
    "the host has no model key: set OPENAI_API_KEY in the environment of the impyard host process "
    "(and OPENAI_BASE_URL for an OpenAI-compatible server), then restart it"
)


class UpstreamUnreachable(ImpyardError):
    """No answer from the upstream. ``sent`` is True when the request may have reached it (cost possible)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass(frozen=True)
class UpstreamConfig:
    """Where the model API is and the key for it. The key never leaves the host process, and neither do
    the credentials a base URL may carry (``http://user:password@proxy/v1?key=…``, issue 11 #9): messages
    show ``display_url``, requests go to ``endpoint`` with the userinfo as an auth header. Each form is worked
    out once per config (``cached_property``): a model call reads them all (issue 18)."""

    base_url: str = field(default=OPENAI_DEFAULT_BASE_URL, repr=False)
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> UpstreamConfig:
        env = os.environ if environ is None else environ
        return cls(
            base_url=(env.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE_URL).rstrip("/"),
            api_key=env.get("OPENAI_API_KEY") or None,
        )

    def __repr__(self) -> str:
        return f"UpstreamConfig(base_url={self.display_url!r}, api_key={'set' if self.api_key else None})"

    @cached_property
    def display_url(self) -> str:
        """The base URL as it may be shown: userinfo and query values replaced by [redacted]."""
        return redact_url(self.base_url)

    @cached_property
    def secrets(self) -> list[str]:
        """Everything of this config that must never be shown: the key, the URL's userinfo and query."""
        return [*([self.api_key] if self.api_key else []), *url_secrets(self.base_url)]

    @cached_property
    def endpoint(self) -> str:
        """The base URL without userinfo, query or fragment: what request paths are appended to."""
        parts = urlsplit(self.base_url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))

    @cached_property
    def query(self) -> str:
        return urlsplit(self.base_url).query

    @cached_property
    def credentials(self) -> tuple[str, str] | None:
        """The base URL's userinfo, sent as HTTP Basic auth (as the HTTP client did with it in the URL)."""
        parts = urlsplit(self.base_url)
        if parts.username is None and parts.password is None:
            return None
        return unquote(parts.username or ""), unquote(parts.password or "")


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    body: Any
    headers: dict[str, str]


def encode_body(body: Mapping[str, Any]) -> bytes:
    """The exact bytes sent upstream (and measured against the body-size limits)."""
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate from the box: escape it rather than send broken UTF-8
        return json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode()


class ResponseTooLarge(Exception):
    pass


class ModelBroker:
    def __init__(
        self,
        config: UpstreamConfig,
        settings: UpstreamSettings | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self.settings = settings or UpstreamSettings()
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    @property
    def configured(self) -> bool:
        return bool(self.config.api_key)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.settings.timeout_s, connect=CONNECT_TIMEOUT_S),
                follow_redirects=False,
                transport=self._transport,
                trust_env=False,  # no proxy or netrc surprises: the host talks to the configured base URL only
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def call(self, path: str, body: bytes, purpose: str) -> UpstreamResponse:
        if not self.config.api_key:
            raise UpstreamUnreachable(NO_KEY_MESSAGE, sent=False)
        if len(body) > self.settings.max_request_bytes:
            raise ValueError(f"request body of {len(body)} bytes is over {self.settings.max_request_bytes}")
        headers = {
            "Authorization": f"Bearer {self.config.api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            PURPOSE_HEADER: purpose,
        }
        # No credentials in the URL itself: the HTTP client logs request URLs (issue 11 #9).
        url = self.config.endpoint + path + (f"?{self.config.query}" if self.config.query else "")
        credentials = self.config.credentials
        auth = httpx.BasicAuth(*credentials) if credentials else None
        try:
            with anyio.fail_after(self.settings.timeout_s):  # a whole-call bound; httpx's are per read
                async with self._http().stream(
                    "POST", url, content=body, headers=headers, auth=auth
                ) as response:
                    raw = await self._read_bounded(response)
                    status = response.status_code
                    selected = {
                        name: response.headers[name] for name in SELECTED_HEADERS if name in response.headers
                    }
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise UpstreamUnreachable(
                f"cannot connect to the model API at {self.config.display_url}: {type(exc).__name__}",
                sent=False,
            ) from exc
        except TimeoutError as exc:
            raise UpstreamUnreachable(
                f"the model API did not answer within {self.settings.timeout_s:g} s", sent=True
            ) from exc
        except ResponseTooLarge as exc:
            raise UpstreamUnreachable(str(exc), sent=True) from exc
        except httpx.HTTPError as exc:
            raise UpstreamUnreachable(
                f"the model API connection failed: {type(exc).__name__}", sent=True
            ) from exc
        return UpstreamResponse(status, self._decode(raw), selected)

    async def _read_bounded(self, response: httpx.Response) -> bytes:
        limit = self.settings.max_response_bytes
        chunks: list[bytes] = []
        total = 0
        async for chunk in response.aiter_bytes():
            total += len(chunk)
            if total > limit:
                raise ResponseTooLarge(f"the model API's answer is over the {limit}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    def _decode(self, raw: bytes) -> Any:
        text = raw.decode("utf-8", errors="replace")
        if (
            self.config.api_key and self.config.api_key in text
        ):  # never hand the key to the box, even if echoed
            text = text.replace(self.config.api_key, "[redacted]")
        text = redact(text, self.config.secrets)  # nor the base URL's credentials (issue 11 #9)
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            return {
                "error": {
                    "message": "the model API answered with something that is not JSON",
                    "text": text[:1000],
                }
            }
