"""The reasons we write into Slurm: their exact words, order, cleaning and cut."""

from __future__ import annotations

import pytest

from controller.scheduler.reasons import clean, phrase, reason_of
from harmonaize.messages import Hold, HoldKind

pytestmark = pytest.mark.scheduler


# --- reasons: the exact words, their order, their cleaning and their cut ---------------


def test_reason_cleaning_keeps_only_plain_characters_and_single_spaces() -> None:
    assert clean("  a\n[b@c]\t\"x\"  ") == "a b c x"
    assert clean("A-z 0_9.:,;+/()-") == "A-z 0_9.:,;+/()-"
    assert clean("") == ""


@pytest.mark.parametrize(("hold", "words"), [
    (Hold(HoldKind.RMA, 5, "ignored"), "gpu 5 rma"),
    (Hold(HoldKind.RMA, -1, ""), "host rma"),
    (Hold(HoldKind.REBOOT, -1, "3 resets failed"), "reboot"),
    (Hold(HoldKind.REBOOT, 0, ""), "reboot: gpu 0"),
    (Hold(HoldKind.GPU_LOST, -1, ""), "gpu lost"),
    (Hold(HoldKind.GPU_LOST, 7, "fell off the bus"), "gpu 7 lost: fell off the bus"),
    (Hold(HoldKind.GPU_QUARANTINED, -1, ""), "gpu quarantined"),
    (Hold(HoldKind.GPU_QUARANTINED, 0, "none"), "gpu 0 quarantined"),
    (Hold(HoldKind.GPU_QUARANTINED, 2, "reset-gpu"), "gpu 2 quarantined: reset-gpu"),
    (Hold(HoldKind.VALIDATION_FAILED, -1, ""), "validation failed"),
    (Hold(HoldKind.VALIDATION_FAILED, 1, "nvlink"), "validation failed: nvlink"),
    (Hold(HoldKind.CONDITION, -1, ""), "condition"),
    (Hold(HoldKind.CONDITION, 3, "Xid79"), "condition Xid79"),
    (Hold(HoldKind.DRAINED, -1, ""), "drained by operator"),
    (Hold(HoldKind.DRAINED, -1, "none"), "drained by operator"),
    (Hold(HoldKind.DRAINED, -1, "fan swap"), "drained by operator: fan swap"),
])
def test_each_hold_kind_has_its_own_words(hold: Hold, words: str) -> None:
    assert phrase(hold) == words
    assert reason_of((hold,)) == f"hz: {words}"


def test_a_holds_detail_is_cleaned_then_cut_to_forty_characters() -> None:
    assert phrase(Hold(HoldKind.DRAINED, -1, "[" + "x" * 50)) == (
        "drained by operator: " + "x" * 40)
    assert phrase(Hold(HoldKind.CONDITION, -1, "y" * 41)) == "condition " + "y" * 40


def test_no_hold_is_our_bare_prefix() -> None:
    assert reason_of(()) == "hz:"


def test_reasons_go_most_severe_first_then_by_gpu_and_say_each_once() -> None:
    holds = (Hold(HoldKind.DRAINED, -1, ""),
             Hold(HoldKind.GPU_QUARANTINED, 3, ""), Hold(HoldKind.GPU_QUARANTINED, 1, ""),
             Hold(HoldKind.GPU_QUARANTINED, 3, ""), Hold(HoldKind.GPU_LOST, 4, ""),
             Hold(HoldKind.RMA, 6, ""))
    assert reason_of(holds) == ("hz: gpu 6 rma; gpu 4 lost; gpu 1 quarantined; "
                                "gpu 3 quarantined; drained by operator")
    assert reason_of((Hold(HoldKind.VALIDATION_FAILED), Hold(HoldKind.REBOOT))) == (
        "hz: reboot; validation failed")


def test_a_long_reason_fits_exactly_or_says_how_many_more() -> None:
    # 100 characters with room for "(+1 more)": the second phrase is written whole.
    fits = (Hold(HoldKind.DRAINED, -1, "a" * 13), Hold(HoldKind.CONDITION, -1, "b" * 40))
    assert reason_of(fits) == "hz: condition " + "b" * 40 + "; drained by operator: " + "a" * 13
    # One character more: the count of what is left out instead.
    over = (Hold(HoldKind.DRAINED, -1, "a" * 14), Hold(HoldKind.CONDITION, -1, "b" * 40))
    assert reason_of(over) == "hz: condition " + "b" * 40 + " (+1 more)"
    many = tuple(Hold(HoldKind.CONDITION, -1, f"{i}" + "c" * 30) for i in range(5))
    assert reason_of(many) == ("hz: condition 0" + "c" * 30 + "; condition 1" + "c" * 30
                               + " (+3 more)")
