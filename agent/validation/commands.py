"""The validation domain's operator commands: ``validate``, ``validations``,
``release``, and ``drain`` of one GPU (the host's drain is the host domain's)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from agent.gpu.commands import gpu_views
from harmonaize.opsocket import Command, CommandError

if TYPE_CHECKING:
    from agent.step import HealthStep
    from agent.validation.service import ValidationService


class Shell(Protocol):
    validation: ValidationService | None
    last_step: HealthStep | None


def service(shell: Shell) -> ValidationService:
    if shell.validation is None:
        raise CommandError("validation is disabled (validation.enabled = false)")
    return shell.validation


def commands(shell: Shell) -> dict[str, Command]:
    def validate(args: dict[str, Any]) -> dict[str, Any]:
        return service(shell).command_validate(args, gpu_views(shell.last_step))

    def validations(args: dict[str, Any]) -> dict[str, Any]:
        running = service(shell)
        # Remediation's steps are kept in the same history (agent/remediation).
        return {**running.status(), "history": running.command_history(args),
                "remediation": running.history.remediation_steps(args.get("limit", 50))}

    def release(args: dict[str, Any]) -> dict[str, Any]:
        return service(shell).command_release(args, gpu_views(shell.last_step), time.time())

    return {
        "validate": Command(validate, "validate a GPU (gpu, level) or the host", changes=True),
        "validations": Command(validations, "validation history and what waits"),
        "release": Command(release, "validate a quarantined GPU, release it if it passes "
                           "(force: without validating)", changes=True),
    }


def drain_gpu(shell: Shell, args: dict[str, Any]) -> dict[str, Any]:
    return service(shell).command_drain(args, gpu_views(shell.last_step), time.time())
