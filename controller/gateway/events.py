"""Feed frames as CloudEvents, SSE text and cursors: no I/O.

A stored publication is a msgpack envelope (harmonaize/messages/); here it becomes
a CloudEvents 1.0 event in the structured JSON format (the ``cloudevents`` SDK writes
it), framed as one server-sent event whose ``id:`` is the stream's cursor. A cursor
says where a client is in the two streams it may see (controller/feed.py:stream_of):
``<epoch hex>-<pool offset>-<job offset>``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgpack
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from harmonaize import messages
from harmonaize.messages import VERSION, ErrorCode

TYPE_PREFIX = "io.harmonaize.feed."
_CURSOR = re.compile(r"([0-9a-f]{1,16})-([0-9]{1,19})-([0-9]{1,19})")
#: A cursor's offsets are a stream's sequence numbers: the wire's Count (at most 2^62),
#: so no offset a client writes overflows SQLite's signed 64-bit integers downstream.
MAX_OFFSET = 2**62
#: Epochs fit SQLite's integers as well (one not the feed's own replays what is kept).
MAX_EPOCH = 2**63 - 1
_FORMAT = JSONFormat()
#: Where one field is at fault, a SchemaError's text starts with its path.
_FIELD = re.compile(r"(?:rejected: )?([A-Za-z0-9_.\[\]-]+): ")

#: The HTTP status of each refusal (docs/wire.md lists them).
STATUS = {
    ErrorCode.MALFORMED: 400, ErrorCode.INVALID: 400, ErrorCode.PROVIDER_FIELD: 400,
    ErrorCode.NOT_AUTHENTICATED: 401,
    ErrorCode.TOO_BROAD: 403, ErrorCode.NOT_YOUR_JOB: 403, ErrorCode.NO_SUCH_TOPIC: 403,
    ErrorCode.NOT_PLACED: 404, ErrorCode.NO_SUCH_NOTICE: 404, ErrorCode.NOT_FOUND: 404,
    ErrorCode.STALE_REVISION: 409, ErrorCode.NOT_DEFERRABLE: 409,
    ErrorCode.NOTICE_STARTED: 409,
    ErrorCode.THROTTLED: 429, ErrorCode.TOO_MANY_SUBSCRIPTIONS: 429,
    ErrorCode.UNAVAILABLE: 503,
}


class CursorError(ValueError):
    """A cursor that is not one of ours."""


@dataclass(frozen=True)
class Cursor:
    epoch: int
    pool: int = 0
    job: int = 0

    @classmethod
    def parse(cls, text: str) -> Cursor:
        match = _CURSOR.fullmatch(text.strip())
        if match is None:
            raise CursorError(f"{text[:80]!r} is not a feed cursor (EPOCH-POOL-JOB, as an "
                              "event's id: gave it)")
        epoch, pool, job = int(match[1], 16), int(match[2]), int(match[3])
        if epoch > MAX_EPOCH:
            raise CursorError(f"{text[:80]!r}: the epoch is out of range (at most "
                              f"{MAX_EPOCH:x})")
        if pool > MAX_OFFSET or job > MAX_OFFSET:
            raise CursorError(f"{text[:80]!r}: an offset is out of range (0 to {MAX_OFFSET})")
        return cls(epoch, pool, job)

    def __str__(self) -> str:
        return f"{self.epoch:x}-{self.pool}-{self.job}"

    def at(self, stream: str) -> int:
        return self.pool if stream == "pool" else self.job

    def moved(self, stream: str, offset: int) -> Cursor:
        # Made directly (not dataclasses.replace): once per event per stream.
        return Cursor(self.epoch, offset, self.job) if stream == "pool" else \
            Cursor(self.epoch, self.pool, offset)


def cloudevent(frame: bytes, topic: str, source: str, epoch: int) -> bytes:
    """The CloudEvent (JSON) of one stored publication: its body as the spec says."""
    _, _, kind, _, seq, stamp, body = msgpack.unpackb(frame, raw=False)
    category = messages.kinds()[kind].CATEGORY.value
    return event(kind, body, source, event_id=f"{epoch}:{topic}:{seq}", subject=topic,
                 time=stamp, seq=seq, category=category)


class EventCache:
    """The CloudEvent of each recent publication, written once for every stream it goes
    to. Its key is everything the event is made of (the frame as stored, its topic, the
    source and the epoch), so a stream is given exactly the bytes :func:`cloudevent`
    would write for it: what one tenant's stream gets is never anything but its own
    frame's event. The newest ``size`` are kept (a publication reaches its streams
    within one pass of the loop; a republication or resume that misses writes anew)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._events: dict[tuple[bytes, str, str, int], bytes] = {}
        self.hits = 0

    def get(self, frame: bytes, topic: str, source: str, epoch: int) -> bytes:
        key = (frame, topic, source, epoch)
        written = self._events.get(key)
        if written is None:
            written = self._events[key] = cloudevent(frame, topic, source, epoch)
            if len(self._events) > self.size:
                del self._events[next(iter(self._events))]  # the oldest (insertion order)
        else:
            self.hits += 1
            if messages.auditing():  # audited as every send is, cached or not
                messages.audit("cloudevent", "gateway", json.loads(written))
        return written


def event(kind: str, data: Any, source: str, *, event_id: str, time: float,
          subject: str | None = None, seq: int = 0, category: str = "control") -> bytes:
    """A CloudEvent of ours in JSON, written (and checked) by the SDK, and audited where
    the process audits what it sends tenants. ``subject`` is the topic (none for what
    the gateway says of the stream itself)."""
    attributes = {
        "id": event_id, "source": source, "type": f"{TYPE_PREFIX}{kind}.v{VERSION}",
        **({"subject": subject} if subject else {}),
        "time": datetime.fromtimestamp(time, UTC),
        "datacontenttype": "application/json",
        "dataschema": f"#/components/schemas/{_schema_name(kind)}",
        "seq": seq, "category": category,
    }
    written = _FORMAT.write(CloudEvent(attributes, data))
    if messages.auditing():
        messages.audit("cloudevent", "gateway", json.loads(written))
    return written


def _schema_name(kind: str) -> str:
    registered = messages.kinds().get(kind)
    return registered.__name__ if registered is not None else kind.capitalize()


def sse(event_json: bytes, cursor: Cursor | None) -> bytes:
    """One server-sent event: ``id:`` (the cursor after it, if any) and one data line."""
    head = f"id: {cursor}\n".encode() if cursor is not None else b""
    return head + b"data: " + event_json + b"\n\n"


def error(code: ErrorCode, message: str, request_id: str, **extra: Any) -> dict[str, Any]:
    """The gateway's answer to a refused request (the spec's HttpError)."""
    body: dict[str, Any] = {"code": code.value, "message": message}
    field = _FIELD.match(message)
    if code is ErrorCode.INVALID and field is not None:
        body["field"] = field[1]
    body.update(extra)
    return {"error": body, "request_id": request_id}
