"""Between the campaign's agents and its controller: the network (delays, loss,
partitions, in simulated time) and the controller, the real :class:`Agreement` stored
and restored through its snapshots.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

from controller.agreement import Agreement
from controller.agreementstate import AgreementSettings
from harmonaize.messages import (
    Message,
    TuningAck,
    TuningReport,
    TuningResolve,
)
from testbed.tuningschedule import CONTROLLER, JOB, LATENCY


class Network:
    """Messages between agents and the controller, in simulated time."""

    def __init__(self) -> None:
        self._queue: list[tuple[float, int, str, str, Message]] = []
        self._count = 0
        self.now = 0.0
        #: host -> (until, kind): "delay" holds both directions, "drop" loses the
        #: controller's messages (agents resend theirs: they are held), "partition" both.
        self.faults: dict[str, list[tuple[float, float, str]]] = {}

    def _state(self, host: str, now: float) -> tuple[str, float]:
        for start, until, kind in self.faults.get(host, ()):
            if start <= now < until:
                return kind, until
        return "", now

    def send(self, src: str, dst: str, message: Message, now: float) -> None:
        host = src if dst == CONTROLLER else dst
        kind, until = self._state(host, now)
        deliver = now + LATENCY
        if kind in ("drop", "partition") and src == CONTROLLER:
            return  # lost; the controller resends until acknowledged
        if kind:
            deliver = until + LATENCY  # held (TCP, or the agent's outbox), then delivered
        self._count += 1
        heapq.heappush(self._queue, (deliver, self._count, src, dst, message))

    def due(self, now: float) -> Iterator[tuple[str, str, Message]]:
        while self._queue and self._queue[0][0] <= now:
            _, _, src, dst, message = heapq.heappop(self._queue)
            yield src, dst, message


class Controller:
    def __init__(self, settings: AgreementSettings, hosts: list[str]) -> None:
        self.settings = settings
        self.hosts = hosts
        self.store: dict[str, dict[str, Any]] = {}
        self.agreement: Agreement | None = None
        self.down_until = -1.0
        self.inbox: list[tuple[str, Message]] = []
        self.kill_midsend = False
        self.start(0.0)

    def start(self, now: float) -> None:
        self.agreement = Agreement(self.settings)
        for job, state in self.store.items():
            self.agreement.restore(job, state, now)
        self.agreement.set_hosts(JOB, self.hosts)
        for host in self.hosts:
            self.agreement.reconnected(host)

    def step(self, network: Network, now: float) -> None:
        if self.agreement is None:
            if now >= self.down_until:
                self.start(now)
            else:
                return
        assert self.agreement is not None
        inbox, self.inbox = self.inbox, []
        for host, message in inbox:
            if isinstance(message, TuningReport):
                self.agreement.report(host, message, now)
            elif isinstance(message, TuningAck):
                self.agreement.ack(host, message, now)
        outgoing = self.agreement.step(now)
        dirty, gone = self.agreement.take_dirty()
        for job in dirty:
            snapshot = self.agreement.snapshot(job)
            if snapshot is not None:
                self.store[job] = snapshot
        for job in gone:
            self.store.pop(job, None)
        for i, (host, message) in enumerate(outgoing):
            if self.kill_midsend and i == 1 and isinstance(message, TuningResolve):
                self.kill_midsend = False
                self.kill(now, 1.0)
                return
            network.send(CONTROLLER, host, message, now)

    def kill(self, now: float, duration: float) -> None:
        self.agreement = None
        self.down_until = now + duration
        self.inbox.clear()  # unprocessed: the agents' outboxes resend them
