"""The drain reasons we write: ``hz: `` then the most severe holds first, kept short.

Slurm shows them in ``sinfo -R`` and keeps them across its restarts; the prefix is how
we know a reason is ours. What follows comes partly from an agent (a hold's detail), so
only a plain character set survives and the whole is cut to :data:`MAX_REASON`.
"""

from __future__ import annotations

import re

from controller.scheduler.types import OURS
from harmonaize.messages import Hold, HoldKind

#: Characters of a reason (long ones clutter sinfo -R; Slurm appends [user@time]).
MAX_REASON = 100
#: Most severe first: the first hold is the one an operator reads.
SEVERITY = (HoldKind.RMA, HoldKind.REBOOT, HoldKind.GPU_LOST, HoldKind.GPU_QUARANTINED,
            HoldKind.VALIDATION_FAILED, HoldKind.CONDITION, HoldKind.DRAINED)
_UNSAFE = re.compile(r"[^A-Za-z0-9 _.:,;+/()-]+")


def clean(text: str) -> str:
    """Only characters that mean nothing to scontrol, a shell or sinfo's columns."""
    return " ".join(_UNSAFE.sub(" ", text).split())


def phrase(hold: Hold) -> str:
    detail = clean(hold.detail)[:40]
    if detail == "none":  # a GPU's recommended action when there is none
        detail = ""
    gpu = f"gpu {hold.gpu}" if hold.gpu >= 0 else ""
    match hold.kind:
        case HoldKind.RMA:
            words = f"{gpu or 'host'} rma"
        case HoldKind.REBOOT:
            words = "reboot" + (f": {gpu}" if gpu else "")
        case HoldKind.GPU_LOST:
            words = f"{gpu or 'gpu'} lost"
        case HoldKind.GPU_QUARANTINED:
            words = f"{gpu or 'gpu'} quarantined" + (f": {detail}" if detail else "")
        case HoldKind.VALIDATION_FAILED:
            words = "validation failed"
        case HoldKind.CONDITION:
            words = "condition" + (f" {detail}" if detail else "")
        case _:
            words = "drained by operator"
    # The kinds above that did not place the detail in their words take it as a suffix.
    if detail and hold.kind in (HoldKind.VALIDATION_FAILED, HoldKind.DRAINED,
                                HoldKind.GPU_LOST):
        words += f": {detail}"
    return words


def reason_of(holds: tuple[Hold, ...]) -> str:
    """``hz: gpu 2 quarantined: reset-gpu`` (several holds: the most severe first)."""
    ordered = sorted(holds, key=lambda h: (SEVERITY.index(h.kind), h.gpu))
    phrases: list[str] = []
    for hold in ordered:
        words = phrase(hold)
        if words not in phrases:
            phrases.append(words)
    text = f"{OURS} {phrases[0]}" if phrases else OURS
    for shown, words in enumerate(phrases[1:], 1):
        more = f" (+{len(phrases) - shown} more)"
        if len(text) + 2 + len(words) + len(more) > MAX_REASON:
            text += more
            break
        text += f"; {words}"
    return text[:MAX_REASON]
