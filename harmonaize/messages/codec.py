"""The envelope and the codec: :func:`encode` a message, :func:`decode` a hostile frame
(raising only :class:`WireError`), and the audit of what tenants are sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import msgpack

from harmonaize.messages.core import (
    MAGIC,
    MAX_FRAME,
    MAX_LIST,
    MAX_MAP,
    MAX_STR,
    VERSION,
    Category,
    Message,
    WireError,
    registered,
)
from harmonaize.messages.peers import TENANT_FACING
from harmonaize.schema import (
    Count,
    Ident,
    SchemaError,
    Timestamp,
    from_plain,
    strict_keys,
    to_plain,
)


@dataclass(frozen=True)
class Envelope:
    kind: str
    sender: str
    seq: int
    time: float
    body: Message

    @property
    def category(self) -> Category:
        return self.body.CATEGORY


#: Called with (kind, sender, plain body) for every tenant-facing message this process
#: encodes, where auditing is on (harmonaize/wireaudit.py installs it); None: off.
audit_hook: Callable[[str, str, object], None] | None = None


def auditing() -> bool:
    return audit_hook is not None


def audit(kind: str, sender: str, plain: object) -> None:
    """Record one tenant-facing message (a wire body, or a CloudEvent as ``cloudevent``)."""
    if audit_hook is not None:
        audit_hook(kind, sender, plain)


def encode(body: Message, *, sender: str, seq: int = 0, now: float | None = None) -> bytes:
    """Serialise ``body`` in a versioned envelope."""
    stamp = time.time() if now is None else now
    plain = to_plain(body)
    frame = [MAGIC, VERSION, body.KIND, sender, seq, stamp, plain]
    data = msgpack.packb(frame, use_bin_type=True)
    if len(data) > MAX_FRAME:
        raise WireError(f"{body.KIND}: frame of {len(data)} bytes exceeds {MAX_FRAME}")
    if audit_hook is not None and body.KIND in TENANT_FACING:
        audit_hook(body.KIND, sender, plain)
    return data


@dataclass(frozen=True)
class _Header:
    sender: Ident
    seq: Count
    time: Timestamp


def check_head(head: list[object], allowed: Collection[str] | None = None
               ) -> tuple[type[Message], _Header]:
    """The envelope's first six elements (magic, version, kind, sender, seq, time)
    checked: the body's class and the header. Raises only :class:`WireError`."""
    magic, version, kind, sender, seq, stamp = head
    if magic != MAGIC:
        raise WireError("bad magic: not a HarmonAIze frame")
    if version != VERSION or isinstance(version, bool):
        raise WireError(f"unsupported wire version {version!r:.20} (this side speaks {VERSION})")
    try:
        header = from_plain(_Header, {"sender": sender, "seq": seq, "time": stamp}, "envelope")
    except SchemaError as exc:
        raise WireError(str(exc)) from None
    # The envelope is read: from here a refusal names the request's number (an unknown
    # kind too, so a client's "the answer to my request n" holds).
    cls = registered(kind) if isinstance(kind, str) else None
    if cls is None:
        raise WireError.of_request(f"unknown message kind {kind!r:.60}", header.seq)
    if allowed is not None and kind not in allowed:
        raise WireError.of_request(f"message kind {kind!r} is not accepted here", header.seq)
    return cls, header


def decode(data: bytes, *, allowed: Collection[str] | None = None,
           strict: bool = False) -> Envelope:
    """Parse an untrusted frame. Raises only :class:`WireError`.

    With ``strict``, unknown fields anywhere in the body are errors (requests
    from tenants: a misspelt field must not be acknowledged as if it applied).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError("frame must be bytes")
    if len(data) > MAX_FRAME:
        raise WireError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
    if len(data) == 0:
        raise WireError("empty frame")
    try:
        frame = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=MAX_STR,
            max_bin_len=0,
            max_array_len=MAX_LIST,
            max_map_len=MAX_MAP,
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError) as exc:  # every msgpack error
        raise WireError(f"not a valid msgpack frame: {exc}") from None
    if not isinstance(frame, list) or len(frame) != 7:
        raise WireError("frame is not a 7-element envelope")
    cls, header = check_head(frame[:6], allowed)
    body = frame[6]
    kind = frame[2]
    try:
        if strict:
            with strict_keys():
                message_body = from_plain(cls, body, kind)
        else:
            message_body = from_plain(cls, body, kind)
    except SchemaError as exc:
        raise WireError.of_request(str(exc), header.seq) from None
    return Envelope(kind, header.sender, header.seq, header.time, message_body)
