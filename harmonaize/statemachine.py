"""State machines as data: a table of legal moves, in one place per machine.

Each machine (a GPU's health, a communicator's tuning phase, an agreement's phase, a
GPU's remediation) is a :class:`Machine`: its states, its events, and a table
``(state, event) -> next state``. Code never assigns a state; it sends an event and
takes what the table says. A move the table does not hold is a programming error:
under test (``strict``) it raises :class:`IllegalTransition`; in production it is
counted (:func:`illegal_counts`, exported as a metric by each daemon), logged once
per kind, and the state stays as it was, so one bug cannot take a daemon down.

Sans-I/O: no clock, no environment. Each daemon's ``main`` turns strictness on from
``HARMONAIZE_STRICT_TRANSITIONS`` (the suite sets it), tests call :func:`set_strict`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger("harmonaize.statemachine")

S = TypeVar("S", bound=Hashable)
E = TypeVar("E", bound=Hashable)

#: The environment variable each daemon's ``main`` reads to make illegal moves raise.
STRICT_ENV = "HARMONAIZE_STRICT_TRANSITIONS"

_strict = False
_illegal: Counter[str] = Counter()
_logged: set[tuple[str, str, str]] = set()


class IllegalTransition(RuntimeError):
    """A machine was sent an event its table has no move for from that state."""


def set_strict(strict: bool) -> None:
    """Raise on an illegal move (tests) instead of counting it (production)."""
    global _strict  # noqa: PLW0603 - one switch for the process, set once at start
    _strict = strict


def illegal_counts() -> dict[str, int]:
    """Illegal moves refused so far in this process, by machine name."""
    return dict(_illegal)


@dataclass(frozen=True)
class Machine(Generic[S, E]):
    """One machine: its name (for metrics and messages) and its table of moves."""

    name: str
    moves: Mapping[tuple[S, E], S]
    #: Every state, including those no move leaves (listed so tests can enumerate).
    states: tuple[S, ...] = ()
    #: Every event, including those legal from few states.
    events: tuple[E, ...] = ()
    _from: dict[S, frozenset[E]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        allowed: dict[S, set[E]] = {}
        for state, event in self.moves:
            allowed.setdefault(state, set()).add(event)
        object.__setattr__(self, "_from", {s: frozenset(e) for s, e in allowed.items()})
        known_states = set(self.states)
        known_events = set(self.events)
        for (state, event), target in self.moves.items():
            if known_states and (state not in known_states or target not in known_states):
                raise ValueError(f"{self.name}: move {state!r} -> {target!r} names an "
                                 "undeclared state")
            if known_events and event not in known_events:
                raise ValueError(f"{self.name}: move on undeclared event {event!r}")

    def legal(self, state: S, event: E) -> bool:
        return (state, event) in self.moves

    def events_from(self, state: S) -> frozenset[E]:
        """The events that move ``state`` somewhere (empty for a final state)."""
        return self._from.get(state, frozenset())

    def move(self, state: S, event: E) -> S:
        """The state after ``event``; an illegal move raises under test, else is counted
        and leaves the state as it was."""
        if (state, event) in self.moves:
            return self.moves[(state, event)]
        message = f"{self.name}: no move from {state!r} on {event!r}"
        if _strict:
            raise IllegalTransition(message)
        _illegal[self.name] += 1
        key = (self.name, repr(state), repr(event))
        if key not in _logged:
            _logged.add(key)
            log.error("%s (refused and counted; the state stays %r)", message, state)
        return state

    def pairs(self) -> Iterable[tuple[S, E]]:
        """Every (state, event) pair of the declared states and events, legal or not."""
        return ((s, e) for s in self.states for e in self.events)
