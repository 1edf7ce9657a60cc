"""What the bus says happened: every Commit, feed entry and lease write with the time
JetStream stored it, the agents' acknowledged head over time, each kill's figures
worked out from those, and the feed's advisories counted against the acknowledged ones.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgpack
from nats.js.api import DeliverPolicy

from bench.common import percentile
from controller.bus import codec
from controller.bus.nats import COMMIT_SUBJECT, FEED, FEED_SUBJECT, LEASES, Bus
from harmonaize import messages as m


def agents_seq(data: bytes) -> int:
    """A stored Commit's agents' position, without decoding its writes."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(data))
    unpacker.feed(data)
    for _ in range(unpacker.read_map_header()):
        if unpacker.unpack() == "agents_seq":
            return int(unpacker.unpack())
        unpacker.skip()
    raise ValueError("a commit without agents_seq")


@dataclass
class Watch:
    """Every Commit, feed entry and lease write the bus stored, with its store time."""

    commits: list[tuple[float, int]] = field(default_factory=list)  # (time, agents_seq)
    feed: list[float] = field(default_factory=list)
    leases: list[tuple[float, str]] = field(default_factory=list)  # (time, holder)

    async def start(self, js: Any) -> list[Any]:
        async def commit(msg: Any) -> None:
            self.commits.append((msg.metadata.timestamp.timestamp(), agents_seq(msg.data)))

        async def entry(msg: Any) -> None:
            self.feed.append(msg.metadata.timestamp.timestamp())

        async def lease(msg: Any) -> None:
            if msg.data:  # a release or an expiry marker holds nothing
                self.leases.append((msg.metadata.timestamp.timestamp(), msg.data.decode()))

        return [await js.subscribe(COMMIT_SUBJECT, cb=commit, ordered_consumer=True,
                                   deliver_policy=DeliverPolicy.NEW),
                await js.subscribe(FEED_SUBJECT, cb=entry, ordered_consumer=True,
                                   deliver_policy=DeliverPolicy.NEW),
                await js.subscribe(f"$KV.{LEASES}.leader", cb=lease, ordered_consumer=True,
                                   deliver_policy=DeliverPolicy.LAST)]

    def covered(self) -> int:
        return self.commits[-1][1] if self.commits else 0

    def holder(self) -> str:
        return self.leases[-1][1] if self.leases else ""


@dataclass
class Acks:
    """The agents' stream's acknowledged head over time (every producer's acks)."""

    times: list[float]
    seqs: list[int]  # the running maximum

    @classmethod
    def of(cls, pairs: list[tuple[float, int]]) -> Acks:
        pairs.sort()
        times, seqs, top = [], [], 0
        for at, seq in pairs:
            top = max(top, seq)
            times.append(at)
            seqs.append(top)
        return cls(times, seqs)

    def head(self, at: float) -> int:
        i = bisect.bisect_right(self.times, at)
        return self.seqs[i - 1] if i else 0


@dataclass
class Kill:
    victim: str
    at: float
    lease: float = math.nan  # seconds from the kill
    commit: float = math.nan
    feed: float = math.nan
    backlog: int = 0
    drain: float = math.nan  # seconds from the first Commit until the backlog is covered
    successor: str = ""
    restore: float = math.nan  # the successor's own word: seconds to read the log
    began: str = ""  # "warm" (from its standby) or "cold"

    def line(self, n: int, rate: float) -> str:
        return (f"kill {n} ({self.victim}, then {self.successor}): lease taken "
                f"{self.lease:.2f} s, first Commit {self.commit:.2f} s, feed again "
                f"{self.feed:.2f} s after the kill (its restore {self.restore:.2f} s, "
                f"{self.began or '?'}); backlog "
                f"{self.backlog:,} frames ({self.backlog / rate:.1f} s of load), covered "
                f"{self.drain:.2f} s after the first Commit")


