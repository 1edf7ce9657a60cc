"""The remediation table is a machine of harmonaize.statemachine: every move off it is
refused, and nothing is persisted for a refused move."""

from __future__ import annotations

import pytest

from agent.remediation.engine import REMEDIATION, TRANSITIONS, RemediationEngine
from agent.remediation.types import Phase, Record, Settings

pytestmark = [pytest.mark.scheduler, pytest.mark.architecture]


def test_the_remediation_table_is_a_machine_and_every_move_off_it_is_refused() -> None:
    assert dict(REMEDIATION.moves) == TRANSITIONS
    assert set(REMEDIATION.states) == {None, *Phase}
    refused = 0
    for phase, event in REMEDIATION.pairs():
        engine = RemediationEngine(Settings(), [] if phase is None
                                   else [Record("GPU-2", 2, phase)])
        if REMEDIATION.legal(phase, event):
            moved = engine._move("GPU-2", event, gpu=2)
            assert (moved.phase if moved else None) is TRANSITIONS[(phase, event)]
        else:
            refused += 1
            with pytest.raises(ValueError, match="remediation: no move from"):
                engine._move("GPU-2", event, gpu=2)
            assert engine.changed == set()  # refused: nothing to persist
    assert refused == len(REMEDIATION.states) * len(REMEDIATION.events) - len(TRANSITIONS)
