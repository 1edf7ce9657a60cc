"""The tuning loop's part for a restarted agent: take over what its predecessor
published, so a restart changes nothing mid-stream. Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.plugin.layout import Policy, Rule, StatsSlot, ruleset_hash
from agent.tuning.entries import Action, Entry, WritePolicy, cancelled
from agent.tuning.jobstate import PREVIOUS, CommState, JobState, LoopBase, by_comm
from agent.tuning.phases import Event, Phase
from agent.tuning.policies import CHOICE_NAMES, severity_of
from harmonaize.messages import Level


class Adoption(LoopBase):
    def adopt(self, job_name: str, policy: Policy | None, slots: Sequence[StatsSlot],
              now: float) -> list[Action]:
        """Take over what a previous agent published for a declared job, so a restart
        changes nothing mid-stream. From its policy file if it could be read, else
        rebuilt from what the ranks say they follow; a communicator whose rules
        cannot be rebuilt is left alone (its ranks keep what they hold)."""
        job = self.jobs[job_name]
        job.entries = {}
        rebuilt = 0
        if policy is not None:
            for comm in policy.comms:
                before, after = policy.rules(comm.before), policy.rules(comm.after)
                job.entries[comm.comm_id] = Entry(
                    comm.comm_id, comm.at, self._label(job, before), self._label(job, after),
                    before, after, comm.revision, comm.pending)
        groups = by_comm(slots)
        known = {ruleset_hash(c.rules): c.rules for c in job.derivation.choices}
        if policy is not None:
            known |= {ruleset_hash(rules): rules for rules in policy.rulesets}
        for comm_id, group in list(groups.items()):
            newest = max(group, key=lambda s: s.revision)
            entry = job.entries.get(comm_id)
            if entry is not None and entry.revision >= newest.revision:
                continue
            if newest.revision == 0:
                continue  # its ranks follow nothing yet
            held = newest.held
            if held.before not in known or held.after not in known:
                job.orphaned.add(comm_id)
                job.entries.pop(comm_id, None)
                continue
            before, after = known[held.before], known[held.after]
            job.entries[comm_id] = Entry(comm_id, held.at, self._label(job, before),
                                         self._label(job, after), before, after,
                                         held.revision, held.pending)
            rebuilt += 1
        # Orphans too: a communicator gone before the next pass is forgotten after
        # ``stall`` like any other, not remembered as an orphan for ever.
        for comm_id in (*job.entries, *job.orphaned):
            job.comms.setdefault(comm_id, CommState(comm_id, seen_at=now))
        labels = {e.after for e in job.entries.values()}
        if len(labels) == 1 and (label := labels.pop()) in CHOICE_NAMES:
            job.choice = label
            job.level.level = Level(("none", "low", "high")[severity_of(label)])
        self._record(job, now, "adopted", (job.choice, job.choice),
                     f"{len(job.entries)} communicator(s) from the previous agent"
                     + (f"; {rebuilt} rebuilt from the ranks' records" if rebuilt else "")
                     + (f"; {len(job.orphaned)} left as their ranks hold them"
                        if job.orphaned else ""))
        # A change a previous agent armed on this host alone is cancelled: its ranks
        # wait at (or before) the switching point, and nobody else will confirm it.
        for comm_id, entry in list(job.entries.items()):
            if not entry.pending:
                continue
            self.move(job, comm_id, Event.ADOPTED_PENDING)
            nodes = max((s.n_nodes for s in groups[comm_id]), default=None)
            if nodes is not None and nodes <= 1 and \
                    self.move(job, comm_id, Event.ABORT) is Phase.CANCELLED:
                job.entries[comm_id] = cancelled(entry)
                job.aborted += 1
        job.dirty = False
        return [WritePolicy(job_name, tuple(job.entries.values()))]

    @staticmethod
    def _label(job: JobState, rules: tuple[Rule, ...]) -> str:
        for choice in job.derivation.choices:
            if choice.rules == rules:
                return choice.name
        return PREVIOUS  # never NCCL's own (empty) rules: every derivation has a default
