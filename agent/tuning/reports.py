"""What a host reports to the controller of a job spanning hosts: where its ranks of
each communicator stand and what they switched. Sans-I/O.
"""

from __future__ import annotations

from agent.plugin.layout import MAX_COMMS
from agent.tuning.entries import wire_comm
from agent.tuning.jobstate import JobState, record_of
from agent.tuning.policies import DEFAULT
from harmonaize.messages import CommReport, SwitchState
from harmonaize.switches import WIRE_MASK, Record, merge


def comm_reports(job: JobState) -> tuple[CommReport, ...]:
    """Where this host's ranks of each communicator stand, for the controller."""
    out = []
    for comm in sorted(job.comms.values(), key=lambda c: c.comm_id)[:MAX_COMMS]:
        if not comm.slots:
            continue
        entry = job.entries.get(comm.comm_id)
        groups = merge(record_of(s).masked() for s in comm.slots)
        out.append(CommReport(
            wire_comm(comm.comm_id), comm.n_ranks, comm.n_nodes, len(comm.slots),
            min(comm.least, 2**62), min(comm.collectives, 2**62), min(comm.rate, 1e9),
            entry.after if entry else DEFAULT, min(entry.at, 2**62) if entry else 0,
            bool(entry and entry.pending),
            switch_state(groups[-1]), switch_state(groups[0]),
            sum(1 for s in comm.slots if s.waiting),
            sum(1 for s in comm.slots if s.refused),
            bool(comm.divergence)))
    return tuple(out)


def news(report: CommReport) -> tuple[object, ...]:
    """What of a communicator's report is news: everything but progress (how far its
    ranks got, and how fast), which is sent every report interval anyway."""
    return (report.comm, report.n_ranks, report.n_nodes, report.ranks, report.choice,
            report.at, report.pending, report.waiting, report.refused, report.diverged,
            *((state.switches, state.history, state.prev_history, state.last_switch)
              for state in (report.ahead, report.behind)))


def switch_state(record: Record) -> SwitchState:
    return SwitchState(record.switches, record.history & WIRE_MASK,
                       record.prev_history & WIRE_MASK, min(record.last_switch, 2**62),
                       min(record.collectives, 2**62))
