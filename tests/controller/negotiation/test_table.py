"""The negotiation's table itself: every open state can expire, no final state moves,
and every state is reachable from a proposal."""

from __future__ import annotations

import pytest

from controller.negotiation.maintenance import MAINTENANCE, MEvent, MState
from controller.negotiation.table import FINAL, NEGOTIATION, OPEN, Event
from controller.negotiation.types import State
from harmonaize.statemachine import IllegalTransition

pytestmark = pytest.mark.negotiation


def test_every_open_state_expires_and_no_final_state_moves() -> None:
    for state in OPEN:
        assert NEGOTIATION.legal(state, Event.EXPIRE), state
    for state in FINAL:
        assert NEGOTIATION.events_from(state) == frozenset(), state
        with pytest.raises(IllegalTransition):
            NEGOTIATION.move(state, Event.ACCEPT)
    assert MAINTENANCE.legal(MState.PROPOSED, MEvent.EXPIRE)
    assert all(not MAINTENANCE.events_from(s) for s in MState if s is not MState.PROPOSED)


def test_every_state_is_reachable_from_a_proposal() -> None:
    seen, todo = {State.PROPOSED}, [State.PROPOSED]
    while todo:
        state = todo.pop()
        for event in NEGOTIATION.events_from(state):
            target = NEGOTIATION.move(state, event)
            if target not in seen:
                seen.add(target)
                todo.append(target)
    assert seen == set(State)
