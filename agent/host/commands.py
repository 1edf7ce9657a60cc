"""The host domain's operator commands: ``drain`` and ``undrain`` (the whole host,
or with ``gpu`` one GPU, which is validation's: the daemon hands its drain in)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from harmonaize.opsocket import Command, CommandError


class Shell(Protocol):
    drained: str | None


def commands(shell: Shell, step_now: Callable[[], None],
             drain_gpu: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Command]:
    """``step_now``: run a pass at once, so the summary the controller gets (and
    the answer) already says the host is (un)drained. ``drain_gpu``: validation's
    drain of one GPU."""

    def drain(args: dict[str, Any]) -> dict[str, Any]:
        if args.get("gpu") is not None:
            result = drain_gpu(args)
            step_now()
            return result
        reason = args.get("reason", "drained by operator")
        if not isinstance(reason, str) or len(reason) > 200:
            raise CommandError("reason must be a string of at most 200 characters")
        shell.drained = reason or "drained by operator"
        step_now()
        return {"schedulable": False, "reason": shell.drained}

    def undrain(args: dict[str, Any]) -> dict[str, Any]:
        shell.drained = None
        step_now()
        return {"schedulable": True}

    return {
        "drain": Command(drain, "withdraw this host from capacity", changes=True),
        "undrain": Command(undrain, "return this host to capacity", changes=True),
    }
