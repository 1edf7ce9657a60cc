"""The sans-I/O tuning loop: arm, verify, confirm; hysteresis, rate limits, restarts.

Ranks are reference contexts (``agent.plugin.layout.ReferenceContext``: the
plugin's rule for taking a copy, in Python), wired to the loop as the
service wires the plugin: every policy the loop writes is seen by every rank
at its next collective, and the loop reads their records back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from agent.links.health import LinkJudgement, LinkView, judge
from agent.links.settings import LinksSection
from agent.plugin.layout import Policy, ReferenceContext, StatsSlot, ruleset_hash
from agent.tuning.loop import (
    Action,
    LoopSettings,
    Publish,
    Retire,
    TuningLoop,
    WritePolicy,
    build_policy,
    record_of,
    wire_comm,
)
from agent.tuning.policies import CHOICE_NAMES, derive
from harmonaize.messages import (
    AckPhase,
    Activation,
    Algorithm,
    Collective,
    JobDeclaration,
    Message,
    Protocol,
    SwitchState,
    TuningAck,
    TuningArm,
    TuningRange,
    TuningReport,
    TuningResolve,
)
from harmonaize.switches import WIRE_MASK, disagreement

pytestmark = pytest.mark.tuning

JOB = "job-1"
COMM = 0xC0FFEE00DEADBEEF  # bit 63 set, as NCCL's random ids may have
FILE = (1, 2)
THRESHOLDS = LinksSection()
DECLARATION = JobDeclaration(JOB, tuning=(TuningRange(
    (Collective.ALLREDUCE,), (Algorithm.RING, Algorithm.TREE), (Protocol.LL, Protocol.SIMPLE),
    0, 1 << 40, 2, 16),), revision=1)
DERIVED = derive(DECLARATION)
SEVERE = ruleset_hash(DERIVED.get("severe").rules)


def link(utilization: float, name: str = "eth0", link_class: str = "data") -> LinkView:
    return LinkView(name, link_class, True, utilization, 0.0, 0.0, 0.0, 1e5)


def judged(links: Sequence[LinkView]) -> list[LinkJudgement]:
    """The link step's judgement of each link, as the daemon hands it to the loop."""
    return [judge(view, THRESHOLDS) for view in links]


CALM, BUSY, FULL = link(0.1), link(0.7), link(0.95)
HISTORY_KINDS = {"declared", "adopted", "withdrawn", "local", "armed", "confirmed",
                 "cancelled", "refused", "diverged"}


