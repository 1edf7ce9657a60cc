"""The observer interface, its registry, and the bookkeeping the framework does.

An observer watches one kind of thing on the host (the host itself, links,
GPUs). It implements :class:`Observer`; the framework starts it, samples it
every interval, and records per-observer success and duration, the way
node_exporter does for its collectors. Raising :class:`FeatureAbsent` from
``start`` means "nothing to watch here" and is not an error.

``sample`` runs on the agent's event loop and must not block: an observer that
talks to a slow or hanging device keeps its own worker thread and returns the
latest snapshot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

#: The agent's whole configuration (``agent.config.AgentConfig``), handed through to each
#: registration, which picks its observer's section; the framework reads none of it, so
#: it does not import the composition that sits above the domains.
AgentConfig = Any

log = logging.getLogger(__name__)


class FeatureAbsent(Exception):
    """What the observer watches does not exist on this host."""


class Observer:
    """Base class; subclasses set ``name`` and implement ``sample``."""

    name: ClassVar[str] = ""
    #: Seconds between samples; None samples every interval. In between, the
    #: last observation is handed on again (host memory needs no 10 Hz).
    interval: float | None = None

    def start(self) -> None:
        """Acquire resources. Raise FeatureAbsent if there is nothing to watch."""

    def sample(self, now: float) -> Any:
        """Return this interval's observation (a dataclass)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Release resources; must be safe to call more than once."""

    def describe(self) -> dict[str, Any]:
        """Extra lines for the operator's status view (mode, fallback reason...)."""
        return {}

    def wake(self) -> None:
        """Ask the agent to sample now rather than at the next interval.

        Safe to call from any thread (an event arrived on an observer's own
        thread); the framework supplies it.
        """


Factory = Callable[[AgentConfig], Observer]


@dataclass(frozen=True)
class Registration:
    name: str
    factory: Factory
    enabled: Callable[[AgentConfig], bool]


_REGISTRY: dict[str, Registration] = {}


def register(name: str, factory: Factory, enabled: Callable[[AgentConfig], bool]) -> None:
    if name in _REGISTRY:
        raise ValueError(f"observer {name!r} registered twice")
    _REGISTRY[name] = Registration(name, factory, enabled)


def registered() -> Mapping[str, Registration]:
    return dict(_REGISTRY)


class State(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    ABSENT = "absent"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass
class Record:
    """What the framework knows about one observer, shown to operators."""

    name: str
    state: State = State.STARTING
    detail: str = ""
    samples: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_success: bool | None = None
    last_duration: float = 0.0
    last_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state.value,
            "detail": self.detail,
            "samples": self.samples,
            "failures": self.failures,
            "last_success": self.last_success,
            "last_duration_seconds": round(self.last_duration, 6),
            "last_error": self.last_error,
            **self.extra,
        }


class ObserverSet:
    """Runs a set of observers and records how each one is doing."""

    def __init__(self, observers: Iterable[Observer],
                 wake: Callable[[], None] | None = None) -> None:
        self._observers = {o.name: o for o in observers}
        self.records = {name: Record(name) for name in self._observers}
        self._last: dict[str, tuple[float, Any]] = {}
        if wake is not None:
            for observer in self._observers.values():
                observer.wake = wake  # type: ignore[method-assign]

    @classmethod
    def from_config(cls, cfg: AgentConfig, only: Iterable[str] | None = None,
                    wake: Callable[[], None] | None = None) -> ObserverSet:
        chosen = set(only) if only is not None else None
        observers = [
            reg.factory(cfg)
            for reg in _REGISTRY.values()
            if (chosen is None and reg.enabled(cfg)) or (chosen is not None and reg.name in chosen)
        ]
        return cls(observers, wake)

    def get(self, name: str) -> Observer | None:
        return self._observers.get(name)

    def start_all(self) -> None:
        for name, observer in self._observers.items():
            record = self.records[name]
            try:
                observer.start()
            except FeatureAbsent as exc:
                record.state, record.detail = State.ABSENT, str(exc) or "not present"
                log.info("observer %s: feature absent: %s", name, record.detail)
            except Exception as exc:
                record.state, record.detail = State.FAILED, f"start failed: {exc}"
                record.last_error = str(exc)
                log.error("observer %s failed to start: %s", name, exc)
            else:
                record.state = State.RUNNING
                record.extra = observer.describe()

    def sample_all(self, now: float) -> dict[str, Any]:
        """One pass over running observers; returns their observations by name."""
        results: dict[str, Any] = {}
        for name, observer in self._observers.items():
            record = self.records[name]
            if record.state is not State.RUNNING:
                continue
            last = self._last.get(name)
            if last is not None and observer.interval and now - last[0] < observer.interval:
                results[name] = last[1]
                continue
            began = time.perf_counter()
            try:
                results[name] = observer.sample(now)
                self._last[name] = (now, results[name])
            except Exception as exc:
                record.failures += 1
                record.consecutive_failures += 1
                record.last_success = False
                if str(exc) != record.last_error:  # log changes, not every interval
                    log.warning("observer %s: sample failed: %s", name, exc)
                record.last_error = str(exc)
            else:
                record.samples += 1
                record.consecutive_failures = 0
                record.last_success = True
                record.last_error = ""
            record.last_duration = time.perf_counter() - began
        return results

    def refresh_details(self) -> None:
        for name, observer in self._observers.items():
            if self.records[name].state is State.RUNNING:
                self.records[name].extra = observer.describe()

    def stop_all(self) -> None:
        for name, observer in self._observers.items():
            try:
                observer.stop()
            except Exception as exc:
                log.warning("observer %s failed to stop cleanly: %s", name, exc)
            self.records[name].state = State.STOPPED

    def failing(self) -> list[Record]:
        """Observers that failed to start or whose last sample failed."""
        return [
            r
            for r in self.records.values()
            if r.state is State.FAILED or (r.state is State.RUNNING and r.last_success is False)
        ]
