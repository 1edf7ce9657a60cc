"""What the tuning loop decides, as data: a communicator's policy entry and the actions
the I/O shell carries out (write a job's policy, publish a message, retire a job's files).

Also the policy file's view of the entries (:func:`build_policy`) and an outcome applied
to a policy without a declaration (:func:`resolved_policy`). Sans-I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from agent.plugin.layout import MAX_COMMS, MAX_RULESETS, CommEntry, Policy, Rule
from harmonaize.messages import Message, TuningResolve
from harmonaize.switches import WIRE_MASK


def wire_comm(comm_id: int) -> int:
    """NCCL's communicator ids are random 64-bit values; the wire carries 62 bits."""
    return comm_id & WIRE_MASK




@dataclass(frozen=True)
class Entry:
    """One communicator under policy: ``before`` rules for collectives below ``at``,
    ``after`` rules from it on (empty rules: NCCL's own choice). ``pending``: armed,
    not yet confirmed. ``decision``: the controller's decision that armed it (0: this
    agent's own, or unknown after a restart)."""

    comm_id: int
    at: int
    before: str
    after: str
    before_rules: tuple[Rule, ...] = ()
    after_rules: tuple[Rule, ...] = ()
    revision: int = 1
    pending: bool = False
    decision: int = 0

    @property
    def switches(self) -> bool:
        """Whether the answer changes at ``at`` (or may, while pending)."""
        return self.before_rules != self.after_rules


@dataclass(frozen=True)
class WritePolicy:
    job: str
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Publish:
    message: Message


@dataclass(frozen=True)
class Retire:
    """The job's declaration is gone and its communicators are settled: remove its files."""

    job: str


Action = WritePolicy | Publish | Retire


def build_policy(entries: Iterable[Entry], policy_id: int) -> Policy:
    """The plugin's view of ``entries``: distinct rule sets, each stored once."""
    sets: list[tuple[Rule, ...]] = []
    comms = []
    entries = sorted(entries, key=lambda e: e.comm_id)
    if len(entries) > MAX_COMMS:
        raise ValueError(f"{len(entries)} communicators exceed the {MAX_COMMS} a policy holds")
    for entry in entries:
        indexes = []
        for rules in (entry.before_rules, entry.after_rules):
            if not rules:
                indexes.append(None)  # NCCL's own choice: no ruleset needed
                continue
            if rules not in sets:
                if len(sets) == MAX_RULESETS:
                    raise ValueError(f"more than {MAX_RULESETS} distinct rule sets: more "
                                     "than a policy holds")
                sets.append(rules)
            indexes.append(sets.index(rules))
        comms.append(CommEntry(entry.comm_id, entry.at, indexes[0], indexes[1],
                               entry.revision, entry.pending))
    return Policy(policy_id, tuple(comms), tuple(sets))


def resolved_policy(policy: Policy, message: TuningResolve) -> Policy | None:
    """``policy`` with what ``message`` resolves confirmed or cancelled, without a
    declaration (None if it resolves nothing in it). A restarted agent may hear the
    outcome of a change its predecessor armed before it has the job's declaration
    again; the outcome needs no rules: confirming clears ``pending``, cancelling
    makes the rules after ``at`` those before it."""
    points = {a.comm: a.at for a in message.activations}
    comms, changed = [], False
    for entry in policy.comms:
        ours = entry.pending and points.get(wire_comm(entry.comm_id)) == entry.at
        comms.append(dataclasses.replace(
            entry, revision=entry.revision + 1, pending=False,
            after=entry.after if message.commit else entry.before) if ours else entry)
        changed = changed or ours
    return Policy(policy.policy_id, tuple(comms), policy.rulesets) if changed else None


def cancelled(entry: Entry) -> Entry:
    """The armed change withdrawn: the old rules hold past ``at`` too."""
    return dataclasses.replace(entry, revision=entry.revision + 1, pending=False,
                               after=entry.before, after_rules=entry.before_rules)


def confirmed(entry: Entry) -> Entry:
    """The armed change taken: the new rules hold from ``at`` on."""
    return dataclasses.replace(entry, revision=entry.revision + 1, pending=False)
