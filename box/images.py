"""Pictures the envelope asks for: ``picture`` / ``picture_count`` → ``/images/generations``,
``picture_edit`` with an attached image → ``/images/edits`` (docs/conversation.md envelope acts).

Both go through the gateway as ``model.request`` with purpose ``image`` (judged and metered
there). The gateway sends JSON bodies only, so an edit names its source images the JSON way
— ``images: [{"image_url": "data:<type>;base64,…"}]`` — not as a multipart upload. Images
are asked for as JPEG at the configured size and quality, so they fit one protocol line
(1 MiB) on their way back and on to ``discord.send``. One attempt each: a picture that
cannot be made leaves the reply's text to go out alone, with a note.

The image-generation scope (seed 003) is a thin runtime wrapper around the turn machine, like the
typing indicator, not a stage: the responder opens one ``image_scope`` per turn around
``TurnMachine.run``; ResponseRendering makes the envelope's pictures through it, PostSend reads
what it made for the history's image markers (so a picture-only reply is never remembered as an
empty message), and the journal says how many pictures the turn made. Once the turn is over the
scope is closed: nothing can add a picture to a turn that has ended.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from box.common.envelope import Envelope
from box.model import ModelClient
from box.protocol import RpcError
from box.protocol.models import ResponderSettings, SendFile

GENERATIONS = "/images/generations"
EDITS = "/images/edits"
PURPOSE = "image"
IMAGE_FORMAT = "jpeg"
MAX_IMAGES = 4
MARKER_PROMPT_CHARS = 200  # a history marker names the picture, it does not archive its prompt


class ImageFailed(Exception):
    """No picture: the host refused it, or the upstream gave none."""


@dataclass(frozen=True)
class ImageRequest:
    path: str
    body: dict[str, Any]

    @property
    def edit(self) -> bool:
        return self.path == EDITS

    @property
    def prompt(self) -> str:
        return str(self.body.get("prompt", ""))


def image_count(envelope: Envelope) -> int:
    return max(1, min(MAX_IMAGES, envelope.picture_count or 1))


def wants_picture(envelope: Envelope, image_urls: list[str]) -> bool:
    return bool(envelope.picture and envelope.picture.strip()) or (envelope.picture_edit and bool(image_urls))


def image_request(
    settings: ResponderSettings, envelope: Envelope, image_urls: list[str], fallback_prompt: str
) -> ImageRequest:
    """An edit when asked and an image came with the message; otherwise a new picture."""
    prompt = (envelope.picture or "").strip() or fallback_prompt.strip() or "a picture"
    body: dict[str, Any] = {
        "model": settings.image_model,
        "prompt": prompt[:4000],
        "n": image_count(envelope),
        "size": settings.image_size,
        "quality": settings.image_quality,
        "output_format": IMAGE_FORMAT,
    }
    if envelope.picture_edit and image_urls:
        return ImageRequest(
            EDITS, {**body, "images": [{"image_url": url} for url in image_urls[:MAX_IMAGES]]}
        )
    return ImageRequest(GENERATIONS, body)


async def make_images(client: ModelClient, request: ImageRequest) -> list[SendFile]:
    try:
        result = await client.call(request.path, request.body, PURPOSE)
    except RpcError as exc:
        raise ImageFailed(exc.message) from exc
    if result.status != 200:
        raise ImageFailed(f"the image API returned HTTP {result.status}")
    data = result.body.get("data") if isinstance(result.body, dict) else None
    images = [item.get("b64_json") for item in data or [] if isinstance(item, dict)]
    files = [
        SendFile(filename=f"picture-{index}.{IMAGE_FORMAT}", data_b64=b64)
        for index, b64 in enumerate(images, start=1)
        if isinstance(b64, str) and b64
    ]
    if not files:
        raise ImageFailed("the image API returned no image")
    return files


# ------------------------------------------------------------------ the image-generation scope (seed 003)


@dataclass(frozen=True)
class MadePicture:
    """Pictures one request made in a turn: what was asked, and the files that carry them."""

    prompt: str
    edit: bool
    filenames: tuple[str, ...]

    def marker(self) -> str:
        """The image history marker: what the imp's side of the talk shows for these pictures."""
        count = len(self.filenames)
        what = ("edited picture" if self.edit else "picture") + ("s" if count > 1 else "")
        prompt = " ".join(self.prompt.split())
        if len(prompt) > MARKER_PROMPT_CHARS:
            prompt = prompt[: MARKER_PROMPT_CHARS - 1] + "…"
        return f"[{count} {what}: {prompt}]" if count > 1 else f"[{what}: {prompt}]"


class ScopeClosed(RuntimeError):
    """A picture asked for after its turn ended."""


class PictureMaker(Protocol):
    """What ResponseRendering makes pictures through (an ``ImageScope``; a test's double)."""

    @property
    def made(self) -> list[MadePicture]: ...

    async def make(self, request: ImageRequest) -> list[SendFile]: ...


@dataclass(eq=False)
class ImageScope:
    """The pictures of one turn. Open it with ``image_scope``; ``made`` lists what it made, in order."""

    client: ModelClient
    made: list[MadePicture] = field(default_factory=list)
    closed: bool = False

    async def make(self, request: ImageRequest) -> list[SendFile]:
        if self.closed:
            raise ScopeClosed("the turn is over: its image scope is closed")
        files = await make_images(self.client, request)
        self.made.append(MadePicture(request.prompt, request.edit, tuple(f.filename for f in files)))
        return files

    @property
    def pictures(self) -> int:
        return sum(len(item.filenames) for item in self.made)


@asynccontextmanager
async def image_scope(client: ModelClient) -> AsyncIterator[ImageScope]:
    """One turn's image-generation scope, around the turn machine (seed 003); closed on every path."""
    scope = ImageScope(client)
    try:
        yield scope
    finally:
        scope.closed = True


class NoPictures:
    """A turn run without an image scope: a picture it asks for is not made (the text goes out alone)."""

    @property
    def made(self) -> list[MadePicture]:
        return []

    async def make(self, request: ImageRequest) -> list[SendFile]:
        raise ImageFailed("no image scope is open for this turn")


def history_markers(made: list[MadePicture]) -> str:
    """The markers of a turn's pictures, one line each (PostSend appends them to the stored reply)."""
    return "\n".join(item.marker() for item in made)
