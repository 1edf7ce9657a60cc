"""The scheduler loop's state machine, in one table.

A node is in one :class:`Situation` (what the scheduler shows, read against what we
wrote), the host behind it in one :class:`Want`; the pair gives one :class:`Verdict`.
Everything the engine does to a node comes from :data:`TABLE`.
"""

from __future__ import annotations

from enum import StrEnum

from controller.scheduler.types import OURS, Node


class Situation(StrEnum):
    FREE = "free"            # not drained (nor down for someone else's reason)
    OURS = "ours"            # drained with the reason we wrote (or an hz: one we forgot)
    EDITED = "edited"        # we drained it, then someone changed the reason: theirs now
    THEIRS = "theirs"        # drained, or down with a reason, by someone else
    REBOOTING = "rebooting"  # a reboot is pending: the scheduler owns it until it is back


class Want(StrEnum):
    HOLD = "hold"      # the host has holds: no new work
    REBOOT = "reboot"  # ... and one of them asks for a reboot we have not asked for yet
    FREE = "free"      # the host has no hold
    NONE = "none"      # no opinion: the host is silent, or unknown


class Verdict(StrEnum):
    NOTHING = "nothing"
    DRAIN = "drain"      # take it out (the breaker may hold it)
    REDRAIN = "redrain"  # already ours: write the new reason (the holds changed)
    REBOOT = "reboot"    # ask the scheduler to reboot it when idle (the breaker may hold it)
    RESUME = "resume"
    LEAVE = "leave"      # not ours: say so once, touch nothing


TABLE: dict[tuple[Situation, Want], Verdict] = {
    (Situation.FREE, Want.HOLD): Verdict.DRAIN,
    (Situation.FREE, Want.REBOOT): Verdict.REBOOT,
    (Situation.FREE, Want.FREE): Verdict.NOTHING,
    (Situation.FREE, Want.NONE): Verdict.NOTHING,
    (Situation.OURS, Want.HOLD): Verdict.REDRAIN,  # a no-op where the reason is the same
    (Situation.OURS, Want.REBOOT): Verdict.REBOOT,
    (Situation.OURS, Want.FREE): Verdict.RESUME,
    # A silent host: the scheduler sees a dead slurmd itself; we neither drain nor
    # resume on silence alone.
    (Situation.OURS, Want.NONE): Verdict.NOTHING,
    (Situation.EDITED, Want.HOLD): Verdict.LEAVE,
    (Situation.EDITED, Want.REBOOT): Verdict.LEAVE,
    (Situation.EDITED, Want.FREE): Verdict.LEAVE,
    (Situation.EDITED, Want.NONE): Verdict.LEAVE,
    (Situation.THEIRS, Want.HOLD): Verdict.LEAVE,
    (Situation.THEIRS, Want.REBOOT): Verdict.LEAVE,
    (Situation.THEIRS, Want.FREE): Verdict.NOTHING,
    (Situation.THEIRS, Want.NONE): Verdict.NOTHING,
    (Situation.REBOOTING, Want.HOLD): Verdict.NOTHING,
    (Situation.REBOOTING, Want.REBOOT): Verdict.NOTHING,
    (Situation.REBOOTING, Want.FREE): Verdict.NOTHING,
    (Situation.REBOOTING, Want.NONE): Verdict.NOTHING,
}


def situation(node: Node, written: str | None, *, disowned: bool = False) -> Situation:
    """``written``: the reason we last wrote on this node, None if we wrote none;
    ``disowned``: its reason was edited by hand since (theirs until it is resumed)."""
    if node.rebooting:
        return Situation.REBOOTING
    if not node.drained:
        # Down or failed with a reason (Slurm's "Not responding", an operator's
        # state=down): drain would overwrite that reason, so it is theirs.
        if node.flags & {"DOWN", "FAIL"} and node.reason and not node.reason.startswith(OURS):
            return Situation.THEIRS
        return Situation.FREE
    if disowned:
        return Situation.THEIRS
    if node.reason.startswith(OURS):
        # Ours if it is what we wrote; an hz: reason we have no record of is one we
        # wrote before our records were lost. Anything else was typed by someone.
        mine = written is None or node.reason == written or \
            node.reason.startswith(written + " : ")  # Slurm's own ": reboot issued"
        return Situation.OURS if mine else Situation.EDITED
    return Situation.EDITED if written is not None else Situation.THEIRS
