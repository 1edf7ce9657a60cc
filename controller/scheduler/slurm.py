"""The Slurm backend: ``scontrol``, each call under a timeout, never on the event loop's
time (a subprocess awaited; a hung one is killed).

Reads: ``scontrol -o show node`` (one line per node) and ``scontrol -o show
reservation``. Writes: ``update nodename=N state=drain|resume``, ``reboot ASAP
nextstate=RESUME``, ``create``/``delete`` of a maintenance reservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

from controller.scheduler.backend import SchedulerError
from controller.scheduler.types import Node
from harmonaize.logs import one_line

#: Bytes of scontrol's output read at most (a cluster of thousands of nodes fits).
MAX_OUTPUT = 64 * 1024 * 1024
_FIELD = re.compile(r"(?:^|\s)([A-Za-z]+)=(\S*)")
#: Slurm appends " [user@time]" to a reason it shows.
_REASON = re.compile(r"\sReason=(.*?)(?:\s\[[^\]\s]*@[^\]\s]*\])?\s*$")


def parse_nodes(text: str) -> tuple[Node, ...]:
    """``scontrol -o show node`` as nodes; a line without a NodeName is skipped."""
    nodes = []
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line))
        name = fields.get("NodeName")
        if not name:
            continue
        state = fields.get("State", "")
        flags = set(state.rstrip("*~#!%$@^-").split("+")) - {""}
        if state.endswith("*"):
            flags.add("NOT_RESPONDING")
        reason = ""
        match = _REASON.search(line)
        if match is not None and match.group(1) != "(null)":
            reason = match.group(1).strip()
        parts = fields.get("Partitions", "")
        nodes.append(Node(name, frozenset(flags), reason,
                          tuple(p for p in parts.split(",") if p and p != "(null)")))
    return tuple(nodes)


def parse_reservations(text: str) -> frozenset[str]:
    return frozenset(m.group(1) for m in re.finditer(r"ReservationName=(\S+)", text))


class SlurmBackend:
    def __init__(self, scontrol: str = "scontrol", timeout: float = 5.0) -> None:
        self.scontrol = scontrol
        self.timeout = timeout

    async def _run(self, *args: str) -> str:
        what = " ".join(args[:3])
        try:
            proc = await asyncio.create_subprocess_exec(
                self.scontrol, *args, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            raise SchedulerError(f"scontrol {what}: cannot run {self.scontrol}: "
                                 f"{one_line(exc)}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await proc.wait()
            raise SchedulerError(f"scontrol {what}: no answer within {self.timeout:g} s "
                                 "(killed)") from None
        if proc.returncode != 0:
            said = " ".join((err or out).decode(errors="replace").split())[:200]
            raise SchedulerError(f"scontrol {what}: exit {proc.returncode}: {said}")
        return out[:MAX_OUTPUT].decode(errors="replace")

    async def nodes(self) -> tuple[Node, ...]:
        return parse_nodes(await self._run("-o", "show", "node"))

    async def reservations(self) -> frozenset[str]:
        return parse_reservations(await self._run("-o", "show", "reservation"))

    async def drain(self, node: str, reason: str) -> None:
        await self._run("update", f"nodename={node}", "state=drain", f"reason={reason}")

    async def resume(self, node: str) -> None:
        await self._run("update", f"nodename={node}", "state=resume")

    async def reboot(self, node: str, reason: str) -> None:
        await self._run("reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", node)

    async def reserve(self, node: str, name: str, minutes: int) -> None:
        await self._run("create", "reservation", f"reservationname={name}", f"nodes={node}",
                        "starttime=now", f"duration={minutes}", "flags=maint,ignore_jobs",
                        "users=root")

    async def unreserve(self, name: str) -> None:
        await self._run("delete", f"reservationname={name}")
