"""The validation domain's operator commands: ``validate``, ``validations``,
``release``, and ``drain`` of one GPU (the host's drain is the host domain's, which
the daemon hands :func:`drain_gpu`).

The daemon (composition) hands in the GPUs as the last pass saw them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from agent.gpu.interface import GpuView
from harmonaize.opsocket import Command, CommandError

if TYPE_CHECKING:
    from agent.validation.service import ValidationService

#: The GPUs as the last pass saw them.
Views = Callable[[], tuple[GpuView, ...]]


class Shell(Protocol):
    validation: ValidationService | None


def service(shell: Shell) -> ValidationService:
    if shell.validation is None:
        raise CommandError("validation is disabled (validation.enabled = false)")
    return shell.validation


def commands(shell: Shell, views: Views) -> dict[str, Command]:
    def validate(args: dict[str, Any]) -> dict[str, Any]:
        return service(shell).command_validate(args, views())

    def validations(args: dict[str, Any]) -> dict[str, Any]:
        running = service(shell)
        # Remediation's steps are kept in the same history (agent/remediation).
        return {**running.status(), "history": running.command_history(args),
                "remediation": running.history.remediation_steps(args.get("limit", 50))}

    def release(args: dict[str, Any]) -> dict[str, Any]:
        return service(shell).command_release(args, views(), time.time())

    return {
        "validate": Command(validate, "validate a GPU (gpu, level) or the host", changes=True),
        "validations": Command(validations, "validation history and what waits"),
        "release": Command(release, "validate a quarantined GPU, release it if it passes "
                           "(force: without validating)", changes=True),
    }


def drain_gpu(shell: Shell, views: Views, args: dict[str, Any]) -> dict[str, Any]:
    return service(shell).command_drain(args, views(), time.time())
