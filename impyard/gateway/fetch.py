"""http.fetch on the host (docs/protocol.md): pinned to a public address, bounded, text extracted host-side.

The judge has already matched the host against the allow-list. Here the name
is resolved once, every address it resolves to must be public (no loopback,
private, link-local, multicast or reserved), and the request connects to that
very address (Host header and TLS SNI keep the name), so a DNS answer cannot
change between the check and the connection. Redirects are not followed: the
box gets the status and the location, and a fetch of that URL is judged anew.

HTML is turned into text in a worker process, never on the event loop (issue 11 #7):
``html.parser`` takes time quadratic in some hostile markup (seconds to hours per
page). At most ``MAX_HTML_CHARS`` of a page are parsed (the rest is cut, and the
answer says ``truncated``), and a parse still running after ``EXTRACT_TIMEOUT_S``
is killed with its process and refused with that reason (``TextRefused``).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import SplitResult, urlsplit, urlunsplit

import anyio
import anyio.to_process

from impyard.errors import ImpyardError
from impyard.gateway.broker import httpx
from impyard.gateway.policy_models import HttpSettings

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
USER_AGENT = "impyard-fetch/0.1"
MAX_ADDRESSES = 16
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml+xml")
HTML_TYPES = ("text/html", "application/xhtml+xml")
EXTRACT_TIMEOUT_S = (
    10.0  # the most one page's HTML-to-text may take (worker start included), then it is killed
)
MAX_HTML_CHARS = 1_000_000  # characters of HTML handed to the parser; a longer page is cut (truncated)
TEXT_RULE = "http-text"  # the rule name a refusal of a page's text carries


class FetchRefused(ImpyardError):
    """The destination is not allowed (resolves to a non-public address, or not at all)."""

    rule: str | None = None  # None: the egress rule


class TextRefused(FetchRefused):
    """The page was fetched but its text is not returned: the HTML could not be turned into text within bounds."""

    rule = TEXT_RULE


class FetchFailed(ImpyardError):
    """No answer from the destination."""


@dataclass(frozen=True)
class FetchResponse:
    status: int
    content_type: str
    text: str
    truncated: bool


def address_refusal(address: IpAddress, *, allow_loopback: bool = False) -> str | None:
    """Why a destination address is refused, or None when it is public. Pure."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address_refusal(address.ipv4_mapped, allow_loopback=allow_loopback)
    if address.is_loopback:
        return None if allow_loopback else f"{address} is a loopback address"
    if address.is_link_local:
        return f"{address} is a link-local address"
    if address.is_private:
        return f"{address} is a private address"
    if address.is_multicast or address.is_reserved or address.is_unspecified or not address.is_global:
        return f"{address} is not a public address"
    return None


async def resolve(host: str, port: int) -> list[IpAddress]:
    try:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise FetchRefused(f"cannot resolve {host!r}: {exc.strerror or exc}") from exc
    addresses: list[IpAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos[:MAX_ADDRESSES]:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise FetchRefused(f"{host!r} resolves to no address")
    return addresses


class _TextExtractor(HTMLParser):
    """Visible text of an HTML page: tags dropped, script/style skipped, entities decoded."""

    SKIP = frozenset({"script", "style", "noscript", "template", "svg", "head"})
    BLOCK = frozenset(
        {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "title"}
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self._skipping += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP and self._skipping:
            self._skipping -= 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def decode_body(content_type: str, raw: bytes) -> tuple[str, bool]:
    """A response body as text, and whether that text is HTML; binary content gives no text."""
    media = content_type.split(";")[0].strip().lower()
    charset = "utf-8"
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip('"')
    if media and not media.startswith(TEXT_TYPES):
        return "", False
    try:
        text = raw.decode(charset, errors="replace")
    except LookupError:
        text = raw.decode("utf-8", errors="replace")
    return text, media in HTML_TYPES or (not media and "<html" in text[:1000].lower())


def extract_text(content_type: str, raw: bytes) -> str:
    """Text for the box from a response body, in this thread (unbounded: see ``extract_text_bounded``)."""
    text, is_html = decode_body(content_type, raw)
    return html_to_text(text) if is_html else text


async def extract_text_bounded(
    content_type: str,
    raw: bytes,
    *,
    timeout_s: float = EXTRACT_TIMEOUT_S,
    max_html_chars: int = MAX_HTML_CHARS,
) -> tuple[str, bool]:
    """``extract_text`` off the event loop, in a worker process killed at the deadline; (text, cut short).

    Raises TextRefused when the parse runs out of time or fails: hostile markup never hangs the host.
    """
    text, is_html = decode_body(content_type, raw)
    if not is_html:
        return text, False
    cut = len(text) > max_html_chars
    try:
        with anyio.fail_after(timeout_s):
            extracted = await anyio.to_process.run_sync(html_to_text, text[:max_html_chars], cancellable=True)
    except TimeoutError:
        raise TextRefused(
            f"the page's HTML could not be turned into text within {timeout_s:g} s (markup that is slow to parse); "
            "its text is not returned"
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever the parser (or its process) died of, the answer is one refusal
        raise TextRefused(
            f"the page's HTML could not be turned into text ({type(exc).__name__}); its text is not returned"
        ) from None
    return extracted, cut


class HttpFetcher:
    def __init__(
        self,
        settings: HttpSettings | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        extract_timeout_s: float = EXTRACT_TIMEOUT_S,
        max_html_chars: int = MAX_HTML_CHARS,
    ):
        self.settings = settings or HttpSettings()
        self._transport = transport
        self.extract_timeout_s = extract_timeout_s
        self.max_html_chars = max_html_chars

    async def fetch(self, url: str, *, max_bytes: int, allow_loopback: bool = False) -> FetchResponse:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = await resolve(host, port)
        for address in addresses:  # every answer must be acceptable, not just the first
            refusal = address_refusal(address, allow_loopback=allow_loopback)
            if refusal:
                raise FetchRefused(f"{host} is refused: it resolves to {refusal}")
        pinned = _pin(parts, addresses[0], port)
        headers = {
            "Host": parts.netloc.rpartition("@")[2],
            "User-Agent": USER_AGENT,
            "Accept-Encoding": "identity",
        }
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        try:
            with anyio.fail_after(self.settings.timeout_s):
                async with httpx.AsyncClient(
                    transport=self._transport, follow_redirects=False, trust_env=False,
                    timeout=httpx.Timeout(self.settings.timeout_s),
                ) as client:  # fmt: skip
                    request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
                    response = await client.send(request, stream=True)
                    try:
                        raw, truncated = await _read_up_to(response, max_bytes)
                    finally:
                        await response.aclose()
        except TimeoutError as exc:
            raise FetchFailed(f"{host} did not answer within {self.settings.timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise FetchFailed(f"fetching from {host} failed: {type(exc).__name__}") from exc
        content_type = response.headers.get("content-type", "")
        if 300 <= response.status_code < 400 and "location" in response.headers:
            text = (
                f"redirect to {response.headers['location'][:2000]} (not followed; fetch that URL if needed)"
            )
        else:
            text, cut = await extract_text_bounded(
                content_type, raw, timeout_s=self.extract_timeout_s, max_html_chars=self.max_html_chars
            )
            truncated = truncated or cut
        return FetchResponse(response.status_code, content_type[:200], text, truncated)


def _pin(parts: SplitResult, address: IpAddress, port: int) -> str:
    literal = f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else str(address)
    return urlunsplit((parts.scheme, f"{literal}:{port}", parts.path or "/", parts.query, ""))


async def _read_up_to(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_raw():
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            return b"".join(chunks)[:max_bytes], True
    return b"".join(chunks), False