class Host:
    """A loop and its ranks, wired as :class:`TuningService` wires loop and plugin."""

    def __init__(self, **overrides: object) -> None:
        self.loop = TuningLoop(LoopSettings(**overrides))  # type: ignore[arg-type]
        self.ranks: dict[int, list[ReferenceContext]] = {}
        self.sizes: dict[int, tuple[int, int]] = {}
        self.policy = Policy(0)
        self.sent: list[Message] = []
        self.writes = 0
        self.name = JOB
        #: Ranks that do not see the next write (a rank that raced ahead unseen) ...
        self.blind: set[tuple[int, int]] = set()
        #: ... and what they do before the loop reads the ranks' records again.
        self.between: list[object] = []

    def declare(self, declaration: JobDeclaration = DECLARATION, now: float = 0.0) -> None:
        self.name = declaration.job
        self.run(self.loop.declare(declaration, now), now)
        self.loop.file(declaration.job, FILE)

    def add(self, count: int, comm: int = COMM, n_ranks: int | None = None,
            nodes: int = 1) -> None:
        self.ranks.setdefault(comm, []).extend(ReferenceContext() for _ in range(count))
        self.sizes[comm] = (n_ranks or len(self.ranks[comm]), nodes)
        for rank in self.ranks[comm]:
            rank.see(self.policy.view(comm))

    def slots(self, comm: int | None = None) -> list[StatsSlot]:
        out = []
        for c, ranks in self.ranks.items():
            if comm is not None and c != comm:
                continue
            n_ranks, nodes = self.sizes[c]
            out += [r.slot(100 + i, c, n_ranks, nodes, FILE) for i, r in enumerate(ranks)]
        return out

    def run(self, actions: Sequence[Action], now: float) -> None:
        for action in actions:
            assert isinstance(action, WritePolicy | Publish | Retire), action
            if isinstance(action, WritePolicy | Retire):
                assert action.job in (self.name, *self.loop.jobs), action.job
            if isinstance(action, WritePolicy):
                self.policy = build_policy(action.entries, self.writes + 1)
                self.writes += 1
                for c, ranks in self.ranks.items():
                    for i, rank in enumerate(ranks):
                        if (c, i) not in self.blind:
                            rank.see(self.policy.view(c))
                self.blind.clear()
            elif isinstance(action, Publish):
                self.sent.append(action.message)
        if any(j.arming or j.acking for j in self.loop.jobs.values()):
            hooks, self.between = self.between, []
            for hook in hooks:
                hook()  # type: ignore[operator]
            self.run(self.loop.confirm({self.name: self.slots()}, now), now)
        for job in self.loop.jobs.values():
            for change in job.history:  # what operators read is always whole
                assert isinstance(change.time, float | int), change
                assert change.kind in HISTORY_KINDS and change.reason, change
                assert {change.before, change.after} <= {*CHOICE_NAMES, "previous"}, change

    def advance(self, count: int, comm: int = COMM, rank: int | None = None) -> None:
        for i, r in enumerate(self.ranks[comm]):
            if rank is not None and i != rank:
                continue
            for _ in range(count):
                if r.would_wait():
                    break
                r.call()

    def step(self, view: LinkView, now: float) -> None:
        self.run(self.loop.step(judged([view]), {self.name: self.slots()}, now), now)

    @property
    def job(self):
        return self.loop.jobs[self.name]

    def entry(self, comm: int = COMM):
        return self.job.entries.get(comm)


def agree(host: Host, comm: int = COMM) -> bool:
    """Every rank's switch record the same where both ranks have been."""
    return not disagreement(record_of(s) for s in host.slots(comm))

def race(host: Host, rank: int = 1) -> None:
    """Rank ``rank`` misses the next write and runs past its switching point before the
    loop looks again; then it sees the policy as it is."""
    host.blind = {(COMM, rank)}

    def run_past() -> None:
        entry = host.entry()
        if entry is not None and entry.pending:
            host.advance(entry.at + 3 - host.ranks[COMM][rank].n, rank=rank)
        host.ranks[COMM][rank].see(host.policy.view(COMM))

    host.between.append(run_past)
def restarted(old: Host, *, policy: Policy | None) -> Host:
    new = Host()
    new.ranks, new.sizes, new.policy = old.ranks, old.sizes, old.policy
    # As the service does: what adoption writes replaces the new declaration's file.
    new.loop.declare(DECLARATION, 10.0)
    new.loop.file(JOB, FILE)
    new.run(new.loop.adopt(JOB, policy, new.slots(), 10.0), 10.0)
    return new


def _comm(host: Host):
    host.step(CALM, 0.0)
    return host.job.comms[COMM]


# --- several hosts -------------------------------------------------------------------


def multi_host() -> Host:
    host = Host(report_interval=1.0)
    host.declare()
    host.add(2, n_ranks=4, nodes=2)
    host.advance(500)
    host.step(FULL, 0.0)
    return host


def arm(host: Host, decision: int = 1, at: int = 2000, choice: str = "severe",
        fingerprint: str | None = None) -> TuningAck:
    host.sent.clear()
    message = TuningArm(JOB, decision, choice, fingerprint or DERIVED.fingerprint,
                        (Activation(wire_comm(COMM), at),))
    host.run(host.loop.arm(message, 1.0), 1.0)
    (ack,) = [m for m in host.sent if isinstance(m, TuningAck)]
    return ack