def summary(kills: list[Kill], behind: list[int]) -> str:
    """The kills' figures: the failover's p99, median and max, and the rest's spread."""
    def spread(values: list[float], unit: str, form: str = ".2f") -> str:
        return (f"median {statistics.median(values):{form}}{unit}, "
                f"max {max(values):{form}}{unit}")

    times = [k.commit for k in kills]
    return (f"{len(kills)} kills: failover (kill to the successor's first Commit) p99 "
            f"{percentile(times, 99):.2f} s, {spread(times, ' s')}; feed again "
            f"{spread([k.feed for k in kills], ' s')}; successor's restore "
            f"{spread([k.restore for k in kills], ' s')}; backlog at takeover "
            f"{spread([k.backlog for k in kills], ' frames', ',.0f')}, covered after "
            f"{spread([k.drain for k in kills], ' s')}; behind at a Commit during the load "
            f"(acknowledged, not yet covered) {spread(behind or [0], ' frames', ',.0f')}")


#: The leader's log line when it took over (controller/bus/leader.py: take_over).
LEADING = re.compile(r"^(\S+ \S+) \S+ leading: .* \((\w+), (\d+\.\d+) s\)$")


def restore_seconds(log: str, after: float) -> tuple[float, str]:
    """The first takeover a leader's log tells of after ``after``: its seconds to read
    the state, and how it began ("warm" from its standby, "cold" from the snapshot and
    the log); NaN if none."""
    for line in log.splitlines():
        found = LEADING.match(line)
        if found is not None:
            at = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").astimezone()
            if at.timestamp() > after:
                return float(found[3]), found[2]
    return math.nan, ""


def measure(kill: Kill, watch: Watch, acks: Acks) -> None:
    lease = next((t for t, h in watch.leases if t > kill.at and h != kill.victim), None)
    if lease is None:
        return
    kill.lease = lease - kill.at
    kill.successor = next(h for t, h in watch.leases if t == lease)
    before = [s for t, s in watch.commits if t <= lease]
    first = next(((t, s) for t, s in watch.commits if t > lease), None)
    feed = next((t for t in watch.feed if t > lease), None)
    if feed is not None:
        kill.feed = feed - kill.at
    if first is None:
        return
    kill.commit = first[0] - kill.at
    target = acks.head(first[0])
    kill.backlog = target - (before[-1] if before else 0)
    done = next((t for t, s in watch.commits if t >= first[0] and s >= target), None)
    if done is not None:
        kill.drain = done - first[0]


async def feed_topics(bus: Bus) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """HZ_FEED read whole, per job: its topic's numbers (every entry), and its
    advisories' numbers."""
    numbers: dict[str, list[int]] = {}
    advisories: dict[str, list[int]] = {}
    async for batch in bus.read(FEED, FEED_SUBJECT, 0, until=await bus.head(FEED)):
        for _, data, _ in batch:
            entry = codec.read_feed_entry(data)
            if not entry.topic.startswith("job/"):
                continue
            job = entry.topic.rstrip("/").rsplit("/", 1)[1]
            numbers.setdefault(job, []).append(entry.seq)
            # The job's topic also has what placing it published: advisories counted.
            if msgpack.unpackb(entry.frame, raw=False)[2] == m.JobAdvisory.KIND:
                advisories.setdefault(job, []).append(entry.seq)
    return numbers, advisories


@dataclass
class Tally:
    lost: int = 0  # acknowledged advisories with no entry, or numbers skipped
    stored_twice: int = 0  # one entry (one number) in HZ_FEED more than once
    numbered_twice: int = 0  # more advisories numbered than were acknowledged

    @property
    def duplicates(self) -> int:
        return self.stored_twice + self.numbered_twice


def tally(acked: Counter[str], numbers: dict[str, list[int]],
          advisories: dict[str, list[int]]) -> Tally:
    """Per job: advisories numbered in the feed against those acknowledged, and the
    topic's numbers from 1 to its last, each once."""
    out = Tally()
    for job in set(acked) | set(numbers):
        seqs = numbers.get(job, [])
        distinct = set(seqs)
        advised = len(set(advisories.get(job, [])))
        out.lost += max(acked[job] - advised, max(distinct, default=0) - len(distinct), 0)
        out.numbered_twice += max(advised - acked[job], 0)
        out.stored_twice += len(seqs) - len(distinct)
    return out
