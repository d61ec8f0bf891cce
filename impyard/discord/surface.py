"""The Discord surface: the executor of the gateway's ``discord.send`` act, and the typing indicator.

Each send posts as the named imp's own bot (``imp=``). A reply is chunked to Discord's 2000
characters (paragraph/sentence boundaries, fences kept: ``chunks.py``); the first chunk replies to
the message it answers, files ride on the last chunk (10 per message). Every chunk carries a nonce
with ``enforce_nonce``, so the retry of a chunk whose first attempt may have landed (a 429 past
discord.py's own wait, a 5xx, a timeout) can never post it twice (docs/architecture.md). Posts cannot
ping ``@everyone`` or roles, whatever the box wrote.

Channels that are not Discord channels — the imp's task log ``task:<imp>``, the terminal — are written
to the log instead.
"""

from __future__ import annotations

import io
import itertools
import logging
import secrets
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager

import aiohttp
import anyio
import discord

from impyard.discord.chunks import chunk_message
from impyard.gateway.surfaces import OutgoingFile, Post, SurfaceError

log = logging.getLogger("impyard.discord.surface")
post_log = logging.getLogger("impyard.posts")

MAX_FILES_PER_MESSAGE = 10
SEND_ATTEMPTS = 4  # per chunk; every attempt carries the same nonce
RETRY_BACKOFF_S = 1.0
# No timeout of our own around an attempt: cancelling discord.py mid-request leaves its rate-limit bucket
# closed for up to 30 s. aiohttp's own timeout ends a hung request (a TimeoutError, retried here), and the
# turn ceiling bounds the whole turn.
# Whatever the box wrote, a post pings no @everyone/@here and no role; users it names, and the replied-to author, yes.
POST_MENTIONS = discord.AllowedMentions(everyone=False, roles=False, users=True, replied_user=True)
NOT_POSTED_CODES = frozenset(
    {10003, 50001, 50013, 50035}
)  # unknown channel, no access, no permission, bad form


def is_discord_channel(channel_id: str) -> bool:
    """Discord ids are snowflakes (digits); ``task:<imp>`` and ``terminal:<user>`` live on the host."""
    return channel_id.isdigit() and 0 < len(channel_id) <= 20


