"""Whether a communicator may be armed, and whether an armed entry may be confirmed,
judged from its ranks' records: the checks that keep every rank answering alike at
every collective index (invariant 1). Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.plugin.layout import StatsSlot
from agent.tuning.entries import Entry, wire_comm
from agent.tuning.jobstate import GUARD, CommState, JobState
from agent.tuning.policies import DEFAULT, Choice


def not_ready(job: JobState, comm: CommState, at: int) -> str:
    """Why ``comm`` cannot be armed to switch at ``at`` now ("" if it can)."""
    slots = comm.slots
    if not slots:
        return "no live rank"
    if comm.comm_id in job.orphaned:
        return "its ranks follow rules this agent could not rebuild"
    if len(slots) > comm.n_ranks:
        return (f"{len(slots)} ranks share its id, more than its {comm.n_ranks}: "
                "ambiguous (NCCL before 2.28 gives no communicator id)")
    if comm.n_nodes <= 1 and len(slots) < comm.n_ranks:
        return f"{len(slots)} of its {comm.n_ranks} ranks visible"
    if comm.divergence:
        return f"its ranks disagree: {comm.divergence}"
    entry = job.entries.get(comm.comm_id)
    if entry is not None and entry.pending:
        return f"a change at {entry.at} is still pending"
    if entry is not None and entry.switches and not comm.passed(entry.at):
        return f"a rank has not passed the previous switch at {entry.at}"
    revision = entry.revision if entry is not None else 0
    for slot in slots:
        if job.file is not None and slot.policy_file != job.file:
            return "a rank does not map the current policy file yet"
        if slot.waiting:
            return f"a rank waits at collective {slot.wait_at}"
        if slot.deferred:
            return "a rank defers a copy until it passes its own switch"
        if slot.refused and slot.refused_revision >= revision:
            return f"a rank refused revision {slot.refused_revision}"
        if slot.revision > revision:
            return f"a rank follows revision {slot.revision}, newer than this agent's"
        if slot.collectives + GUARD > at:
            return f"a rank reached collective {slot.collectives} (switch at {at})"
    return ""


def unverified(job: JobState, entry: Entry, slots: Sequence[StatsSlot]) -> str:
    """Why an armed entry cannot be confirmed, from the ranks' fresh records."""
    if not slots:
        return "its ranks are gone"
    n_ranks, nodes = slots[0].n_ranks, max(s.n_nodes for s in slots)
    if nodes <= 1 and len(slots) != n_ranks:
        return f"{len(slots)} of its {n_ranks} ranks visible"
    for slot in slots:
        if job.file is not None and slot.policy_file != job.file:
            return "a rank does not map the current policy file"
        if slot.refused and slot.refused_revision >= entry.revision:
            return f"a rank refused revision {slot.refused_revision}"
        if slot.collectives + GUARD > entry.at:
            return f"a rank reached collective {slot.collectives} (switch at {entry.at})"
        if slot.revision > entry.revision:
            return f"a rank follows revision {slot.revision}, newer than this agent's"
    return ""


def armed(job: JobState, comm: CommState, at: int, choice: Choice, *,
          decision: int = 0) -> Entry:
    """The entry that arms ``choice`` for ``comm`` from collective ``at``: the rules
    in force stay below it, pending until confirmed."""
    entry = job.entries.get(comm.comm_id)
    current, current_rules = (entry.after, entry.after_rules) if entry else (DEFAULT, ())
    revision = (entry.revision if entry else 0) + 1
    return Entry(comm.comm_id, at, current, choice.name, current_rules, choice.rules,
                 revision, pending=True, decision=decision)


def by_wire(job: JobState, wire: int) -> CommState | None:
    """The communicator with ranks here that the wire id (62 bits) names."""
    return next((c for c in job.comms.values() if wire_comm(c.comm_id) == wire and c.slots),
                None)
