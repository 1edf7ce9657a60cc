"""The agents' door's fast path for heartbeats: the most common frame by far (one a
second from every host) read without the full decoder.

:func:`heartbeat_sender` says who sent a frame when the frame is a plain, well-formed
heartbeat, and None for anything else. It accepts only frames the full decoder
(:func:`harmonaize.messages.decode`) also accepts as a heartbeat from that sender, with
the same limits on every field; a frame it is unsure of (another kind, an unknown field,
a value it does not check here) is left to the full decoder, so a malformed or unknown
frame is treated exactly as before: one line, counted, rejected. The controller reads
nothing of a heartbeat but its sender (the host's liveness); its fields are still
checked, so a frame that would have been rejected is never taken for a heartbeat.
"""

from __future__ import annotations

import math
import re

import msgpack

from harmonaize.messages import MAGIC, MAX_FRAME, MAX_LIST, MAX_MAP, MAX_STR, VERSION
from harmonaize.schema import IDENT_PATTERN

#: How a heartbeat's envelope begins as every encoder here writes it: a seven-element
#: array, the magic, the version and the kind, each in msgpack's shortest form (a frame
#: that spells them otherwise is valid too, and goes through the full decoder).
HEAD = b"\x97" + b"".join(msgpack.packb(v) for v in (MAGIC, VERSION, "heartbeat"))

_IDENT = re.compile(IDENT_PATTERN)
#: The wire schema's limits (harmonaize/schema.py: Ident, Count, Seconds, Timestamp).
_MAX_IDENT = 128
_MAX_COUNT = 2**62
_MAX_SECONDS = 1e9
_MAX_TIMESTAMP = 1e11
_FIELDS = frozenset(("uptime", "last_seq"))


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value <= _MAX_COUNT


def _number(value: object, hi: float) -> bool:
    if type(value) is int:
        return 0 <= value <= hi
    return type(value) is float and math.isfinite(value) and 0.0 <= value <= hi


def heartbeat_sender(data: bytes) -> str | None:
    """The sender of ``data`` if it is a well-formed heartbeat the full decoder would
    accept as one; None otherwise (the full decoder then decides what it is)."""
    if not data.startswith(HEAD) or len(data) > MAX_FRAME:
        return None
    try:
        frame = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True,
                                max_str_len=MAX_STR, max_bin_len=0, max_array_len=MAX_LIST,
                                max_map_len=MAX_MAP, max_ext_len=0)
    except (ValueError, TypeError, OverflowError):  # every msgpack error
        return None
    # HEAD fixes the array's length and its first three elements.
    _, _, _, sender, seq, stamp, body = frame
    if (type(sender) is not str or not 0 < len(sender) <= _MAX_IDENT
            or _IDENT.fullmatch(sender) is None):
        return None
    if not _count(seq) or not _number(stamp, _MAX_TIMESTAMP):
        return None
    if type(body) is not dict or body.keys() != _FIELDS:
        return None
    if not _number(body["uptime"], _MAX_SECONDS) or not _count(body["last_seq"]):
        return None
    return sender
