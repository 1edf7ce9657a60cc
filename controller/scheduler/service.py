"""The scheduler loop's shell in the controller: reads the scheduler, steps the engine,
runs its actions, one at a time, each under the backend's timeout.

It wakes when a host's holds (or its wish to be idle) change, and every ``reconcile``
seconds; each pass reads the nodes afresh before deciding, so nothing is done on a
stale picture (someone else's drain a moment ago). A failing or hung scheduler costs
one line and a count per episode, and a retry; the controller keeps serving, since
all of it is awaited subprocesses on the event loop, never a blocking call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from controller.scheduler.backend import SchedulerBackend, SchedulerError
from controller.scheduler.engine import Engine
from controller.scheduler.marks import MarkStore
from controller.scheduler.types import (
    Action,
    Drain,
    HostView,
    Mode,
    Observations,
    Reboot,
    Reserve,
    Resume,
    Settings,
    Unreserve,
)
from harmonaize.logs import one_line

log = logging.getLogger("harmonaize.controller.scheduler")

#: Passes a second in the long run, and how many may come back to back: a hold change
#: is acted on at once, a flapping host cannot make us run scontrol more often.
PASS_RATE = 4.0
PASS_BURST = 10.0


class SchedulerService:
    def __init__(self, settings: Settings, backend: SchedulerBackend, marks: MarkStore,
                 hosts: Callable[[], tuple[HostView, ...]]) -> None:
        self.backend = backend
        self.store = marks
        self.engine = Engine(settings, marks.load())
        self.hosts = hosts
        self._wake = asyncio.Event()
        #: Per node, the last action failure said (each is logged once per episode).
        self._failing: dict[str, str] = {}
        self.counters: dict[str, int] = {"passes": 0, "read_failures": 0}
        self.last_error = ""
        self.last_read = 0.0  # wall time of the last good read
        self.held = 0  # actions held back by the breaker in the last pass

    @property
    def settings(self) -> Settings:
        return self.engine.settings

    def configure(self, settings: Settings) -> None:
        self.engine.settings = settings
        self._wake.set()

    def poke(self) -> None:
        """A host's holds (or its wish to be idle, or its liveness) changed: a pass now."""
        self._wake.set()

    def marks_changed(self) -> None:
        """An operator's cancel, release, pause or resume: store it, then act on it."""
        self.store.save(self.engine.marks)
        self._wake.set()

    async def run(self) -> None:
        deadline = 0.0
        tokens, refilled = PASS_BURST, time.monotonic()
        while True:
            delay = deadline - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
            now = time.monotonic()
            tokens = min(PASS_BURST, tokens + (now - refilled) * PASS_RATE)
            refilled = now
            if tokens < 1.0:
                await asyncio.sleep((1.0 - tokens) / PASS_RATE)
                continue  # refilled on the next turn
            tokens -= 1.0
            self._wake.clear()
            deadline = await self.once()

    async def once(self) -> float:
        """One pass: read, decide, act. Returns the next deadline (monotonic)."""
        hosts = self.hosts()
        nodes, reservations = None, frozenset[str]()
        try:
            nodes = await self.backend.nodes()
            reservations = await self.backend.reservations()
            self.last_read = time.time()
            if self.last_error:
                log.info("scheduler readable again")
            self.last_error = ""
        except SchedulerError as exc:
            self.counters["read_failures"] += 1
            if str(exc) != self.last_error:
                log.warning("scheduler not read, nothing decided: %s", exc)
            self.last_error = str(exc)
            nodes = None
        self.counters["passes"] += 1
        step = self.engine.step(Observations(hosts, nodes, reservations), time.monotonic())
        for note in step.notes:
            log.info("%s", note)
        self.held = sum(1 for row in step.rows if row.held.startswith("breaker"))
        acted = False
        for action in step.actions:
            acted |= await self._run(action)
        self._save()
        if acted:
            self._wake.set()  # read again: see what the scheduler made of it
        return step.deadline

    async def _run(self, action: Action) -> bool:
        try:
            match action:
                case Drain(node, reason):
                    await self.backend.drain(node, reason)
                case Resume(node):
                    await self.backend.resume(node)
                case Reboot(node, reason):
                    await self.backend.reboot(node, reason)
                case Reserve(node, name, minutes):
                    await self.backend.reserve(node, name, minutes)
                case Unreserve(_, name):
                    await self.backend.unreserve(name)
        except SchedulerError as exc:
            self.engine.failed(action, time.monotonic())
            said = f"{type(action).__name__.lower()} on node {action.node} failed: {exc}"
            if self._failing.get(action.node) != said:  # once per episode, counted always
                log.warning("%s (tried again until it works)", said)
            self._failing[action.node] = said
            return False
        self._failing.pop(action.node, None)
        self.engine.done(action)
        log.info("scheduler: %s", _said(action))
        return True

    def _save(self) -> None:
        try:
            self.store.save(self.engine.marks)
        except sqlite3.Error as exc:  # a full disk: kept in memory, stored next pass
            log.warning("scheduler marks not stored (kept in memory): %s", one_line(exc))

    def view(self) -> dict[str, Any]:
        marks = self.engine.marks
        return {
            "mode": self.settings.mode.value,
            "paused": marks.paused,
            "max_share": self.settings.max_share,
            "cancelled": sorted(marks.cancelled),
            "last_error": self.last_error,
            "last_read": self.last_read,
            "counters": {**self.counters, **self.engine.counters},
            "nodes": [row.__dict__ for row in self.engine.rows],
        }


def _said(action: Action) -> str:
    match action:
        case Drain(node, reason):
            return f"drained {node}: {reason}"
        case Resume(node):
            return f"resumed {node}"
        case Reboot(node, reason):
            return f"asked for a reboot of {node} when idle: {reason}"
        case Reserve(node, name, minutes):
            return f"reserved {node} for maintenance as {name} ({minutes} min at most)"
        case Unreserve(node, name):
            return f"deleted reservation {name} of {node}"
    return str(action)


def settings_of(section: Any) -> Settings:
    """The engine's settings from the configuration's [scheduler] section."""
    return Settings(mode=Mode(section.mode.value), max_share=section.max_share,
                    reconcile=section.reconcile,
                    reservation_minutes=section.reservation_minutes)
