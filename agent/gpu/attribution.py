"""Whose fault an XID is: the GPU's (hardware) or the job's own process's (application).

Sans-I/O: the observer hands in what it saw (each GPU's processes and their jobs, the
processes /proc shows exiting, the kernel's XID lines); NVML's XID events are decided
here. Time is a parameter.

The rules, in order (``docs/operator-guide.md``, "XID attribution"):

1. An XID the catalog gives only hardware causes is the hardware's, always; so is one
   no fault class (:data:`agent.gpu.xid.FAULTS`) could tell a job's owner of.
2. Otherwise the XID must be tied to one job's process on that GPU:
   a. the kernel's line for it (same GPU by PCI address, same XID, within
      ``match_window``) names the pid of a job's process on that GPU (now, or gone
      within ``teardown_window``); a line naming another pid is doubt;
   b. a teardown: a job's process on that GPU is exiting or a zombie, or left the GPU
      within ``teardown_window`` before the XID (XID 45 then is the cleanup of its
      context);
   c. (application-likely XIDs only) the GPU runs one job's processes and nothing else.
   Ties to more than one job are doubt.
3. A tied XID that recurred on this GPU within ``recur_window`` tied to a *different*
   job is the hardware's: two jobs do not make the same fault on one GPU by chance.
4. Doubt is the hardware's: the catalog's effect, at least SUSPECT.

An application-likely XID without a kernel line waits up to ``kmsg_wait`` for it (the
driver's line and NVML's event are not ordered); a hardware one is decided at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial

from agent.gpu.types import JobRef
from agent.gpu.xid import FAULTS, Attribution, Effect, XidInfo, lookup
from agent.kernel.kmsgformat import KernelXid, PciKey

#: Kernel lines and departed processes kept, at most (a tenant's churn is bounded here).
MAX_LINES = 256
MAX_GONE = 1024
#: XIDs waiting for their kernel line, at most: past it the oldest is judged at once
#: (a job that floods its GPU with faults costs the agent no more than this).
MAX_PENDING = 1024


class Verdict(StrEnum):
    HARDWARE = "hardware"
    APPLICATION = "application"


@dataclass(frozen=True)
class AttributionSettings:
    #: Seconds an application-likely XID waits for its kernel line.
    kmsg_wait: float = 2.0
    #: Seconds between an XID and its kernel line for them to match.
    match_window: float = 10.0
    #: Seconds before an XID in which a job's process leaving its GPU makes a teardown.
    teardown_window: float = 5.0
    #: Seconds in which the same XID on one GPU under a different job is the hardware's.
    recur_window: float = 3600.0


@dataclass(frozen=True)
class Attributed:
    gpu: int
    xid: int
    at: float
    verdict: Verdict
    why: str
    #: What the XID does to the GPU's health (NONE for the application's).
    effect: Effect
    job: str | None = None
    ranks: tuple[str, ...] = ()
    teardown: bool = False
    pid: int | None = None


@dataclass
class _Gpu:
    pci: PciKey | None = None
    pids: dict[int, JobRef | None] = field(default_factory=dict)
    exiting: frozenset[int] = frozenset()
    #: Processes that left the GPU: pid -> (its job, when it was last seen).
    gone: dict[int, tuple[JobRef | None, float]] = field(default_factory=dict)
    #: Recent decided XIDs tied to a job: (xid, job, when).
    tied: deque[tuple[int, str, float]] = field(default_factory=partial(deque, maxlen=64))


@dataclass
class _Pending:
    gpu: int
    xid: int
    at: float
    #: Processes ending at the XID (the observer reads that only with an XID to judge).
    exiting: frozenset[int] = frozenset()


class XidAttributor:
    def __init__(self, settings: AttributionSettings | None = None) -> None:
        self.settings = settings or AttributionSettings()
        self.gpus: dict[int, _Gpu] = {}
        self.lines: deque[tuple[KernelXid, float]] = deque(maxlen=MAX_LINES)
        self.pending: list[_Pending] = []

    # --- what the observer saw ----------------------------------------------------------

    def observe(self, gpu: int, pci: PciKey | None, pids: Mapping[int, JobRef | None],
                exiting: Iterable[int], now: float, *, listed: bool = True) -> None:
        """The GPU's processes now (pid -> its job); ``listed`` False: NVML could not
        list them (nothing is then known to have left)."""
        state = self.gpus.setdefault(gpu, _Gpu())
        state.pci = pci
        state.exiting = frozenset(exiting)
        if not listed:
            return
        # A process that ended while NVML still lists it can no longer be resolved: it
        # keeps the job it had (its teardown's XID is that job's), and only while /proc
        # shows it ending, so a pid that lives on unresolved is never given a job.
        pids = {pid: ref if ref is not None or pid not in state.exiting
                else state.pids.get(pid) for pid, ref in pids.items()}
        for pid, ref in state.pids.items():
            if pid not in pids:
                state.gone[pid] = (ref, now)
        state.pids = dict(pids)
        for pid in [p for p, (_, at) in state.gone.items()
                    if p in pids or now - at > self.settings.teardown_window
                    + self.settings.match_window]:
            del state.gone[pid]
        while len(state.gone) > MAX_GONE:
            del state.gone[next(iter(state.gone))]

    def kernel(self, lines: Iterable[KernelXid], now: float) -> None:
        self.lines.extend((line, now) for line in lines)

    # --- XIDs ---------------------------------------------------------------------------

    def report(self, gpu: int, xid: int, now: float) -> None:
        state = self.gpus.get(gpu)
        self.pending.append(_Pending(gpu, xid, now, state.exiting if state else frozenset()))

    def decide(self, now: float) -> list[Attributed]:
        """The XIDs that can be decided now: hardware ones and those with their kernel
        line at once, the others when their wait is over."""
        decided, waiting = [], []
        overflow = len(self.pending) - MAX_PENDING
        for n, item in enumerate(self.pending):
            info = lookup(item.xid)
            line = self._line(item, now)
            if (info.attribution is Attribution.HARDWARE or line is not None
                    or now >= item.at + self.settings.kmsg_wait or n < overflow):
                decided.append(self._decide(item, info, line))
            else:
                waiting.append(item)
        self.pending = waiting
        return decided

    def next_deadline(self) -> float:
        return min((p.at + self.settings.kmsg_wait for p in self.pending), default=float("inf"))

    def _line(self, item: _Pending, now: float) -> KernelXid | None:
        gpu = self.gpus.get(item.gpu)
        pci = gpu.pci if gpu is not None else None
        for line, seen in reversed(self.lines):
            if (line.pci == pci and line.xid == item.xid
                    and abs(seen - item.at) <= self.settings.match_window):
                return line
        return None

    def _decide(self, item: _Pending, info: XidInfo, line: KernelXid | None) -> Attributed:
        if line is not None:
            self.lines.remove(next(x for x in self.lines if x[0] is line))  # used once
        if info.attribution is Attribution.HARDWARE:
            return self._hardware(item, info, "the catalog lists only hardware causes")
        if item.xid not in FAULTS:
            return self._hardware(item, info, "no fault class tells a job's owner of it")
        gpu = self.gpus.setdefault(item.gpu, _Gpu())
        tie = self._tie(gpu, item, info, line)
        if isinstance(tie, str):
            return self._hardware(item, info, tie, line)
        job, refs, teardown, why = tie
        for xid, other, at in gpu.tied:
            if xid == item.xid and other != job and item.at - at <= self.settings.recur_window:
                gpu.tied.append((item.xid, job, item.at))
                return self._hardware(item, info, f"recurs on this GPU across jobs ({other}, "
                                      f"then {job})", line)
        gpu.tied.append((item.xid, job, item.at))
        ranks = tuple(sorted({r.rank for r in refs if r.rank}))
        return Attributed(item.gpu, item.xid, item.at, Verdict.APPLICATION, why, Effect.NONE,
                          job, ranks, teardown, line.pid if line else None)

    def _tie(self, gpu: _Gpu, item: _Pending, info: XidInfo, line: KernelXid | None,
             ) -> tuple[str, list[JobRef], bool, str] | str:
        """(job, its refs, teardown, why), or why it stays in doubt."""
        window = self.settings.teardown_window
        exiting = item.exiting | gpu.exiting
        gone = {pid: ref for pid, (ref, at) in gpu.gone.items() if item.at - at <= window}
        if line is not None and line.pid is not None:
            ref = gpu.pids.get(line.pid) or gone.get(line.pid)
            if ref is None:
                return f"the kernel names pid {line.pid}, no job's process on this GPU"
            teardown = line.pid in exiting or line.pid in gone
            return (ref.job, [ref], teardown,
                    f"the kernel names pid {line.pid} ({line.name or '?'}) of job {ref.job}"
                    + (", exiting" if teardown else ""))
        ending = [ref for pid, ref in gpu.pids.items() if pid in exiting and ref] + [
            ref for ref in gone.values() if ref]
        if ending:
            jobs = {r.job for r in ending}
            if len(jobs) > 1:
                return f"processes of {len(jobs)} jobs were ending on this GPU"
            job = jobs.pop()
            return job, ending, True, f"job {job}'s process on this GPU was ending (teardown)"
        if info.attribution is Attribution.APPLICATION:
            refs = list(gpu.pids.values())
            jobs = {r.job for r in refs if r is not None}
            if refs and len(jobs) == 1 and all(r is not None for r in refs):
                job = jobs.pop()
                return job, [r for r in refs if r], False, f"job {job} is the GPU's only user"
        return "no job's process tied to it"

    def _hardware(self, item: _Pending, info: XidInfo, why: str,
                  line: KernelXid | None = None) -> Attributed:
        effect = info.effect
        if info.attribution is not Attribution.HARDWARE:
            effect = max(effect, Effect.SUSPECT, key=list(Effect).index)
        return Attributed(item.gpu, item.xid, item.at, Verdict.HARDWARE, why, effect,
                          pid=line.pid if line else None)
