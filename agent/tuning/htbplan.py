"""The traffic plan for declared bulk traffic, sans-I/O: which job gets which HTB class and
rate on which link (:func:`plan`), with the class ids both the plan and the shaper
(:mod:`agent.tuning.htb`) use. No kernel object is touched here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from harmonaize.messages import JobDeclaration

MAJOR = 0x485A  # "HZ"
ROOT = MAJOR << 16
ROOT_CLASS = ROOT | 0x1
DEFAULT_MINOR = 0x10
DEFAULT_CLASS = ROOT | DEFAULT_MINOR
BULK_MINOR_BASE = 0x100
MAX_BULK_CLASSES = 0x100
TC_H_ROOT = 0xFFFFFFFF
FILTER_PREFIX = "hz_bulk_"
PROGRAM = "hz_bulk_egress"
FILTER_PRIO = 2
IF_TABLE = 4096
#: Leaf qdisc handles: a major of their own per class, derived from its minor.
LEAF_MAJOR_BASE = 0x4A00
MIN_RATE_KBIT = 8


@dataclass(frozen=True)
class BulkJob:
    job: str
    floor_mbps: float
    ports: tuple[int, ...] = ()
    dscp: tuple[int, ...] = ()
    #: The users whose sockets are the job's (its Unix group's; root's without one): only
    #: their packets are classified, so a job classifies only its own traffic.
    uids: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class ClassPlan:
    classid: int
    rate_kbit: int
    ceil_kbit: int
    prio: int
    label: str


@dataclass(frozen=True)
class LinkPlan:
    name: str
    speed_mbps: int
    classes: tuple[ClassPlan, ...]
    #: The floors did not fit the link and were scaled down.
    scaled: bool = False


#: A flow key's ``what`` for a DSCP value (else a TCP port), as in bulk_classify.c.
DSCP_FLAG = 0x10000


@dataclass(frozen=True)
class Plan:
    links: tuple[LinkPlan, ...] = ()
    #: (socket uid, TCP port or DSCP_FLAG | DSCP, classid): the classifier's map.
    flows: tuple[tuple[int, int, int], ...] = ()
    notes: tuple[str, ...] = ()

    def ports(self) -> dict[int, int]:
        """Port -> class id, over every user (for display and tests)."""
        return {what: c for _, what, c in self.flows if not what & DSCP_FLAG}

    def dscp(self) -> dict[int, int]:
        return {what & ~DSCP_FLAG: c for _, what, c in self.flows if what & DSCP_FLAG}


def assign_minors(jobs: Iterable[str], previous: Mapping[str, int]) -> dict[str, int]:
    """A class minor per job, kept for as long as the job is there."""
    out = {job: minor for job, minor in previous.items() if job in set(jobs)}
    free = (BULK_MINOR_BASE + i for i in range(MAX_BULK_CLASSES)
            if BULK_MINOR_BASE + i not in out.values())
    for job in sorted(set(jobs) - set(out)):
        minor = next(free, None)
        if minor is not None:
            out[job] = minor
    return out


def fair_floors(declared: Sequence[int], room: int, cap: int) -> list[int]:
    """Each job's floor (kbit/s) within ``room``: max-min fair, never above ``cap`` nor
    what it declared. Every job keeps at least min(declared, cap, room / jobs), whatever
    the others declare: a huge floor takes only what the others leave."""
    wanted = [min(d, cap) for d in declared]
    out = [0] * len(wanted)
    left = room
    for done, i in enumerate(sorted(range(len(wanted)), key=lambda i: wanted[i])):
        share = left // (len(wanted) - done)
        out[i] = min(wanted[i], share)
        left -= out[i]
    return out


def plan(jobs: Sequence[BulkJob], links: Sequence[tuple[str, int | None]],
         minors: Mapping[str, int], *, collective_share: float = 0.1,
         max_floor_share: float = 1.0, previous: Plan | None = None) -> Plan:
    """Classes per link, and the classifier's maps; pure.

    ``links`` are (name, speed in Mb/s or None). The collectives keep
    ``collective_share`` of a link; the bulk floors share the rest max-min fairly, each
    at most ``max_floor_share`` of the link (the operator's bound on one job), so no
    job's declaration lowers another's floor below its fair share (cuts are noted).

    A job's ports and DSCP values classify only its own users' sockets (``uids``), so
    jobs of different users never contend for one. Where two jobs of the same user
    claim one, it belongs to the job that claimed it first: the one holding it in
    ``previous``, else the first in ``jobs`` (the caller passes them in the order they
    were declared); the later claim is refused, and noted.
    """
    notes: list[str] = []
    order = [j for j in jobs if j.job in minors]
    jobs = sorted(order, key=lambda j: j.job)
    if not jobs:
        return Plan()
    job_of = {ROOT | minor: job for job, minor in minors.items()}
    held = {(uid, what): job_of.get(c, "") for uid, what, c in previous.flows} \
        if previous else {}
    flows = _claims(order, minors, held, notes=notes)
    for job in order:
        if not job.uids:
            notes.append(f"job {job.job}: no user of its group is known here: its bulk "
                         "traffic is not classified")
    if not links:
        notes.append("no observed link of the shaped classes (observers.links, "
                     "tuning.htb_link_classes): nothing shaped")
    planned = []
    for name, speed in links:
        if not speed:
            notes.append(f"{name}: link speed unknown (set observers.links.speeds): not shaped")
            continue
        link_kbit = speed * 1000
        declared = [max(MIN_RATE_KBIT, round(min(job.floor_mbps, speed) * 1000))
                    for job in jobs]
        room = max(MIN_RATE_KBIT * len(jobs), int(link_kbit * (1.0 - collective_share)))
        cap = max(MIN_RATE_KBIT, int(link_kbit * max_floor_share))
        floors = [max(MIN_RATE_KBIT, f) for f in fair_floors(declared, room, cap)]
        scaled = floors != declared
        for job, want, got in zip(jobs, declared, floors, strict=True):
            if got < want:
                notes.append(f"{name}: job {job.job}'s bulk floor {want / 1000:g} Mb/s cut "
                             f"to {got / 1000:g} Mb/s (its fair share of the "
                             f"{room / 1000:g} Mb/s left to bulk, at most "
                             f"{max_floor_share:.0%} of the link)")
        classes = [
            ClassPlan(ROOT_CLASS, link_kbit, link_kbit, 0, "link"),
            ClassPlan(DEFAULT_CLASS, max(MIN_RATE_KBIT, link_kbit - sum(floors)), link_kbit, 0,
                      "collectives and other traffic"),
            *(ClassPlan(ROOT | minors[job.job], floor, link_kbit, 1, f"bulk of {job.job}")
              for job, floor in zip(jobs, floors, strict=True)),
        ]
        planned.append(LinkPlan(name, speed, tuple(classes), scaled))
    return Plan(tuple(planned), tuple(sorted((uid, what, c) for (uid, what), c in
                                             flows.items())), tuple(notes))


def _claims(order: Sequence[BulkJob], minors: Mapping[str, int],
            held: Mapping[tuple[int, int], str], *,
            notes: list[str]) -> dict[tuple[int, int], int]:
    """(uid, port or DSCP) -> class id: a key stays with the job that holds it while that
    job still declares it; a new key goes to the first job (in ``order``) claiming it."""
    declaring = {j.job: {(uid, what) for uid in j.uids for what in
                         (*j.ports, *(DSCP_FLAG | d for d in j.dscp))} for j in order}
    owner = {key: job for key, job in held.items() if key in declaring.get(job, ())}
    refused: set[tuple[int, str, str]] = set()
    for job in order:
        for key in sorted(declaring[job.job]):
            first = owner.setdefault(key, job.job)
            if first != job.job:
                refused.add((key[1], job.job, first))
    for what, job, first in sorted(refused):
        name = f"DSCP {what & ~DSCP_FLAG}" if what & DSCP_FLAG else f"port {what}"
        notes.append(f"{name}: job {job}'s claim refused: job {first} declared it first "
                     "(a job classifies only its own traffic)")
    return {key: ROOT | minors[job] for key, job in owner.items()}


def handle_str(handle: int) -> str:
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}"


def bulk_jobs(declared: Iterable[tuple[str, JobDeclaration]],
              uids: Callable[[str], tuple[int, ...]]) -> list[BulkJob]:
    """The jobs with declared bulk traffic (ports or DSCP values), in ``declared``'s order;
    ``uids``: a job group's users (only their sockets are the job's)."""
    out = []
    for name, declaration in declared:
        bulk = declaration.bulk
        if bulk is not None and (bulk.ports or bulk.dscp):
            out.append(BulkJob(name, bulk.floor_mbps, bulk.ports, bulk.dscp,
                               uids(declaration.group)))
    return out
