"""Agents' frames as the leader reads them from the bus: decoded once, and a body that
repeats the host's last one taken from it instead of checked again.

Most of what the leader applies is a host's summary sent again unchanged (the agent's
periodic refresh): the same body bytes under a new sequence number and time. Checking a
body against its schema costs more than all the rest of applying it, and the outcome
depends only on its bytes, so the reader keeps, per host, the last body's bytes and the
message they decoded to; a frame whose body bytes are the same gets that message (its
envelope is still checked in full). A frame that differs, or anything unusual, goes
through the wire's own :func:`~harmonaize.messages.decode`, whose verdict stands.
Sans-I/O.
"""

from __future__ import annotations

import msgpack

from harmonaize.messages import AGENT_KINDS, Envelope, Message, check_head, decode
from harmonaize.messages.core import MAX_FRAME, MAX_LIST, MAX_MAP, MAX_STR


class FrameReader:
    def __init__(self) -> None:
        #: host -> (kind, the body's bytes, the message they decoded to).
        self._last: dict[str, tuple[str, bytes, Message]] = {}
        self.reused = 0

    def read(self, host: str, data: bytes) -> Envelope:
        """The frame an agent of ``host`` sent; raises only ``WireError``."""
        last = self._last.get(host)
        if last is not None and 0 < len(data) <= MAX_FRAME:
            head, offset = _head(data)
            if head is not None and head[2] == last[0] and data[offset:] == last[1]:
                _, header = check_head(head, AGENT_KINDS)
                self.reused += 1
                return Envelope(last[0], header.sender, header.seq, header.time, last[2])
        env = decode(data, allowed=AGENT_KINDS)
        head, offset = _head(data)
        if head is not None:
            self._last[host] = (env.kind, bytes(data[offset:]), env.body)
        return env


def _head(data: bytes) -> tuple[list[object] | None, int]:
    """The envelope's first six elements and where its body begins; (None, 0) for
    anything but a 7-element array (the full decode says what is wrong with it)."""
    unpacker = msgpack.Unpacker(raw=False, use_list=True, strict_map_key=True,
                                max_str_len=MAX_STR, max_bin_len=0, max_array_len=MAX_LIST,
                                max_map_len=MAX_MAP, max_ext_len=0, max_buffer_size=MAX_FRAME)
    unpacker.feed(data)
    try:
        if unpacker.read_array_header() != 7:
            return None, 0
        head = [unpacker.unpack() for _ in range(6)]
    except (ValueError, TypeError, OverflowError, msgpack.OutOfData):
        return None, 0
    return head, unpacker.tell()
