"""The box protocol (v1): the contract between host and box (docs/protocol.md).

One package, imported by both sides: the frame and params models
(``box.protocol.models``), the NDJSON codec (``box.protocol.codec``) and the
bidirectional JSON-RPC peer (``box.protocol.peer``).
"""

from box.protocol.codec import (
    DEFAULT_MAX_LINE_BYTES,
    MAX_FRAME_DEPTH,
    FrameInvalid,
    LineTooLong,
    NdjsonDecoder,
    decode_frame,
    encode_frame,
)
from box.protocol.errors import ErrorCode, PeerClosed, ProtocolViolation, RpcError
from box.protocol.models import (
    BOX_METHODS,
    HOST_METHODS,
    PROTOCOL_VERSION,
    MethodSpec,
)
from box.protocol.peer import Peer

__all__ = [
    "BOX_METHODS",
    "DEFAULT_MAX_LINE_BYTES",
    "HOST_METHODS",
    "PROTOCOL_VERSION",
    "MAX_FRAME_DEPTH",
    "ErrorCode",
    "FrameInvalid",
    "LineTooLong",
    "MethodSpec",
    "NdjsonDecoder",
    "Peer",
    "PeerClosed",
    "ProtocolViolation",
    "RpcError",
    "decode_frame",
    "encode_frame",
]
