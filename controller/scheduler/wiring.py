"""The scheduler loop inside the controller's shell: built from ``[scheduler]``, fed the
hosts' holds, given its loop, its operator commands and its reload.

Off (``backend = "none"``, the default) it is inert. In cluster mode it stays off for
now (one replica alone must act, and the leader's lease is not wired to it); the log
says so once.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from controller.scheduler.marks import MarkStore
from controller.scheduler.service import SchedulerService, settings_of
from controller.scheduler.slurm import SlurmBackend
from controller.scheduler.types import HostView
from harmonaize.logs import one_line
from harmonaize.metrics import Family, counter, gauge
from harmonaize.opsocket import Command, CommandError

if TYPE_CHECKING:
    from controller.config import SchedulerSection
    from controller.server import ControllerServer

log = logging.getLogger("harmonaize.controller.scheduler")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SchedulerWiring:
    def __init__(self, server: ControllerServer) -> None:
        self.server = server
        self.service: SchedulerService | None = None
        self.backend: SlurmBackend | None = None
        #: Per host: (its summary object, alive, what the loop acts on) at the last poke.
        self._seen: dict[str, tuple[Any, bool, tuple[Any, ...]]] = {}
        section = server.cfg.scheduler
        if section.backend.value == "none":
            return
        if server.cfg.cluster.enabled:
            log.warning("[scheduler] is off in cluster mode: nothing is drained or resumed")
            return
        self.backend = backend = SlurmBackend(section.scontrol, section.timeout)
        self.service = SchedulerService(settings_of(section), backend,
                                        MarkStore(server.store.db), self.hosts)
        log.info("scheduler loop on: %s backend, %s mode, breaker at %.0f%% of a partition",
                 section.backend.value, section.mode.value, 100 * section.max_share)

    def hosts(self) -> tuple[HostView, ...]:
        """Every host the controller knows, under its node's name."""
        node_map = self.server.cfg.scheduler.node_map
        out = []
        for host_id, record in sorted(self.server.core.cluster.hosts.items()):
            summary = record.summary
            out.append(HostView(node_map.get(host_id, host_id), host_id, record.alive,
                                summary.holds if summary else (),
                                summary.idle_wanted if summary else False))
        return tuple(out)

    def families(self) -> list[Family]:
        """Its counters for the controller's metrics (no node names as labels)."""
        if self.service is None:
            return []
        service = self.service
        actions = counter("harmonaize_controller_scheduler_actions_total",
                          "Actions in the provider's scheduler, by kind and outcome.")
        for key, count in sorted(service.engine.counters.items()):
            kind, _, outcome = key.rpartition("_")
            actions.add(count, kind=kind, outcome=outcome)
        reads = counter("harmonaize_controller_scheduler_read_failures_total",
                        "Reads of the scheduler's nodes that failed or timed out.")
        reads.add(service.counters["read_failures"])
        held = gauge("harmonaize_controller_scheduler_breaker_held",
                     "Drains held back by the circuit breaker in the last pass.")
        held.add(service.held)
        cancelled = gauge("harmonaize_controller_scheduler_cancelled_nodes",
                          "Nodes an operator told the scheduler loop to leave alone.")
        cancelled.add(len(service.engine.marks.cancelled))
        return [actions, reads, held, cancelled]

    def loops(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        return [] if self.service is None else [("scheduler", self.service.run())]

    def poke(self, hosts: Iterable[str] | None = None) -> None:
        """Wake the loop if what it acts on changed: after a batch of agents' frames for
        the ``hosts`` that sent them (the batch costs a few operations per sender, not
        per known host), after the core's timer ticked for every host (liveness).
        A host's summary object is replaced by every summary, so it is compared by
        identity first and its holds only when it is new: a summary that repeats the
        same holds wakes nothing."""
        if self.service is None:
            return
        changed = False
        seen = self._seen
        records = self.server.core.cluster.hosts
        looked = records.items() if hosts is None else \
            ((h, records[h]) for h in hosts if h in records)
        for host_id, record in looked:
            summary, before = record.summary, seen.get(host_id)
            if before is not None and before[0] is summary and before[1] == record.alive:
                continue
            key = (record.alive, summary.holds if summary else (),
                   summary.idle_wanted if summary else False)
            changed |= before is None or before[2] != key
            seen[host_id] = (summary, record.alive, key)
        if changed:
            self.service.poke()

    def reconfigure(self, section: SchedulerSection) -> None:
        if self.service is not None and self.backend is not None:
            self.service.configure(settings_of(section))
            self.backend.timeout = section.timeout

    def commands(self) -> dict[str, Command]:
        return {
            "scheduler": Command(self._view, "drains in the provider's scheduler: each "
                                 "node, our intent, its state, what holds it back"),
            "scheduler-cancel": Command(self._cancel, "leave a node alone: node",
                                        changes=True),
            "scheduler-release": Command(self._release, "act on a cancelled node again: node",
                                         changes=True),
            "scheduler-pause": Command(self._pause, "leave every node alone", changes=True),
            "scheduler-resume": Command(self._resume, "act again after a pause",
                                        changes=True),
        }

    def _live(self) -> SchedulerService:
        if self.service is None:
            raise CommandError("the scheduler loop is off ([scheduler] backend = \"none\", "
                               "or cluster mode)")
        return self.service

    def _view(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.service is None:
            return {"mode": "off", "paused": False, "max_share": 0.0, "cancelled": [],
                    "last_error": "", "last_read": 0.0, "counters": {}, "nodes": []}
        return self.service.view()

    def _changed(self, service: SchedulerService, undo: Any) -> None:
        try:
            service.marks_changed()
        except sqlite3.Error as exc:
            undo()
            raise CommandError(f"not stored, nothing changed: {one_line(exc)}") from None

    def _node(self, args: dict[str, Any]) -> str:
        node = args.get("node")
        if not isinstance(node, str) or not _NODE.fullmatch(node):
            raise CommandError("node must be a node name (letters, digits, ._-)")
        return node

    def _cancel(self, args: dict[str, Any]) -> dict[str, Any]:
        service, node = self._live(), self._node(args)
        marks = service.engine.marks
        if node in marks.cancelled:
            return {"node": node, "cancelled": True, "changed": False}
        marks.cancelled.add(node)
        self._changed(service, lambda: marks.cancelled.discard(node))
        log.info("operator cancelled the scheduler loop on node %s: left alone until "
                 "released", node)
        return {"node": node, "cancelled": True, "changed": True}

    def _release(self, args: dict[str, Any]) -> dict[str, Any]:
        service, node = self._live(), self._node(args)
        marks = service.engine.marks
        if node not in marks.cancelled:
            raise CommandError(f"node {node} is not cancelled")
        marks.cancelled.discard(node)
        self._changed(service, lambda: marks.cancelled.add(node))
        log.info("operator released node %s to the scheduler loop", node)
        return {"node": node, "cancelled": False, "changed": True}

    def _pause(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._set_paused(True)

    def _resume(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._set_paused(False)

    def _set_paused(self, paused: bool) -> dict[str, Any]:
        service = self._live()
        marks = service.engine.marks
        before = marks.paused
        marks.paused = paused
        self._changed(service, lambda: setattr(marks, "paused", before))
        log.info("operator %s the scheduler loop", "paused" if paused else "resumed")
        return {"paused": paused, "changed": before != paused}
