"""The phase of a job's tuning change in flight, as a table (see controller/agreement.py).

A job is ``idle`` until the controller arms a change on every host of it; it is then
``arming`` until every host acknowledged the arm (or one refused, or the arm timed out),
and the outcome is decided once: ``confirming`` when every host armed and every rank of
every communicator is accounted for, else ``cancelling``. The outcome is resent until
every host acknowledged it (``resolved``), and the job is ``idle`` again. A restart
while arming cancels: the outcome was never sent, and hosts that armed must hear one.

The values are what the controller's status shows as the job's ``phase``.
"""

from __future__ import annotations

from enum import StrEnum

from harmonaize.messages import AckPhase
from harmonaize.statemachine import Machine


class Phase(StrEnum):
    #: No change in flight.
    IDLE = "idle"
    #: A change was armed; the controller waits for every host's acknowledgement.
    ARMING = "arming"
    #: Every host armed it: commit is being sent until every host acknowledged it.
    CONFIRMING = "confirming"
    #: A host refused, timed out or left ranks unaccounted for (or the controller
    #: restarted while arming): cancel is being sent until every host acknowledged it.
    CANCELLING = "cancelling"


class Event(StrEnum):
    #: The controller armed a change on every host of the job.
    ARM = "arm"
    #: Every host armed and the hosts' ranks add up: the change commits.
    CONFIRM = "confirm"
    #: The change cannot commit (refusal, timeout, ranks unaccounted for, restart).
    CANCEL = "cancel"
    #: Every host acknowledged the outcome.
    RESOLVED = "resolved"


PHASES: Machine[Phase, Event] = Machine("agreement", {
    (Phase.IDLE, Event.ARM): Phase.ARMING,
    (Phase.ARMING, Event.CONFIRM): Phase.CONFIRMING,
    (Phase.ARMING, Event.CANCEL): Phase.CANCELLING,
    (Phase.CONFIRMING, Event.RESOLVED): Phase.IDLE,
    (Phase.CANCELLING, Event.RESOLVED): Phase.IDLE,
}, states=tuple(Phase), events=tuple(Event))

#: The phases in which an outcome is being sent (a host's "resolved" counts).
RESOLVING = frozenset({Phase.CONFIRMING, Phase.CANCELLING})

#: The answers a host owes in each phase: to the arm (armed or refused) while arming,
#: to the outcome once it is decided; none while idle.
ANSWERS: dict[Phase, frozenset[AckPhase]] = {
    Phase.IDLE: frozenset(),
    Phase.ARMING: frozenset({AckPhase.ARMED, AckPhase.REFUSED}),
    Phase.CONFIRMING: frozenset({AckPhase.RESOLVED}),
    Phase.CANCELLING: frozenset({AckPhase.RESOLVED}),
}


def answered(phase: Phase, ack: AckPhase | None) -> bool:
    """Whether a host's acknowledgement is the answer the phase waits for."""
    return ack is not None and ack in ANSWERS[phase]


def outcome(why_not: str) -> Event:
    """The event that decides an armed change: any reason not to commit cancels it."""
    return Event.CANCEL if why_not else Event.CONFIRM
