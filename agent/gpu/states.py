"""A GPU's health states and the events that move them: the one table of legal moves.

    healthy -> suspect -> validating -> healthy | quarantined        (and lost)

The health engine (:mod:`agent.gpu.health`) sends the events its rules decide on;
validation and operators send theirs through the engine's hooks. Nobody assigns a
state: :data:`GPU` says where each event leads, and a move it does not hold raises
under test and is counted in production (:mod:`harmonaize.statemachine`).

Some events are legal from every state, on purpose: a validation's verdict or an
operator's word speaks for the GPU whatever happened to it while the check ran or the
command was typed (a drain during a validation, a fault found mid-check), and a
quarantine recorded before a restart applies to the GPU as it is found. The rules'
own events are narrower: a quarantine or a loss is latched until released, and a
GPU under validation is not made suspect by the signals its own checks provoke, so
the engine does not send those events from there.
"""

from __future__ import annotations

from enum import StrEnum

from harmonaize.statemachine import Machine


class GpuState(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    VALIDATING = "validating"
    QUARANTINED = "quarantined"
    LOST = "lost"


class GpuEvent(StrEnum):
    # The health engine's rules (a finding that started after the last acknowledgement).
    FELL_OFF = "a finding says the GPU is lost"
    FAULT = "a finding asks for quarantine"
    SUSPECT_SIGNAL = "a finding makes the GPU suspect"
    SUSPICION_CLEARED = "no suspect signal for suspect_clear seconds"
    # Validation (agent.validation).
    VALIDATION_STARTED = "validation started"
    VALIDATION_PASSED = "validation passed"
    VALIDATION_FAILED = "validation failed"
    UNDECIDED_WAS_HEALTHY = "validation undecided, healthy before"
    UNDECIDED_WAS_SUSPECT = "validation undecided, suspect before"
    UNDECIDED_WAS_QUARANTINED = "validation undecided, quarantined before"
    UNDECIDED_WAS_LOST = "validation undecided, lost before"
    QUARANTINE_RESTORED = "a quarantine recorded before this start"
    # Operators (harmonctl drain --gpu, harmonctl release --force).
    OPERATOR_DRAIN = "operator drain"
    OPERATOR_RELEASE = "operator release"


#: An undecided validation puts the GPU back where it was before it began.
UNDECIDED = {
    GpuState.HEALTHY: GpuEvent.UNDECIDED_WAS_HEALTHY,
    GpuState.SUSPECT: GpuEvent.UNDECIDED_WAS_SUSPECT,
    GpuState.QUARANTINED: GpuEvent.UNDECIDED_WAS_QUARANTINED,
    GpuState.LOST: GpuEvent.UNDECIDED_WAS_LOST,
}

_ALL = tuple(GpuState)
H, S, V, Q, L = (GpuState.HEALTHY, GpuState.SUSPECT, GpuState.VALIDATING,
                 GpuState.QUARANTINED, GpuState.LOST)


def moves() -> dict[tuple[GpuState, GpuEvent], GpuState]:
    """The table: (state, event) -> the state the event leads to."""
    return {
        # A loss is news in every state (a quarantined GPU can still fall off the bus).
        **{(state, GpuEvent.FELL_OFF): L for state in _ALL},
        # Quarantine and loss are latched: the rules quarantine only what is in service.
        **{(state, GpuEvent.FAULT): Q for state in (H, S, V)},
        # A suspect GPU stays suspect (with the newest reason) while signals come.
        (H, GpuEvent.SUSPECT_SIGNAL): S,
        (S, GpuEvent.SUSPECT_SIGNAL): S,
        (S, GpuEvent.SUSPICION_CLEARED): H,
        # Validation: started from any state (an operator or remediation may ask for any GPU).
        **{(state, GpuEvent.VALIDATION_STARTED): V for state in _ALL},
        # A verdict speaks for the GPU whatever happened while the checks ran.
        **{(state, GpuEvent.VALIDATION_PASSED): H for state in _ALL},
        **{(state, GpuEvent.VALIDATION_FAILED): Q for state in _ALL},
        **{(V, event): before for before, event in UNDECIDED.items()},
        **{(state, GpuEvent.QUARANTINE_RESTORED): Q for state in _ALL},
        # An operator's word: the command checked the state the operator saw, which may be
        # a pass old by the time it lands.
        **{(state, GpuEvent.OPERATOR_DRAIN): Q for state in _ALL},
        **{(state, GpuEvent.OPERATOR_RELEASE): H for state in _ALL},
    }


GPU: Machine[GpuState, GpuEvent] = Machine("gpu", moves(), states=_ALL, events=tuple(GpuEvent))
