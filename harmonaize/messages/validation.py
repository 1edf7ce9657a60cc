"""Validation pauses: the notice a job gets before a member pauses for hardware
validation, the tenant's answer, and the decision the controller passes to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from harmonaize.maintenancetables import ValidationCause
from harmonaize.messages.core import (
    Category,
    Message,
    message,
)
from harmonaize.schema import (
    Ident,
    Len,
    Name,
    Num,
    Seconds,
    Timestamp,
)


class NoticeStatus(StrEnum):
    """Where a validation notice stands (after Azure Scheduled Events' ``EventStatus``)."""

    SCHEDULED = "scheduled"  # it starts at not_before, unless approved earlier or deferred
    STARTED = "started"      # the pause has begun (not_before came, or every job approved)
    CANCELLED = "cancelled"  # it will not happen as announced (a new notice comes if it does)


@message("validation-notice", Category.EVENT)
@dataclass(frozen=True)
class ValidationNotice(Message):
    """A member of the job will pause for validation: when and for how long, nothing else.

    From an agent, ``id`` is the agent's own name for the planned validation; the
    controller gives the tenant a notice id of its own and rebuilds every other field.
    A notice is sent again, with the same id, whenever its status or start moves.
    """

    #: The job, as the provider's scheduler named it.
    job: Ident
    #: The job's members (ranks, as its launcher named them) on the hardware that pauses.
    members: Annotated[tuple[Ident, ...], Len(1024)]
    #: The longest the pause can last, never more than the job's max_validation_pause.
    pause_seconds: Annotated[int, Num(0, 86400)]
    #: The same instant as ``not_before`` (the name before notices could be answered).
    starts_at: Timestamp
    #: The notice's id, to answer it with (the same on every update of one notice).
    id: Name = ""
    #: The pause starts no earlier than this (Unix time), unless the tenant approves it.
    not_before: Timestamp = 0.0
    status: NoticeStatus = NoticeStatus.SCHEDULED
    #: Seconds the tenant may still defer it by (0: it cannot be deferred, or was already).
    defer_seconds: Seconds = 0.0
    #: The condition behind it, which bounds how long it may wait (a negotiated window
    #: starts within the bound; see "Negotiating capacity and maintenance").
    cause: ValidationCause = ValidationCause.ROUTINE


class NoticeAction(StrEnum):
    APPROVE = "approve"  # start now: the job is ready (checkpointed, drained)
    DEFER = "defer"      # start later, by up to the declared max_validation_defer


@message("validation-answer", Category.CONTROL)
@dataclass(frozen=True)
class ValidationAnswer(Message):
    """A tenant's answer to one of its validation notices (by the notice's ``id``)."""

    #: The notice's ``id``.
    notice: Ident
    action: NoticeAction
    #: For ``defer``: seconds to defer by; 0 asks for all the declaration allows.
    seconds: Seconds = 0.0


@message("validation-decision", Category.CONTROL)
@dataclass(frozen=True)
class ValidationDecision(Message):
    """A tenant's answer to a validation notice, for the host that planned it:
    ``notice`` is the host's own id of the plan. ``approve`` lets it start now (once
    every job on the device has approved); ``defer`` pushes its start back by that
    many seconds (once per job, within the job's declared ``max_validation_defer``,
    which the host checks again); ``start`` is the window the tenant and the provider
    agreed on in a maintenance negotiation (Unix time; the host checks it against its
    condition's bound)."""

    notice: Ident
    job: Ident
    approve: bool = False
    defer: Seconds = 0.0
    #: The agreed start of the pause (Unix time; 0: none agreed).
    start: Timestamp = 0.0
