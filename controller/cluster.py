"""Sans-I/O protocol core of the controller: which host is who, in what order.

Connections are opaque keys (ZeroMQ routing ids). A connection is bound to a
host by its ``hello``; anything else from an unbound connection is answered
with ``resync``. Sequenced messages (conditions and events) are accepted only
in order (``seq == last + 1``); duplicates and gaps are not processed and are
answered with the last accepted sequence number, so the agent goes back and
resends. Acknowledgements are returned to the shell, which sends them only
after the state they cover is committed.

A host that is up is counted down once it was silent for ``missed_heartbeats``
of its heartbeat intervals. :attr:`Cluster.silent_from` says when that can
first happen, so the shell need not look before then. Hosts wait for that look in a
heap by the deadline they had when it was last looked at (speaking moves a deadline
later without touching the heap): a look takes only the entries that came due, and a
host that spoke since goes back in at its present deadline, so a look costs what came
due, not a walk over every host.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from controller.types import HostState
from harmonaize.messages import (
    Ack,
    ApplicationXid,
    Category,
    Envelope,
    Goodbye,
    GpuCounts,
    Health,
    Heartbeat,
    Hello,
    HostEvent,
    HostSummary,
    JobAdvisory,
    JobRankProgress,
    Message,
    Resync,
    TuningAck,
    TuningReport,
    ValidationNotice,
)


class Down(StrEnum):
    SILENT = "missed heartbeats"
    STOPPED = "agent stopped"


@dataclass
class HostRecord:
    host_id: str
    pool: str = "default"
    gpu_class: str = "none"
    gpus: int = 0
    version: str = ""
    epoch: int = 0
    last_seq: int = 0
    heartbeat: float = 1.0
    alive: bool = False
    down_reason: str = ""
    last_seen: float = 0.0  # monotonic time of the last message
    summary: HostSummary | None = None
    #: The last view made and what it was made of: every change in any batch asks for
    #: every host's view, and most hosts' are as they were.
    _view: HostState | None = field(default=None, init=False, compare=False, repr=False)
    _view_of: tuple[object, ...] = field(default=(), init=False, compare=False, repr=False)

    def view(self) -> HostState:
        summary = self.summary
        # Compared by identity first (a tuple's items are): a summary that came again
        # unchanged is not the one received before, and is compared by value then.
        of = (self.host_id, self.pool, self.gpu_class, self.alive, summary)
        if self._view is not None and self._view_of == of:
            return self._view
        self._view_of = of
        self._view = HostState(
            host_id=self.host_id,
            pool=self.pool,
            gpu_class=self.gpu_class,
            alive=self.alive,
            schedulable=summary.schedulable if summary else True,
            health=summary.health if summary else Health.HEALTHY,
            gpus=summary.gpus if summary else GpuCounts(),
            links=summary.links if summary else (),
            energy=summary.energy if summary else (),
        )
        return self._view


@dataclass(frozen=True)
class Reply:
    conn: bytes
    body: Message


@dataclass(frozen=True)
class StoredEvent:
    host_id: str
    epoch: int
    seq: int
    time: float
    body: HostEvent


@dataclass
class Cluster:
    missed_heartbeats: int = 3
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    bindings: dict[bytes, str] = field(default_factory=dict)
    conn_of: dict[str, bytes] = field(default_factory=dict)
    counters: Counter[str] = field(default_factory=Counter)
    dirty: set[str] = field(default_factory=set)
    new_events: list[StoredEvent] = field(default_factory=list)
    #: Job-scoped advice and notices (host, message), for the shell to check against the
    #: job's placement and rebuild for its tenant.
    advisories: list[tuple[str, JobAdvisory | ValidationNotice]] = field(default_factory=list)
    #: Tuning reports and acknowledgements (host, message), for the shell's agreement.
    tuning: list[tuple[str, TuningReport | TuningAck]] = field(default_factory=list)
    #: Ranks' progress and application XIDs (host, message), for the shell's job health.
    jobhealth: list[tuple[str, JobRankProgress | ApplicationXid]] = field(default_factory=list)
    #: Hosts that said hello since the shell last looked (resend what they lack).
    hellos: list[str] = field(default_factory=list)
    #: Set whenever something tenants may see could have changed.
    changed: bool = True
    #: The hosts whose view (:meth:`HostRecord.view`) may have changed since the shell
    #: last took them (:meth:`take_touched`): what the redactor's counts are moved by.
    touched: set[str] = field(default_factory=set)
    #: Hosts that are up, by when each could first be silent as of when it went in: a
    #: heap of the distinct deadlines, the hosts at each (hosts heard in one beat share
    #: one), and each host's one live deadline (its entries at others are stale).
    _deadlines: list[float] = field(default_factory=list)
    _at: dict[float, list[str]] = field(default_factory=dict)
    _due: dict[str, float] = field(default_factory=dict)

    def restore(self, records: Iterable[HostRecord], now: float) -> None:
        """Load hosts from the database after a restart.

        Hosts that were up get one liveness period of grace, so capacity does
        not drop to zero just because the controller restarted.
        """
        for record in records:
            record.last_seen = now
            self.hosts[record.host_id] = record
            self.touched.add(record.host_id)
            if record.alive:
                self._may_fall_silent(record)
        self.changed = True

    @property
    def silent_from(self) -> float:
        """No host that is up can be counted silent before this: lowered as hosts come
        up or say hello; hosts only move their own deadline later by speaking, so a
        bound that is too early costs one look (at the hosts that came due), never a
        late one."""
        return self._deadlines[0] if self._deadlines else math.inf

    def reschedule(self) -> None:
        """Every deadline anew (``missed_heartbeats`` changed: any may be earlier now)."""
        self._deadlines, self._at, self._due = [], {}, {}
        for host in self.hosts.values():
            if host.alive:
                self._may_fall_silent(host)

    def heard(self, host_ids: Iterable[str], now: float) -> int:
        """Known hosts heard (a replica's word, in cluster mode): each one's heartbeat as
        :meth:`receive` applies it, without a message per host. Returns how many."""
        count = 0
        hosts, conn_of = self.hosts, self.conn_of
        for host_id in host_ids:
            host = hosts.get(host_id)
            if host is None or host_id not in conn_of:
                continue  # unknown, or never bound: its hello comes first
            host.last_seen = now
            if not host.alive:
                self._set_alive(host, True)
            count += 1
        return count

    def bind(self, conn: bytes, host_id: str) -> None:
        """Take ``conn`` as the known host's connection without a hello (cluster mode: the
        leader hears every host on the bus, where it said hello long before)."""
        if host_id in self.hosts:
            self.bindings[conn] = host_id
            self.conn_of[host_id] = conn

    def beat(self, conn: bytes, sender: str, now: float) -> bool:
        """A heartbeat from ``sender`` on ``conn``: True when it was the common case (the
        connection bound to that host, which is up), done as :meth:`receive` does it;
        False when :meth:`receive` must see the whole message (it did nothing then)."""
        host_id = self.bindings.get(conn)
        if host_id is None or host_id != sender:
            return False
        host = self.hosts[host_id]
        if not host.alive:
            return False
        host.last_seen = now
        return True

    def receive(self, conn: bytes, env: Envelope, now: float) -> list[Reply]:
        body = env.body
        if isinstance(body, Hello):
            return self._hello(conn, env.sender, body, now)
        host_id = self.bindings.get(conn)
        if host_id is None:
            self.counters["unbound"] += 1
            return [Reply(conn, Resync("say hello first"))]
        if env.sender != host_id:
            self.counters["sender_mismatch"] += 1
            return []
        host = self.hosts[host_id]
        host.last_seen = now
        if not host.alive:
            self._set_alive(host, True)
        if isinstance(body, Heartbeat):
            return []
        if isinstance(body, Goodbye):
            self._set_alive(host, False, Down.STOPPED)
            return []
        if body.CATEGORY is Category.CONTROL:
            self.counters["unexpected"] += 1
            return []
        if env.seq != host.last_seq + 1:
            self.counters["duplicate" if env.seq <= host.last_seq else "out_of_order"] += 1
            return [Reply(conn, Ack(host.last_seq))]
        host.last_seq = env.seq
        self.dirty.add(host_id)
        if isinstance(body, HostSummary):
            if body != host.summary:
                host.summary = body
                self.changed = True
                self.touched.add(host_id)
        elif isinstance(body, HostEvent):
            self.new_events.append(StoredEvent(host_id, host.epoch, env.seq, env.time, body))
        elif isinstance(body, JobAdvisory | ValidationNotice):
            self.advisories.append((host_id, body))
        elif isinstance(body, TuningReport | TuningAck):
            self.tuning.append((host_id, body))
        elif isinstance(body, JobRankProgress | ApplicationXid):
            self.jobhealth.append((host_id, body))
        self.counters["accepted"] += 1
        return [Reply(conn, Ack(env.seq))]

    def _hello(self, conn: bytes, host_id: str, hello: Hello, now: float) -> list[Reply]:
        bound = self.bindings.get(conn)
        if bound is not None and bound != host_id:
            self.counters["sender_mismatch"] += 1
            return []
        # One connection per host: forget the host's previous connection.
        old_conn = self.conn_of.get(host_id)
        if old_conn is not None and old_conn != conn:
            self.bindings.pop(old_conn, None)
        self.bindings[conn] = host_id
        self.conn_of[host_id] = conn
        host = self.hosts.get(host_id)
        if host is None:
            host = self.hosts[host_id] = HostRecord(host_id)
        if host.epoch != hello.epoch:
            # A restarted agent numbers from 1 again; trust what it says was acked.
            host.epoch, host.last_seq = hello.epoch, hello.acked
        if (host.pool, host.gpu_class) != (hello.pool, hello.gpu_class):
            self.changed = True
        host.pool, host.gpu_class = hello.pool, hello.gpu_class
        host.gpus, host.version, host.heartbeat = hello.gpus, hello.version, hello.heartbeat
        host.last_seen = now
        self._set_alive(host, True)
        self._may_fall_silent(host)  # its heartbeat may be shorter now
        self.dirty.add(host_id)
        self.touched.add(host_id)
        self.hellos.append(host_id)
        self.counters["hello"] += 1
        return [Reply(conn, Ack(host.last_seq))]

    def _set_alive(self, host: HostRecord, alive: bool, reason: str = "") -> None:
        if host.alive != alive:
            host.alive = alive
            host.down_reason = "" if alive else reason
            self.dirty.add(host.host_id)
            self.touched.add(host.host_id)
            self.changed = True
            self.counters["host_up" if alive else "host_down"] += 1
            if alive:
                self._may_fall_silent(host)

    def _may_fall_silent(self, host: HostRecord) -> None:
        """The host in the heap at its deadline now, unless an earlier entry of it is
        there (that one is looked at first, and puts it back at its deadline then)."""
        deadline = host.last_seen + self.missed_heartbeats * host.heartbeat
        if deadline < self._due.get(host.host_id, math.inf):
            self._due[host.host_id] = deadline
            hosts = self._at.get(deadline)
            if hosts is None:
                self._at[deadline] = [host.host_id]
                heapq.heappush(self._deadlines, deadline)
            else:
                hosts.append(host.host_id)

    def tick(self, now: float) -> list[str]:
        """Count silent hosts down; returns the hosts that went down. Looks only at the
        hosts whose deadline in the heap has passed."""
        gone, spoke = [], []
        heap, due, hosts = self._deadlines, self._due, self.hosts
        # Up to and at ``now``: the test below is on ``now - last_seen`` (as a walk
        # made it), which rounding may put either side of ``last_seen + limit``.
        while heap and heap[0] <= now:
            deadline = heapq.heappop(heap)
            for host_id in self._at.pop(deadline):
                if due.get(host_id) != deadline:
                    continue  # stale: the host's live deadline is another, looked at then
                del due[host_id]
                host = hosts.get(host_id)
                if host is None or not host.alive:
                    continue  # down already (a goodbye): back in when it comes up
                if now - host.last_seen > self.missed_heartbeats * host.heartbeat:
                    self._set_alive(host, False, Down.SILENT)
                    gone.append(host_id)
                else:
                    spoke.append(host)
        for host in spoke:  # after the loop: a deadline of ``now`` is not taken again
            self._may_fall_silent(host)
        return gone

    def views(self) -> list[HostState]:
        return [host.view() for host in self.hosts.values()]

    def take_touched(self) -> list[HostState]:
        """The views of the hosts touched since the last call (in the order of the
        hosts), for the redactor's counts."""
        touched, self.touched = self.touched, set()
        if len(touched) * 4 >= len(self.hosts):  # most of them: no sort, one pass
            return [h.view() for h in self.hosts.values() if h.host_id in touched]
        return [self.hosts[h].view() for h in sorted(touched) if h in self.hosts]

    def take_dirty(self) -> tuple[list[HostRecord], list[StoredEvent]]:
        records = [self.hosts[h] for h in sorted(self.dirty)]
        events, self.new_events = self.new_events, []
        self.dirty.clear()
        return records, events