def resolve(host: Host, commit: bool, decision: int = 1, at: int = 2000) -> TuningAck:
    host.sent.clear()
    message = TuningResolve(JOB, decision, commit, (Activation(wire_comm(COMM), at),))
    host.run(host.loop.resolve(message, 2.0), 2.0)
    (ack,) = [m for m in host.sent if isinstance(m, TuningAck)]
    return ack


def test_a_job_spanning_hosts_only_reports_and_never_switches_alone() -> None:
    host = multi_host()
    assert host.entry() is None and host.job.multi
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert (report.want, report.severity, report.fingerprint) == ("severe", 2,
                                                                 DERIVED.fingerprint)
    (comm,) = report.comms
    assert (comm.comm, comm.ranks, comm.n_ranks, comm.collectives_max) == (
        wire_comm(COMM), 2, 4, 500)
    host.sent.clear()
    host.step(FULL, 0.5)
    assert host.sent == []  # nothing changed, and the interval has not passed
    host.step(FULL, 1.1)
    assert len(host.sent) == 1


@pytest.mark.parametrize("commit", [True, False])
def test_arm_then_resolve(commit) -> None:
    host = multi_host()
    ack = arm(host)
    assert ack.phase is AckPhase.ARMED and host.entry().pending
    host.advance(3000)
    assert all(r.n == 2000 for r in host.ranks[COMM])  # they wait at the switch
    ack = resolve(host, commit)
    assert ack.phase is AckPhase.RESOLVED and not host.entry().pending
    host.advance(100)
    expected = SEVERE if commit else 0
    assert all(r.n == 2100 and r.current == expected for r in host.ranks[COMM])
    assert host.job.choice == ("severe" if commit else "default")
    assert resolve(host, commit).phase is AckPhase.RESOLVED  # resent: same answer


def test_an_arm_this_host_cannot_take_is_refused_without_writing() -> None:
    host = multi_host()
    writes = host.writes
    assert arm(host, at=501).phase is AckPhase.REFUSED  # its ranks are at 500
    assert host.writes == writes and host.entry() is None
    refused = arm(host, decision=2, fingerprint="other")
    assert refused.phase is AckPhase.REFUSED and "other rules" in refused.reason
    assert arm(host, decision=3, choice="bogus").phase is AckPhase.REFUSED


def test_a_repeated_arm_is_answered_alike() -> None:
    host = multi_host()
    assert arm(host).phase is AckPhase.ARMED
    writes = host.writes
    assert arm(host).phase is AckPhase.ARMED
    assert host.writes == writes


def test_a_restarted_agent_resolves_what_its_predecessor_armed() -> None:
    host = multi_host()
    arm(host)
    again = restarted(host, policy=host.policy)
    assert again.entry().pending  # several hosts: only the controller may resolve it
    again.sent.clear()
    message = TuningResolve(JOB, 1, True, (Activation(wire_comm(COMM), 2000),))
    again.run(again.loop.resolve(message, 11.0), 11.0)
    assert not again.entry().pending and again.entry().after == "severe"
    again.advance(3000)
    assert agree(again)


def test_local_disagreement_is_detected() -> None:
    host = Host()
    host.declare()
    host.add(2)
    slots = host.slots()
    slots[0] = dataclasses.replace(slots[0], collectives=900, switches=1, history=5,
                                   last_switch=500)
    slots[1] = dataclasses.replace(slots[1], collectives=900)
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 0.0), 0.0)
    assert host.job.diverged and "passed collective 500" in host.job.diverged[0]
    assert host.job.history[-1].kind == "diverged"

# --- what mutation testing found unpinned ---------------------------------------------


