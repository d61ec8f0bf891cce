"""The host's surface wrapper: an imp's own posts join the channel history (the box sees its side of the talk).

The host (``impyard.host``) wraps whatever surface it posts through in one of these, so every post the
gateway executes — a reply, a post approved at a gate, a task's post — is recorded the same way.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Callable
from dataclasses import replace

from box.protocol.models import Attachment, Author, Message, ReplyRef
from impyard.clock import Clock
from impyard.conversation.history import History
from impyard.conversation.typing_indicator import set_typing
from impyard.gateway.surfaces import OutgoingFile, Post, Surface


class HistorySurface:
    """Wraps a surface so an imp's own posts join the channel history.

    Every send names its imp (``imp=``), so one wrapper serves a host with several imps;
    ``default_imp`` covers a caller that does not say (a host with one imp).
    """

    def __init__(
        self,
        inner: Surface,
        history: History,
        imp_user_id: Callable[[str], str],
        clock: Clock,
        *,
        default_imp: str = "",
    ) -> None:
        self.inner = inner
        self.history = history
        self.imp_user_id = imp_user_id
        self.clock = clock
        self.default_imp = default_imp

    async def send(self, post: Post) -> list[str]:
        """Post, then keep the post in the history (its own quick transaction: the post is kept even when what
        the caller does next fails). The ids go back to the caller, the gateway, which audits the post."""
        if not post.imp and self.default_imp:
            post = replace(post, imp=self.default_imp)
        ids = await self.inner.send(post)
        if post.kind in ("reply", "other") and ids and post.imp:
            message = Message(
                id=ids[0], author=Author(id=self.imp_user_id(post.imp), name=post.imp, bot=True),
                content=post.content, created_at=self.clock.now(),
                reply_to=ReplyRef(id=post.reply_to) if post.reply_to else None,
                attachments=[_sent_file(item) for item in post.files],
            )  # fmt: skip  # the message it answers: recovery never answers it twice (issue 19 #2)
            await self.history.db.quick(self.history.record, post.channel_id, message, from_imp=post.imp)
        return ids

    async def typing(self, channel_id: str, active: bool, *, imp: str = "") -> None:
        await set_typing(self.inner, channel_id, active, imp or self.default_imp)


def _sent_file(item: OutgoingFile) -> Attachment:
    """A file the imp posted, as the history keeps it (its name, type and size; never its bytes): a reply that
    is only a picture is not an empty message in the history (seed 003)."""
    kind = mimetypes.guess_type(item.filename)[0] or "application/octet-stream"
    return Attachment(filename=item.filename, content_type=kind, size=len(item.data))
