"""The scheduler's table: every cell, and how a node's situation and a host's want are read."""

from __future__ import annotations

import pytest

from controller.scheduler.table import TABLE, Situation, situation
from controller.scheduler.types import Node
from tests.controller.scheduler.test_engine import MINE, S, V, W, _node

pytestmark = pytest.mark.scheduler


# --- the table: every cell, and how a node's situation is read ---------------------------


def test_the_table_says_what_each_situation_and_want_gets() -> None:
    assert TABLE == {
        (S.FREE, W.HOLD): V.DRAIN, (S.FREE, W.REBOOT): V.REBOOT,
        (S.FREE, W.FREE): V.NOTHING, (S.FREE, W.NONE): V.NOTHING,
        (S.OURS, W.HOLD): V.REDRAIN, (S.OURS, W.REBOOT): V.REBOOT,
        (S.OURS, W.FREE): V.RESUME, (S.OURS, W.NONE): V.NOTHING,
        (S.EDITED, W.HOLD): V.LEAVE, (S.EDITED, W.REBOOT): V.LEAVE,
        (S.EDITED, W.FREE): V.LEAVE, (S.EDITED, W.NONE): V.LEAVE,
        (S.THEIRS, W.HOLD): V.LEAVE, (S.THEIRS, W.REBOOT): V.LEAVE,
        (S.THEIRS, W.FREE): V.NOTHING, (S.THEIRS, W.NONE): V.NOTHING,
        (S.REBOOTING, W.HOLD): V.NOTHING, (S.REBOOTING, W.REBOOT): V.NOTHING,
        (S.REBOOTING, W.FREE): V.NOTHING, (S.REBOOTING, W.NONE): V.NOTHING,
    }


@pytest.mark.parametrize(("node", "written", "disowned", "expected"), [
    (_node("n", "IDLE", "DRAIN", "REBOOT_REQUESTED", reason=MINE), MINE, True, S.REBOOTING),
    (_node("n", "REBOOT_ISSUED"), None, False, S.REBOOTING),
    (_node("n", "IDLE"), MINE, False, S.FREE),
    (_node("n", "DOWN", reason="Not responding"), None, False, S.THEIRS),
    (_node("n", "FAIL", reason="bad psu"), None, False, S.THEIRS),
    (_node("n", "DOWN"), None, False, S.FREE),  # down with no reason: nothing to keep
    (_node("n", "DOWN", reason=MINE), None, False, S.FREE),
    (_node("n", "IDLE", reason="stale text"), None, False, S.FREE),
    (_node("n", "IDLE", "DRAIN", reason=MINE), MINE, True, S.THEIRS),
    (_node("n", "IDLE", "DRAIN", reason=MINE), MINE, False, S.OURS),
    (_node("n", "IDLE", "DRAIN", reason=MINE), None, False, S.OURS),  # records lost
    (_node("n", "IDLE", "DRAIN", reason=MINE + " : reboot issued"), MINE, False, S.OURS),
    (_node("n", "IDLE", "DRAIN", reason=MINE + "x"), MINE, False, S.EDITED),
    (_node("n", "IDLE", "DRAIN", reason="hz: gpu 5 rma"), MINE, False, S.EDITED),
    (_node("n", "IDLE", "DRAIN", reason="bad fan"), MINE, False, S.EDITED),
    (_node("n", "IDLE", "DRAIN", reason="bad fan"), None, False, S.THEIRS),
])
def test_a_nodes_situation_is_read_from_its_flags_reason_and_our_record(
        node: Node, written: str | None, disowned: bool, expected: Situation) -> None:
    assert situation(node, written, disowned=disowned) is expected
