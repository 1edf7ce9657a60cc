"""The core's Commits as bytes on the bus, and back: no I/O.

A commit on ``hz.state.commit`` is one :class:`~controller.outputs.Writes` with the
position in the agents' stream it covers (everything before it is applied). The
encoding is msgpack of plain values; message bodies go through the same schema
checks as the wire (:func:`harmonaize.schema.from_plain`), so a commit written by one
version and read by another fails loudly rather than half-applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from controller.cluster import HostRecord, StoredEvent
from controller.notices import Notice
from controller.outputs import FeedEntry, Writes
from controller.plainmemo import summary_plain, summary_unpacked
from controller.types import Member, Placement
from harmonaize.messages import HostEvent, JobDeclaration
from harmonaize.schema import from_plain, to_plain

#: Raised when the bytes are not a commit of this version.
FORMAT = 1


class CodecError(ValueError):
    """Bytes on the bus that are not what this version wrote."""


@dataclass(frozen=True)
class Commit:
    writes: Writes
    #: The agents' stream position up to which the writes cover what agents sent.
    agents_seq: int


def _host(record: HostRecord) -> dict[str, Any]:
    return {"host_id": record.host_id, "pool": record.pool, "gpu_class": record.gpu_class,
            "gpus": record.gpus, "version": record.version, "epoch": record.epoch,
            "last_seq": record.last_seq, "heartbeat": record.heartbeat, "alive": record.alive,
            "down_reason": record.down_reason,
            "summary": None if record.summary is None else summary_plain(record.summary)}


def _record(plain: dict[str, Any]) -> HostRecord:
    summary = plain.pop("summary")
    # Packed again only to find the equal summary already built (most are alike).
    return HostRecord(**plain, summary=None if summary is None else summary_unpacked(
        msgpack.packb(summary)))


def _placement(placement: Placement) -> dict[str, Any]:
    return {"job": placement.job, "tenant": placement.tenant, "group": placement.group,
            "members": [[m.name, m.host_id] for m in placement.members],
            "generation": placement.generation}


def _placed(plain: dict[str, Any]) -> Placement:
    return Placement(plain["job"], plain["tenant"],
                     tuple(Member(name, host) for name, host in plain["members"]),
                     plain["group"], plain.get("generation", 0))


def encode(commit: Commit) -> bytes:
    w = commit.writes
    return msgpack.packb({
        "format": FORMAT,
        "agents_seq": commit.agents_seq,
        "hosts": [_host(h) for h in w.hosts],
        "events": [[e.host_id, e.epoch, e.seq, e.time, to_plain(e.body)] for e in w.events],
        "feed_seqs": dict(w.feed_seqs),
        "feed_log": [list(entry) for entry in w.feed_log],
        "feed_offsets": dict(w.feed_offsets),
        "declarations": {job: None if d is None else [d[0], to_plain(d[1])]
                         for job, d in w.declarations.items()},
        "placements": {job: None if p is None else _placement(p)
                       for job, p in w.placements.items()},
        "tuning": {job: None if t is None else dict(t) for job, t in w.tuning.items()},
        "notices": {key: None if n is None else n.to_plain() for key, n in w.notices.items()},
        "negotiation": None if w.negotiation is None else dict(w.negotiation),
    }, use_bin_type=True)


def decode(data: bytes) -> Commit:
    try:
        plain = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if not isinstance(plain, dict) or plain.get("format") != FORMAT:
            raise CodecError("not a commit of this version")
        writes = Writes(
            hosts=tuple(_record(dict(h)) for h in plain["hosts"]),
            events=tuple(StoredEvent(h, ep, seq, t, from_plain(HostEvent, body))
                         for h, ep, seq, t, body in plain["events"]),
            feed_seqs=plain["feed_seqs"],
            feed_log=tuple(FeedEntry(*entry) for entry in plain["feed_log"]),
            feed_offsets=plain["feed_offsets"],
            declarations={job: None if d is None else (d[0], from_plain(JobDeclaration, d[1]))
                          for job, d in plain["declarations"].items()},
            placements={job: None if p is None else _placed(p)
                        for job, p in plain["placements"].items()},
            tuning=plain["tuning"],
            notices={key: None if n is None else Notice.from_plain(n)
                     for key, n in plain["notices"].items()},
            negotiation=plain.get("negotiation"),
        )
    except CodecError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise CodecError(f"not a commit of this version: {exc}") from None
    return Commit(writes, int(plain["agents_seq"]))


def feed_entry(entry: FeedEntry) -> bytes:
    """One numbered publication as the feed stream carries it."""
    return msgpack.packb(list(entry), use_bin_type=True)


def read_feed_entry(data: bytes) -> FeedEntry:
    try:
        topic, seq, condition, frame, stream, offset = msgpack.unpackb(data, raw=False)
        return FeedEntry(str(topic), int(seq), bool(condition), bytes(frame), str(stream),
                         int(offset))
    except (ValueError, TypeError) as exc:
        raise CodecError(f"not a feed entry: {exc}") from None
