"""Sans-I/O reliable delivery from agent to controller.

Messages wait *unsequenced* in a queue until the transport takes them; only
then do they get the next sequence number, and they stay until the controller
acknowledges them (cumulatively). Unsent messages can therefore be replaced or
dropped without leaving holes in the sequence: a newer condition replaces an
unsent older one of the same kind, and when the queue is full the oldest
unsent *event* is dropped and counted. Sent but unacknowledged messages are
resent, oldest first, after ``ack_timeout`` (go-back-N), because the
controller only accepts the next sequence number in order.

With a :class:`~agent.spool.Spool`, events also wait on disk until they are
acknowledged (or dropped), and a new run starts with the previous run's
unacknowledged events at the head of its queue.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harmonaize.messages import Category, Message

if TYPE_CHECKING:
    from agent.spool import Spool


@dataclass
class _Queued:
    body: Message
    spool_id: int | None = None


@dataclass
class _InFlight:
    seq: int
    body: Message
    sent_at: float
    spool_id: int | None = None


class Outbox:
    def __init__(self, *, limit: int, ack_timeout: float, window: int = 1000,
                 spool: Spool | None = None) -> None:
        self.limit = limit
        self.ack_timeout = ack_timeout
        self.window = window
        self.spool = spool
        self._queued: deque[_Queued] = deque()
        self._in_flight: deque[_InFlight] = deque()
        self.next_seq = 1
        self.acked = 0
        self.dropped = 0
        self.resent = 0
        #: Events carried over from the previous run.
        self.restored = 0
        if spool is not None:
            for spool_id, body in spool.load():
                self._queued.append(_Queued(body, spool_id))
                self.restored += 1

    def __len__(self) -> int:
        return len(self._queued) + len(self._in_flight)

    @property
    def last_sent(self) -> int:
        return self.next_seq - 1

    def add(self, body: Message) -> None:
        spool_id = None
        if body.CATEGORY is Category.CONDITION:
            # The new condition says everything the unsent older one said.
            for i, queued in enumerate(self._queued):
                if queued.body.KIND == body.KIND:
                    del self._queued[i]
                    break
        elif body.CATEGORY is Category.EVENT and self.spool is not None:
            spool_id = self.spool.add(body)
        self._queued.append(_Queued(body, spool_id))
        while len(self) > self.limit and self._drop_oldest_event():
            pass

    def _drop_oldest_event(self) -> bool:
        for i, queued in enumerate(self._queued):
            if queued.body.CATEGORY is Category.EVENT:
                del self._queued[i]
                self.dropped += 1
                if queued.spool_id is not None and self.spool is not None:
                    self.spool.remove([queued.spool_id])
                return True
        return False

    def due(self, now: float) -> list[tuple[int, Message]]:
        """What to transmit now: timed-out in-flight messages, then new ones."""
        out: list[tuple[int, Message]] = []
        if self._in_flight and now - self._in_flight[0].sent_at >= self.ack_timeout:
            for item in self._in_flight:
                item.sent_at = now
                out.append((item.seq, item.body))
            self.resent += len(out)
        return out

    def take(self, now: float) -> tuple[int, Message] | None:
        """Sequence the next queued message for sending, if the window allows."""
        if not self._queued or len(self._in_flight) >= self.window:
            return None
        queued = self._queued.popleft()
        item = _InFlight(self.next_seq, queued.body, now, queued.spool_id)
        self.next_seq += 1
        self._in_flight.append(item)
        return item.seq, item.body

    def untake(self, seq: int) -> None:
        """The transport refused the message just taken: make it queued again."""
        if self._in_flight and self._in_flight[-1].seq == seq:
            item = self._in_flight.pop()
            self.next_seq -= 1
            self._queued.appendleft(_Queued(item.body, item.spool_id))

    def ack(self, seq: int) -> None:
        if seq > self.last_sent:
            return  # an ack for what we never sent (stale controller state): ignore
        self.acked = max(self.acked, seq)
        done = []
        while self._in_flight and self._in_flight[0].seq <= seq:
            item = self._in_flight.popleft()
            if item.spool_id is not None:
                done.append(item.spool_id)
        if done and self.spool is not None:
            self.spool.remove(done)

    def rewind(self, now: float) -> None:
        """Make everything in flight due at once (the controller asked to resync)."""
        for item in self._in_flight:
            item.sent_at = now - self.ack_timeout

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def queued(self) -> int:
        return len(self._queued)