class DiscordSurface:
    """Posts for every imp through its own client (``clients`` maps imp → discord.Client)."""

    def __init__(
        self,
        clients: Mapping[str, discord.Client],
        *,
        attempts: int = SEND_ATTEMPTS,
        backoff_s: float = RETRY_BACKOFF_S,
    ) -> None:
        self.clients = dict(clients)
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._typing: dict[tuple[str, str], AbstractAsyncContextManager[None]] = {}
        self._log_ids = itertools.count(1)

    def client_for(self, imp: str) -> discord.Client:
        if imp in self.clients:
            return self.clients[imp]
        if not imp and len(self.clients) == 1:
            return next(iter(self.clients.values()))
        raise SurfaceError(f"imp {imp or '(unnamed)'} has no Discord bot connected on this host")

    def _messageable(self, imp: str, channel_id: str) -> discord.abc.Messageable:
        """The channel as the imp's client knows it, else a partial one by id (sends resolve it server-side)."""
        client = self.client_for(imp)
        channel = client.get_channel(int(channel_id)) or client.get_partial_messageable(int(channel_id))
        if not isinstance(channel, discord.abc.Messageable):  # a category or a forum takes no messages
            raise SurfaceError(f"channel {channel_id} is a {type(channel).__name__}: no message can go there")
        return channel

    # ------------------------------------------------------------ posting

    async def send(self, post: Post) -> list[str]:
        channel_id, content, reply_to, files, kind, imp = (
            post.channel_id, post.content, post.reply_to, post.files, post.kind, post.imp
        )  # fmt: skip
        if not is_discord_channel(channel_id):
            return self._to_log(channel_id, content, files, kind, imp)
        channel = self._messageable(imp, channel_id)
        chunks = chunk_message(content) or [""]
        batches = [
            list(files[i : i + MAX_FILES_PER_MESSAGE]) for i in range(0, len(files), MAX_FILES_PER_MESSAGE)
        ]
        if not content.strip() and not files:
            raise SurfaceError("nothing to post: the message is empty")
        # Files ride on the last chunk; more than ten spill into messages of their own after it.
        plan: list[tuple[str, list[OutgoingFile]]] = [(text, []) for text in chunks]
        if batches:
            plan[-1] = (plan[-1][0], batches[0])
            plan += [("", batch) for batch in batches[1:]]
        reference = None
        if reply_to and reply_to.isdigit():
            reference = discord.MessageReference(
                message_id=int(reply_to), channel_id=int(channel_id), fail_if_not_exists=False
            )
        turn = secrets.token_hex(6)
        ids: list[str] = []
        for index, (text, batch) in enumerate(plan):
            nonce = f"{turn}{index:03d}"  # ≤ 25 characters, the same on every attempt of this chunk
            message = await self._post_chunk(channel, text, batch, reference if index == 0 else None, nonce)
            ids.append(str(message.id))
        log.info(
            "posted imp=%s channel=%s kind=%s chunks=%d files=%d",
            imp,
            channel_id,
            kind,
            len(plan),
            len(files),
        )
        return ids

    async def _post_chunk(
        self,
        channel: discord.abc.Messageable,
        text: str,
        files: list[OutgoingFile],
        reference: discord.MessageReference | None,
        nonce: str,
    ) -> discord.Message:
        for attempt in range(1, self.attempts + 1):
            wait = self.backoff_s * 2 ** (attempt - 1)
            try:
                return await channel.send(
                    text or None,
                    # discord.py's overloads omit the None its implementation takes for files and reference.
                    files=[discord.File(io.BytesIO(item.data), item.filename) for item in files] or None,  # type: ignore[arg-type]
                    reference=reference,  # type: ignore[arg-type]
                    allowed_mentions=POST_MENTIONS,
                    nonce=nonce,  # discord.py sends enforce_nonce with it: a repeat returns the first message
                )
            except discord.RateLimited as exc:  # a 429 longer than discord.py waits for itself
                problem, wait = f"rate limited for {exc.retry_after:.1f} s", exc.retry_after
            except discord.HTTPException as exc:
                if (exc.status < 500 and exc.status != 429) or exc.code in NOT_POSTED_CODES:
                    raise SurfaceError(
                        f"Discord refused the message ({exc.status} {exc.code}): {exc.text[:200]}"
                    ) from None
                problem = f"Discord answered {exc.status}"
            except TimeoutError:
                problem = "no answer in time"
            except (aiohttp.ClientError, OSError) as exc:
                problem = f"connection failed: {exc}"
            if attempt == self.attempts:
                raise SurfaceError(f"could not post to Discord after {attempt} attempts: {problem}")
            log.warning(
                "posting a chunk failed (%s); attempt %d of %d in %.1f s",
                problem,
                attempt + 1,
                self.attempts,
                wait,
            )
            await anyio.sleep(wait)
        raise AssertionError("unreachable")

    def _to_log(
        self, channel_id: str, content: str, files: Sequence[OutgoingFile], kind: str, imp: str
    ) -> list[str]:
        names = ", ".join(item.filename for item in files)
        post_log.info(
            "[%s] %s (%s): %s%s",
            channel_id,
            imp or "impyard",
            kind,
            content,
            f" [files: {names}]" if names else "",
        )
        return [f"log-{next(self._log_ids)}"]

    # ------------------------------------------------------------ typing

    async def typing(self, channel_id: str, active: bool, *, imp: str = "") -> None:
        """Start (``active``) or stop the indicator; discord.py renews it every few seconds until stopped."""
        key = (imp, channel_id)
        if not active:
            running = self._typing.pop(key, None)
            if running is not None:
                await running.__aexit__(None, None, None)
            return
        if key in self._typing or not is_discord_channel(channel_id):
            return
        indicator = self._messageable(imp, channel_id).typing()
        await indicator.__aenter__()
        self._typing[key] = indicator

    async def aclose(self) -> None:
        """Stop every indicator still showing (shutdown)."""
        for key in list(self._typing):
            await self.typing(key[1], False, imp=key[0])
