"""The tuning phase of a communicator, as a table: where a change of its rules stands.

A change goes in two steps so that every rank answers alike at every collective
index (see :mod:`agent.tuning.loop`): it is *armed* (the new rules from an index
``at`` every rank is still below, marked pending), then, once the ranks' fresh
records are read, confirmed or cancelled. On one host the loop does both; for a
communicator spanning hosts the controller decides, after every host acknowledged.

Phases:

- ``IDLE``: no change in flight (no entry yet, or one a restarted agent adopted settled).
- ``ARMED``: armed by this host alone; the ranks' fresh records decide it.
- ``AGREEING``: armed for a controller's decision; the ranks' fresh records decide
  whether this host acknowledges it.
- ``ACKNOWLEDGED``: acknowledged as armed; the controller's outcome decides it (also
  where a restarted agent's adopted pending entry waits: its decision is unknown).
- ``REFUSED``: refused to the controller; its entry stays pending until the controller
  cancels (it never confirms what a host refused).
- ``CONFIRMED`` / ``CANCELLED``: the change was taken or withdrawn; the next one may be
  armed (the loop also waits until every rank passed a confirmed switch).

Events are what happened: the loop sends them and takes the table's answer; nobody
assigns a phase. Sans-I/O.
"""

from __future__ import annotations

from enum import StrEnum

from harmonaize.statemachine import Machine


class Phase(StrEnum):
    IDLE = "idle"
    ARMED = "armed"
    AGREEING = "agreeing"
    ACKNOWLEDGED = "acknowledged"
    REFUSED = "refused"
    CONFIRMED = "confirmed"
    CANCELLED = "cancelled"


class Event(StrEnum):
    #: This host alone armed a change (congestion, a calm hold, a withdrawal, a stop).
    ARM = "arm"
    #: The controller's decision armed a change here (or re-armed one already pending).
    ARM_AGREED = "arm_agreed"
    #: The ranks' fresh records show the armed entry can be taken by every rank.
    VERIFIED = "verified"
    #: They do not (a rank raced past, refused, does not map the file, left, ...).
    UNVERIFIED = "unverified"
    #: The controller confirmed the decision.
    COMMIT = "commit"
    #: The controller cancelled it.
    ABORT = "abort"
    #: A restarted agent adopted an entry its predecessor left pending.
    ADOPTED_PENDING = "adopted_pending"


#: Phases from which a new change may be armed.
SETTLED = (Phase.IDLE, Phase.CONFIRMED, Phase.CANCELLED)
#: Phases whose entry is pending for a controller's outcome.
AWAITING_CONTROLLER = (Phase.AGREEING, Phase.ACKNOWLEDGED, Phase.REFUSED)

_MOVES: dict[tuple[Phase, Event], Phase] = {
    **{(settled, Event.ARM): Phase.ARMED for settled in SETTLED},
    **{(settled, Event.ARM_AGREED): Phase.AGREEING for settled in SETTLED},
    (Phase.IDLE, Event.ADOPTED_PENDING): Phase.ACKNOWLEDGED,
    (Phase.ARMED, Event.VERIFIED): Phase.CONFIRMED,
    (Phase.ARMED, Event.UNVERIFIED): Phase.CANCELLED,
    (Phase.AGREEING, Event.VERIFIED): Phase.ACKNOWLEDGED,
    (Phase.AGREEING, Event.UNVERIFIED): Phase.REFUSED,
    # A resent arm (or one for what a restarted agent adopted) verifies again.
    (Phase.ACKNOWLEDGED, Event.ARM_AGREED): Phase.AGREEING,
    (Phase.REFUSED, Event.ARM_AGREED): Phase.AGREEING,
    (Phase.AGREEING, Event.COMMIT): Phase.CONFIRMED,
    (Phase.ACKNOWLEDGED, Event.COMMIT): Phase.CONFIRMED,
    (Phase.AGREEING, Event.ABORT): Phase.CANCELLED,
    (Phase.ACKNOWLEDGED, Event.ABORT): Phase.CANCELLED,
    (Phase.REFUSED, Event.ABORT): Phase.CANCELLED,
}


#: The tuning phase of one communicator.
PHASES: Machine[Phase, Event] = Machine(
    "tuning_phase", _MOVES, states=tuple(Phase), events=tuple(Event))
