"""The two strictness classes of the protocol's models and the bounded scalars every module shares.

Direction decides strictness: what the *host* sends, the box parses leniently (unknown fields
ignored, the host may be newer); what the *box* sends, the host parses strictly (unknown fields
refused with -32602), because every byte from a box is hostile input.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Id = Annotated[str, Field(min_length=1, max_length=128)]
Name = Annotated[str, Field(max_length=256)]


class FromHost(BaseModel):
    """Sent by the host, parsed by the box: unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore", defer_build=True)


class FromBox(BaseModel):
    """Sent by the box, parsed by the host: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


class Empty(FromBox):
    """An empty params or result object (``{}``)."""


class EmptyFromHost(FromHost):
    pass
