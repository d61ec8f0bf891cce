"""Who may see the console, and which requests may change anything (docs/console.md, "Logging in").

* **The login token.** ``impyard console`` prints one address with a token (``/?token=…``, the Jupyter way): a
  fresh random one each start, or ``IMPYARD_CONSOLE_TOKEN`` where an operator wants a stable one. A request that
  carries it (``?token=`` once, or ``Authorization: Bearer`` for scripts) is answered and, for a browser, given a
  session cookie (HttpOnly, SameSite=Strict) derived from the token, then sent to the same address without it, so
  the token leaves the address bar and the history. Without the token or the cookie nothing is shown: every page,
  fragment and file answers 401 with the line that says where the address is.
* **Changes.** Every state-changing request is a POST that must carry the CSRF token (a form field ``csrf`` or the
  header ``X-CSRF-Token``) derived from the login token, and, where the browser sends an ``Origin``, come from the
  console's own origin. A GET never changes anything.
* **Where it is reached from.** On loopback the ``Host`` header must name loopback (a page elsewhere that points a
  name at 127.0.0.1 — DNS rebinding — is refused).

Tokens are compared in constant time; the cookie and the CSRF token are HMACs of the login token, so they stop
working when the console restarts with a new token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass

from impyard.errors import ImpyardError

TOKEN_ENV = "IMPYARD_CONSOLE_TOKEN"
COOKIE = "impyard_console"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 256
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class TokenError(ImpyardError, ValueError):
    """A console token an operator set that would not keep the console closed."""


def new_token() -> str:
    """A fresh login token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


def token_from_env() -> str | None:
    """``IMPYARD_CONSOLE_TOKEN`` when set; a token too short to guard anything is refused."""
    value = os.environ.get(TOKEN_ENV, "").strip()
    if not value:
        return None
    if not MIN_TOKEN_CHARS <= len(value) <= MAX_TOKEN_CHARS or not value.isprintable() or " " in value:
        raise TokenError(
            f"{TOKEN_ENV} must be {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} printable characters without spaces "
            f"(it has {len(value)}): unset it for a random token, or use e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`"
        )
    return value


def _derive(token: str, purpose: str) -> str:
    return hmac.new(token.encode(), purpose.encode(), hashlib.sha256).hexdigest()


def _same(given: str | None, expected: str) -> bool:
    return (
        given is not None
        and len(given) <= MAX_TOKEN_CHARS
        and hmac.compare_digest(given.encode(), expected.encode())
    )


@dataclass(frozen=True)
class Keys:
    """The login token and what is derived from it."""

    token: str

    @property
    def session(self) -> str:
        return _derive(self.token, "impyard-console-session")

    @property
    def csrf(self) -> str:
        return _derive(self.token, "impyard-console-csrf")

    def is_token(self, given: str | None) -> bool:
        return _same(given, self.token)

    def is_session(self, given: str | None) -> bool:
        return _same(given, self.session)

    def is_csrf(self, given: str | None) -> bool:
        return _same(given, self.csrf)


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer …`` header, or None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def is_loopback(host: str) -> bool:
    """True for an address or name that only this machine reaches."""
    if host.strip("[]") in LOOPBACK_NAMES or host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8787`` → ``[::1]``)."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header
