"""The state-machine table every machine of the house is written in."""

from __future__ import annotations

from enum import StrEnum

import pytest

from harmonaize import statemachine
from harmonaize.statemachine import IllegalTransition, Machine

pytestmark = pytest.mark.architecture


class Light(StrEnum):
    OFF = "off"
    ON = "on"
    BROKEN = "broken"


class Press(StrEnum):
    SWITCH = "switch"
    BREAK = "break"


LIGHT = Machine("light", {
    (Light.OFF, Press.SWITCH): Light.ON,
    (Light.ON, Press.SWITCH): Light.OFF,
    (Light.ON, Press.BREAK): Light.BROKEN,
}, states=tuple(Light), events=tuple(Press))


def test_a_legal_move_goes_where_the_table_says() -> None:
    assert LIGHT.move(Light.OFF, Press.SWITCH) is Light.ON
    assert LIGHT.move(Light.ON, Press.BREAK) is Light.BROKEN
    assert LIGHT.events_from(Light.ON) == {Press.SWITCH, Press.BREAK}
    assert LIGHT.events_from(Light.BROKEN) == frozenset()


def test_an_illegal_move_raises_under_test() -> None:
    with pytest.raises(IllegalTransition, match="light: no move from"):
        LIGHT.move(Light.BROKEN, Press.SWITCH)


def test_an_illegal_move_in_production_is_counted_and_leaves_the_state(caplog) -> None:
    statemachine.set_strict(False)
    try:
        before = statemachine.illegal_counts().get("light", 0)
        assert LIGHT.move(Light.OFF, Press.BREAK) is Light.OFF
        assert LIGHT.move(Light.OFF, Press.BREAK) is Light.OFF
        assert statemachine.illegal_counts()["light"] == before + 2
        # logged once per kind of move, in one line
        lines = [r.getMessage() for r in caplog.records if "light" in r.getMessage()]
        assert len(lines) == 1 and "\n" not in lines[0]
    finally:
        statemachine.set_strict(True)


def test_a_move_to_a_state_the_machine_does_not_declare_is_refused_at_import() -> None:
    with pytest.raises(ValueError, match="undeclared state"):
        Machine("bad", {(Light.OFF, Press.SWITCH): "on?"}, states=tuple(Light),
                events=tuple(Press))
    with pytest.raises(ValueError, match="undeclared event"):
        Machine("bad", {(Light.OFF, "kick"): Light.ON}, states=tuple(Light),
                events=tuple(Press))


def test_every_pair_is_either_a_move_or_refused() -> None:
    for state, event in LIGHT.pairs():
        if LIGHT.legal(state, event):
            assert LIGHT.move(state, event) in tuple(Light)
        else:
            with pytest.raises(IllegalTransition):
                LIGHT.move(state, event)
