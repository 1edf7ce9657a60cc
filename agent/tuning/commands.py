"""The tuning domain's operator commands: ``declare``, ``jobs``, ``policy``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from harmonaize.messages import JobDeclaration
from harmonaize.opsocket import Command, CommandError
from harmonaize.schema import SchemaError, from_plain, to_plain

if TYPE_CHECKING:
    from agent.tuning.service import TuningService


class Shell(Protocol):
    tuning: TuningService | None


def service(shell: Shell) -> TuningService:
    if shell.tuning is None:
        raise CommandError("tuning is disabled (tuning.enabled = false)")
    return shell.tuning


def commands(shell: Shell, declared: Callable[[JobDeclaration], None]) -> dict[str, Command]:
    """``declared``: where a declaration goes (the daemon hands it to every domain
    that keeps declarations, as it does one from the controller)."""

    def declare(args: dict[str, Any]) -> dict[str, Any]:
        try:
            declaration = from_plain(JobDeclaration, args.get("declaration"), "declaration")
        except SchemaError as exc:
            raise CommandError(str(exc)) from None
        declared(declaration)
        return to_plain(declaration)

    return {
        "declare": Command(declare, "set a job's declaration on this host", changes=True),
        "jobs": Command(lambda args: service(shell).jobs_view(time.time()),
                        "declared jobs, their tuning choice and why"),
        "policy": Command(lambda args: service(shell).policy_view(args, time.time()),
                          "a job's declaration, policy, reason and history (job)"),
    }
