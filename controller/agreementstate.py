"""What the agreement keeps per job, its settings, and the part of it that is stored.

Data only (controller/agreement.py holds the protocol, controller/agreementrules.py
the choosing rules): a job's reports, its change in flight (:class:`Decision`) and the
phase of that change (controller/agreementphases.py), what every host follows, and
the form all this takes in the controller's database (:func:`stored`, :func:`load`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from controller.agreementphases import PHASES, Event, Phase
from harmonaize.messages import (
    AckPhase,
    Activation,
    CommReport,
    Message,
    TuningArm,
    TuningReport,
    TuningResolve,
)
from harmonaize.schema import Num

DEFAULT_CHOICE = "default"
#: The choices a declaration can give, by severity (agent/tuning/policies derives
#: these names): the only names that may become a job's choice, which its tenant sees.
CHOICES = {DEFAULT_CHOICE: 0, "congested": 1, "severe": 2}
MAX_ACTIVATIONS = 32
MAX_AT = 2**62
#: After a cancelled change, the next arm waits this long, doubling up to the maximum.
BACKOFF = 1.0
MAX_BACKOFF = 30.0


@dataclass(frozen=True)
class AgreementSettings:
    """The ``[tuning]`` section of the controller's configuration."""

    STRICT_KEYS: ClassVar[bool] = True
    #: Seconds a less severe wish must last before the choice steps down.
    hold: Annotated[float, Num(0.0, 3600.0)] = 10.0
    max_decisions_per_minute: Annotated[int, Num(1, 600)] = 4
    #: Seconds of collectives, at the fastest reported rate, between arming and ``at``
    #: (how long the slowest host may take to arm and hear the outcome before its
    #: ranks pause at ``at``).
    lead: Annotated[float, Num(0.0, 600.0)] = 2.0
    #: ... and at least this many collectives.
    margin: Annotated[int, Num(1, 1_000_000)] = 100
    #: A host's report older than this no longer counts (the host went quiet).
    report_ttl: Annotated[float, Num(0.5, 3600.0)] = 10.0
    #: Seconds to wait for every host's arm acknowledgement before cancelling.
    arm_timeout: Annotated[float, Num(0.05, 600.0)] = 1.0
    #: Seconds between resends of an arm or resolve a host has not acknowledged.
    resend: Annotated[float, Num(0.05, 600.0)] = 0.5


@dataclass
class Decision:
    """A change in flight: armed, then resolved on every host alike."""

    number: int
    choice: str
    activations: tuple[Activation, ...]
    hosts: frozenset[str]
    armed_at: float
    reason: str = ""
    acks: dict[str, AckPhase] = field(default_factory=dict)
    ack_reports: dict[str, tuple[CommReport, ...]] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)

    def message(self, job: str, fingerprint: str, phase: Phase) -> Message:
        if phase is Phase.ARMING:
            return TuningArm(job, self.number, self.choice, fingerprint, self.activations)
        return TuningResolve(job, self.number, phase is Phase.CONFIRMING, self.activations)


@dataclass(frozen=True)
class Report:
    report: TuningReport
    received: float


@dataclass
class JobState:
    hosts: frozenset[str] | None = None
    reports: dict[str, Report] = field(default_factory=dict)
    number: int = 0
    #: Where the change in flight stands; only the table in agreementphases moves it.
    phase: Phase = Phase.IDLE
    #: The change in flight (None exactly when the phase is idle).
    decision: Decision | None = None
    fingerprint: str = ""
    #: What every host follows per communicator (wire id): (choice, at).
    committed: dict[int, tuple[str, int]] = field(default_factory=dict)
    choice: str = DEFAULT_CHOICE
    severity: int = 0
    changes: deque[float] = field(default_factory=deque)
    lower_since: float | None = None
    lower_want: tuple[int, str] = (0, DEFAULT_CHOICE)
    withdrawn: bool = False
    waiting: str = ""
    diverged: dict[int, str] = field(default_factory=dict)
    #: No new arm before this (after cancellations), and the current back-off.
    retry_at: float = float("-inf")
    backoff: float = BACKOFF
    dirty: bool = True

    def move(self, event: Event) -> Phase:
        """Send the phase an event; the table says where it goes."""
        self.phase = PHASES.move(self.phase, event)
        return self.phase


def stored(job: JobState) -> dict[str, Any]:
    """What must survive a restart: numbers, the change in flight, what holds.
    A decision's ``commit`` is None while arming, else whether it commits."""
    decision = job.decision
    return {
        "number": job.number, "choice": job.choice, "severity": job.severity,
        "fingerprint": job.fingerprint, "withdrawn": job.withdrawn,
        "committed": [[comm, choice, at] for comm, (choice, at) in
                      sorted(job.committed.items())],
        "decision": None if decision is None else {
            "number": decision.number, "choice": decision.choice,
            "activations": [[a.comm, a.at] for a in decision.activations],
            "hosts": sorted(decision.hosts),
            "commit": None if job.phase is Phase.ARMING else job.phase is Phase.CONFIRMING,
            "acks": {h: p.value for h, p in sorted(decision.acks.items())},
        },
    }


def load(job: JobState, state: Mapping[str, Any], now: float) -> None:
    """Load a job's stored state after a restart. The change in flight goes through the
    table again: armed, then its recorded outcome, or cancelled if none was recorded
    (its outcome was never sent, and hosts that armed it must hear one)."""
    job.number = int(state.get("number", 0))
    job.choice = str(state.get("choice", DEFAULT_CHOICE))
    job.severity = int(state.get("severity", 0))
    job.fingerprint = str(state.get("fingerprint", ""))
    job.withdrawn = bool(state.get("withdrawn", False))
    job.committed = {int(c): (str(ch), int(at)) for c, ch, at in state.get("committed", [])}
    raw = state.get("decision")
    if raw:
        decision = Decision(
            int(raw["number"]), str(raw["choice"]),
            tuple(Activation(int(c), int(at)) for c, at in raw["activations"]),
            frozenset(raw["hosts"]), now)
        job.move(Event.ARM)
        commit = raw.get("commit")
        if commit is None:
            job.move(Event.CANCEL)
            decision.reason = "the controller restarted while arming"
        else:
            job.move(Event.CONFIRM if commit else Event.CANCEL)
            decision.acks = {h: AckPhase(p) for h, p in raw.get("acks", {}).items()
                             if p == AckPhase.RESOLVED.value}
        job.decision = decision
    job.dirty = True
