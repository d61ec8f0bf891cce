"""Pictures the envelope asks for: ``picture`` / ``picture_count`` → ``/images/generations``,
``picture_edit`` with an attached image → ``/images/edits`` (docs/conversation.md envelope acts).

Both go through the gateway as ``model.request`` with purpose ``image`` (judged and metered
there). The gateway sends JSON bodies only, so an edit names its source images the JSON way
— ``images: [{"image_url": "data:<type>;base64,…"}]`` — not as a multipart upload. Images
are asked for as JPEG at the configured size and quality, so they fit one protocol line
(1 MiB) on their way back and on to ``discord.send``. One attempt each: a picture that
cannot be made leaves the reply's text to go out alone, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from box.envelope import Envelope
from box.model import ModelClient
from box.protocol import RpcError
from box.protocol.models import ResponderSettings, SendFile

GENERATIONS = "/images/generations"
EDITS = "/images/edits"
PURPOSE = "image"
IMAGE_FORMAT = "jpeg"
MAX_IMAGES = 4


class ImageFailed(Exception):
    """No picture: the host refused it, or the upstream gave none."""


@dataclass(frozen=True)
class ImageRequest:
    path: str
    body: dict[str, Any]


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
