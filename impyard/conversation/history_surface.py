"""The host's surface wrapper: an imp's own posts join the channel history (the box sees its side of the talk).

The host (``impyard.host``) wraps whatever surface it posts through in one of these, so every post the
gateway executes — a reply, a post approved at a gate, a task's post — is recorded the same way.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Callable, Sequence

from box.protocol.models import Attachment, Author, Message, ReplyRef
from impyard.clock import Clock
from impyard.conversation.history import History
from impyard.conversation.typing_indicator import set_typing
from impyard.gateway.surfaces import OutgoingFile, Surface


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

    async def send(
        self,
        channel_id: str,
        content: str,
        reply_to: str | None,
        files: Sequence[object],
        kind: str,
        *,
        imp: str = "",
        then: Callable[[list[str]], None] | None = None,
    ) -> list[str]:
        """Post, then keep the post in the history. ``then`` (blocking, given the message ids: the gateway's audit
        row) runs right after the post is kept, as a quick call of its own (issue 18)."""
        imp = imp or self.default_imp
        ids = await self.inner.send(channel_id, content, reply_to, files, kind, imp=imp)  # type: ignore[arg-type]
        message: Message | None = None
        if kind in ("reply", "other") and ids and imp:
            message = Message(
                id=ids[0], author=Author(id=self.imp_user_id(imp), name=imp, bot=True), content=content,
                created_at=self.clock.now(), reply_to=ReplyRef(id=reply_to) if reply_to else None,
                attachments=[_sent_file(item) for item in files if isinstance(item, OutgoingFile)],
            )  # fmt: skip  # the message it answers: recovery never answers it twice (issue 19 #2)
        if message is None and then is None:
            return ids

        # Two transactions: the post is kept even when ``then`` fails.
        if message is not None:
            await self.history.db.quick(self.history.record, channel_id, message, from_imp=imp)
        if then is not None:
            await self.history.db.quick(then, ids)
        return ids

    async def typing(self, channel_id: str, active: bool, *, imp: str = "") -> None:
        await set_typing(self.inner, channel_id, active, imp or self.default_imp)


def _sent_file(item: OutgoingFile) -> Attachment:
    """A file the imp posted, as the history keeps it (its name, type and size; never its bytes): a reply that
    is only a picture is not an empty message in the history (seed 003)."""
    kind = mimetypes.guess_type(item.filename)[0] or "application/octet-stream"
    return Attachment(filename=item.filename, content_type=kind, size=len(item.data))