def test_an_arm_for_a_job_or_communicator_this_host_does_not_have() -> None:
    host = Host()
    host.sent.clear()
    stranger = TuningArm("job-unknown", 1, "severe", DERIVED.fingerprint,
                         (Activation(wire_comm(COMM), 2000),))
    host.run(host.loop.arm(stranger, 1.0), 1.0)
    (ack,) = host.sent
    assert (ack.job, ack.decision, ack.phase, ack.reason) == (
        "job-unknown", 1, AckPhase.REFUSED, "no declaration for the job on this host")
    host.sent.clear()
    host.run(host.loop.resolve(TuningResolve("job-unknown", 1, True, ()), 1.0), 1.0)
    (outcome,) = host.sent
    assert (outcome.phase, outcome.reason) == (AckPhase.RESOLVED,
                                               "no declaration for the job on this host")
    # A communicator with no rank here is skipped; the ones here are armed.
    multi = multi_host()
    multi.sent.clear()
    both = TuningArm(JOB, 1, "severe", DERIVED.fingerprint,
                     (Activation(12345, 2000), Activation(wire_comm(COMM), 2000)))
    multi.run(multi.loop.arm(both, 1.0), 1.0)
    (armed,) = [m for m in multi.sent if isinstance(m, TuningAck)]
    assert armed.phase is AckPhase.ARMED
    assert multi.entry().pending and multi.entry().at == 2000
    assert set(multi.job.entries) == {COMM}


def test_an_older_decision_goes_unanswered_and_a_withdrawn_job_arms_only_the_way_back() -> None:
    host = multi_host()
    assert arm(host, decision=2).phase is AckPhase.ARMED
    resolve(host, True, decision=2)
    host.advance(2500)  # every rank past that switch
    host.step(FULL, 2.5)  # and the loop has read them there
    host.sent.clear()
    old = TuningArm(JOB, 1, "severe", DERIVED.fingerprint, (Activation(wire_comm(COMM), 9000),))
    host.run(host.loop.arm(old, 3.0), 3.0)
    assert host.sent == []  # superseded: nothing to say
    host.run(host.loop.withdraw(JOB, 4.0), 4.0)
    refused = arm(host, decision=3, at=4000)
    assert (refused.phase, refused.reason) == (AckPhase.REFUSED, "declaration withdrawn here")
    assert arm(host, decision=4, at=4000, choice="default").phase is AckPhase.ARMED


def test_every_declared_job_is_stepped() -> None:
    first = Host()
    first.declare()
    other = dataclasses.replace(DECLARATION, job="job-2")
    loop = first.loop
    first.run(loop.declare(other, 0.0), 0.0)
    loop.file("job-2", FILE)
    first.add(2)
    second_ranks = [ReferenceContext(), ReferenceContext()]
    slots = {JOB: first.slots(),
             "job-2": [r.slot(200 + i, 0xB0B, 2, 1, FILE) for i, r in enumerate(second_ranks)]}
    actions = loop.step(judged([FULL]), slots, 0.0)
    written = {a.job for a in actions if isinstance(a, WritePolicy)}
    assert written == {JOB, "job-2"}


def test_a_hosts_report_says_exactly_where_its_ranks_stand() -> None:
    host = multi_host()
    arm(host)
    host.advance(3000)  # both ranks reach the armed point and wait there
    host.sent.clear()
    host.step(FULL, 1.5)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    (waiting,) = report.comms
    assert (waiting.comm, waiting.n_ranks, waiting.n_nodes, waiting.ranks) == (
        wire_comm(COMM), 4, 2, 2)
    assert (waiting.collectives_min, waiting.collectives_max) == (2000, 2000)
    assert (waiting.choice, waiting.at, waiting.pending) == ("severe", 2000, True)
    assert (waiting.refused, waiting.diverged) == (0, False)
    assert waiting.per_second > 0
    resolve(host, True)
    host.advance(100, rank=0)  # one rank on, the other still where it was
    host.sent.clear()
    host.step(FULL, 3.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    (after,) = report.comms
    assert (after.collectives_min, after.collectives_max, after.pending, after.waiting) == (
        2000, 2100, False, 0)
    ahead, behind = (record_of(s) for s in sorted(host.slots(), key=lambda s: -s.collectives))
    assert after.ahead == SwitchState(ahead.switches, ahead.history & WIRE_MASK,
                                      ahead.prev_history & WIRE_MASK, ahead.last_switch,
                                      ahead.collectives)
    assert after.ahead.switches == 1 and after.ahead.last_switch == 2000
    assert after.behind.collectives == behind.collectives == 2000
