"""Tenant-side API for the controller's feed.

    with FeedClient("tcp://controller:7401", topics=["pool/"]) as feed:
        for msg in feed:
            print(msg.topic, msg.body)

Conditions (level state such as pool capacity) are republished periodically
and to every late joiner; by default a condition identical to the last one
delivered on its topic is skipped, so a program sees each state change once.
Malformed frames are counted and skipped, never raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType

import zmq

from harmonaize.messages import FEED_KINDS, Category, Message, WireError, decode


@dataclass(frozen=True)
class FeedMessage:
    topic: str
    seq: int
    time: float
    body: Message

    @property
    def kind(self) -> str:
        return self.body.KIND

    @property
    def category(self) -> Category:
        return self.body.CATEGORY


@dataclass
class FeedStats:
    received: int = 0
    rejected: int = 0
    repeated_conditions: int = 0
    gaps: int = 0
    last_seq: dict[str, int] = field(default_factory=dict)


class FeedClient:
    def __init__(
        self,
        endpoint: str,
        topics: Iterable[str] = ("pool/",),
        *,
        skip_repeated_conditions: bool = True,
        context: zmq.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.skip_repeated_conditions = skip_repeated_conditions
        self.stats = FeedStats()
        self._conditions: dict[str, Message] = {}
        self._own_context = context is None
        self._ctx = context or zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 512 * 1024)
        for topic in topics:
            self._sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sock.connect(endpoint)

    def recv(self, timeout: float | None = None) -> FeedMessage | None:
        """The next message, or None if ``timeout`` seconds pass without one."""
        poll_ms = None if timeout is None else max(0, int(timeout * 1000))
        while True:
            if not self._sock.poll(poll_ms):
                return None
            message = self._accept(self._sock.recv_multipart())
            if message is not None:
                return message

    def _accept(self, frames: list[bytes]) -> FeedMessage | None:
        if len(frames) != 2:
            self.stats.rejected += 1
            return None
        try:
            topic = frames[0].decode()
            envelope = decode(frames[1], allowed=FEED_KINDS)
        except (UnicodeDecodeError, WireError):
            self.stats.rejected += 1
            return None
        self.stats.received += 1
        last = self.stats.last_seq.get(topic)
        if last is not None and envelope.seq > last + 1:
            self.stats.gaps += 1
        self.stats.last_seq[topic] = max(envelope.seq, last or 0)
        body = envelope.body
        if body.CATEGORY is Category.CONDITION:
            key = f"{topic}|{body.KIND}"
            if self.skip_repeated_conditions and self._conditions.get(key) == body:
                self.stats.repeated_conditions += 1
                return None
            self._conditions[key] = body
        return FeedMessage(topic, envelope.seq, envelope.time, body)

    def __iter__(self) -> Iterator[FeedMessage]:
        while True:
            message = self.recv()
            if message is not None:
                yield message

    def close(self) -> None:
        self._sock.close()
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> FeedClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
