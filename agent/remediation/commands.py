"""The remediation domain's operator commands: ``remediation`` (where each GPU stands,
its holds and the latest steps), and ``remediation-cancel``, ``-resume``, ``-clear``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from harmonaize.opsocket import Command, CommandError

if TYPE_CHECKING:
    from agent.remediation.service import RemediationService


class Shell(Protocol):
    remediation: RemediationService | None


def _gpu(args: dict[str, Any]) -> int:
    gpu = args.get("gpu")
    if isinstance(gpu, bool) or not isinstance(gpu, int):
        raise CommandError("gpu must be a GPU index")
    return gpu


def _limit(args: dict[str, Any]) -> int:
    limit = args.get("limit", 20)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise CommandError("limit must be an integer from 1 to 10000")
    return limit


def commands(shell: Shell) -> dict[str, Command]:
    def service() -> RemediationService:
        if shell.remediation is None:
            raise CommandError("remediation is disabled (remediation.enabled = false, "
                               "or validation is off)")
        return shell.remediation

    def status(args: dict[str, Any]) -> dict[str, Any]:
        if shell.remediation is None:
            return {"enabled": False, "gpus": [], "holds": [], "steps": []}
        return shell.remediation.status(_limit(args))

    def operator(verb: str) -> Command:
        def run(args: dict[str, Any]) -> dict[str, Any]:
            try:
                return service().operator(verb, _gpu(args))
            except (KeyError, ValueError) as exc:
                raise CommandError(str(exc).strip("'\"")) from None
        helps = {"cancel": "stop remediating a GPU (gpu)",
                 "resume": "remediate a cancelled GPU again (gpu)",
                 "clear": "clear a GPU's RMA hold (gpu); only an operator can"}
        return Command(run, helps[verb], changes=True)

    return {
        "remediation": Command(status, "GPU remediation: each GPU's phase, holds, steps"),
        "remediation-cancel": operator("cancel"),
        "remediation-resume": operator("resume"),
        "remediation-clear": operator("clear"),
    }
