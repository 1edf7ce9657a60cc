"""The tuning loop at its edges: what it tells operators, and the paths ordinary runs
rarely take (a full policy, an adopted pending change, stale records, several jobs).

The ranks are the reference contexts of ``tests.agent.tuning.test_loop``; each test states
one behaviour an operator or a rank relies on.
"""

from __future__ import annotations

import dataclasses

import pytest

from agent.plugin.layout import MAX_COMMS, MAX_RULESETS, Policy
from agent.tuning.loop import (
    HISTORY,
    Entry,
    LoopSettings,
    TuningLoop,
    WritePolicy,
    build_policy,
    resolved_policy,
    wire_comm,
)
from harmonaize.messages import (
    Activation,
    JobDeclaration,
    Level,
    TuningAck,
    TuningArm,
    TuningResolve,
)
from harmonaize.switches import WIRE_MASK
from tests.agent.tuning.test_loop import (
    BUSY,
    CALM,
    COMM,
    DECLARATION,
    DERIVED,
    FILE,
    FULL,
    JOB,
    THRESHOLDS,
    Host,
    arm,
    judged,
    link,
    multi_host,
)

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]

SEVERE_RULES = DERIVED.get("severe").rules
CONGESTED_RULES = DERIVED.get("congested").rules


def declared(count: int, comm: int = COMM, n_ranks: int | None = None, nodes: int = 1,
             **settings: object) -> Host:
    """A host with the job declared and ``count`` ranks of ``comm``."""
    host = Host(**settings)
    host.declare()
    host.add(count, comm=comm, n_ranks=n_ranks, nodes=nodes)
    return host


def disagreeing(host: Host) -> list:
    """The ranks' records, the first one switched at 500 where the second did not."""
    slots = host.slots()
    slots[0] = dataclasses.replace(slots[0], collectives=900, switches=1, history=5,
                                   last_switch=500)
    slots[1] = dataclasses.replace(slots[1], collectives=900)
    return slots


# --- the policy image ----------------------------------------------------------------


def test_a_policy_stores_each_rule_set_once_and_lists_communicators_in_order() -> None:
    entries = [Entry(7, 100, "default", "severe", (), SEVERE_RULES),
               Entry(3, 200, "severe", "congested", SEVERE_RULES, CONGESTED_RULES, 4, True)]
    policy = build_policy(entries, 9)
    assert policy.policy_id == 9
    assert policy.rulesets == (SEVERE_RULES, CONGESTED_RULES)
    first, second = policy.comms
    assert (first.comm_id, first.at, first.before, first.after, first.revision,
            first.pending) == (3, 200, 0, 1, 4, True)
    assert (second.comm_id, second.at, second.before, second.after, second.revision,
            second.pending) == (7, 100, None, 0, 1, False)


def test_a_policy_over_its_limits_is_refused_not_truncated() -> None:
    full = [Entry(i, 10, "default", "default") for i in range(MAX_COMMS)]
    assert len(build_policy(full, 1).comms) == MAX_COMMS
    with pytest.raises(ValueError, match=f"{MAX_COMMS + 1} communicators exceed"):
        build_policy([*full, Entry(MAX_COMMS, 10, "default", "default")], 1)
    rule = SEVERE_RULES[0]
    distinct = [Entry(i, 10, "default", "x", (), (dataclasses.replace(rule, max_channels=i + 1),))
                for i in range(MAX_RULESETS + 1)]
    assert len(build_policy(distinct[:MAX_RULESETS], 1).rulesets) == MAX_RULESETS
    with pytest.raises(ValueError, match=f"more than {MAX_RULESETS} distinct rule sets"):
        build_policy(distinct, 1)


def test_an_outcome_without_a_declaration_leaves_other_entries_alone() -> None:
    host = multi_host()
    arm(host)
    settled = dataclasses.replace(host.policy.entry(COMM), comm_id=COMM + 1, pending=False)
    waiting = dataclasses.replace(host.policy.entry(COMM), comm_id=COMM + 2)
    policy = Policy(host.policy.policy_id, (*host.policy.comms, settled, waiting),
                    host.policy.rulesets)
    message = TuningResolve(JOB, 1, False, (Activation(wire_comm(COMM), 2000),
                                             Activation(wire_comm(COMM + 1), 2000)))
    resolved = resolved_policy(policy, message)
    assert resolved is not None and resolved.policy_id == policy.policy_id
    assert resolved.rulesets == policy.rulesets
    ours = resolved.entry(COMM)
    assert (ours.pending, ours.after, ours.revision) == (
        False, policy.entry(COMM).before, policy.entry(COMM).revision + 1)
    assert resolved.entry(COMM + 1) == settled  # not pending: not this outcome's
    assert resolved.entry(COMM + 2) == waiting  # not named by it


def test_wire_ids_keep_62_bits() -> None:
    assert wire_comm(COMM) == COMM & WIRE_MASK and wire_comm(COMM) < 2**62
    assert wire_comm(5) == 5


# --- declarations --------------------------------------------------------------------


def test_a_declaration_is_written_once_and_a_repeat_changes_nothing() -> None:
    loop = TuningLoop(LoopSettings())
    assert loop.declare(DECLARATION, 0.0) == [WritePolicy(JOB, ())]
    (first,) = loop.jobs[JOB].history
    assert (first.kind, first.before, first.after, first.reason, first.time) == (
        "declared", "default", "default", "revision 1", 0.0)
    assert loop.declare(DECLARATION, 1.0) == []
    assert len(loop.jobs[JOB].history) == 1
    same_rules = dataclasses.replace(DECLARATION, revision=2)
    assert loop.declare(same_rules, 2.0) == []
    assert loop.jobs[JOB].history[-1].reason == "revision 2"
    other_rules = dataclasses.replace(DECLARATION, revision=3, tuning=(dataclasses.replace(
        DECLARATION.tuning[0], max_channels=8),))
    loop.declare(other_rules, 3.0)
    assert loop.jobs[JOB].history[-1].reason == "revision 3; rules change at the next switch"
    assert loop.jobs[JOB].derivation.revision == 3


def test_a_withdrawn_job_declared_again_is_kept() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.run(host.loop.withdraw(JOB, 1.0), 1.0)
    assert host.job.retiring
    host.run(host.loop.declare(DECLARATION, 1.5), 1.5)
    assert not host.job.retiring
    host.advance(10_000)
    host.step(FULL, 2.0)
    assert JOB in host.loop.jobs and host.job.choice == "severe"


def test_withdrawing_or_filing_an_unknown_job() -> None:
    loop = TuningLoop(LoopSettings())
    with pytest.raises(ValueError, match="no declaration for job job-x"):
        loop.withdraw("job-x", 0.0)
    loop.file("job-x", FILE)  # nothing to file it under: ignored
    assert loop.jobs == {}
    loop.refresh("job-x", [], 0.0)
    assert loop.jobs == {}


def test_history_is_bounded() -> None:
    host = Host(hold=0.0, max_changes_per_minute=1000)
    host.declare()
    for i in range(HISTORY + 10):
        host.run(host.loop.declare(dataclasses.replace(DECLARATION, revision=i + 2), i), i)
    assert len(host.job.history) == HISTORY
    assert host.job.history[-1].reason == f"revision {HISTORY + 11}"


# --- links and the level they give ---------------------------------------------------


def test_only_up_links_of_the_configured_classes_count() -> None:
    loop = TuningLoop(LoopSettings(link_classes=("data", "rdma")))
    down = dataclasses.replace(FULL, name="eth9", up=False)
    storage = link(0.95, name="sda-net", link_class="storage")
    assert loop._links(judged([down, storage]))[0] is Level.NONE
    ib = link(0.95, name="ib0", link_class="rdma")
    level, evidence, _ = loop._links(judged([CALM, ib, BUSY]))
    assert level is Level.HIGH
    assert evidence == "ib0: high: utilization 95%, CE/CNP 0.00%, retransmits 0.00%"
    quiet = loop._links(judged([CALM]))
    assert quiet == (Level.NONE, "no congestion on the job's links", False)


def test_the_worst_link_names_the_evidence_and_the_first_one_wins_a_tie() -> None:
    loop = TuningLoop(LoopSettings())
    _, evidence, _ = loop._links(judged([link(0.95, name="a"), link(0.99, name="b"), BUSY]))
    assert evidence.startswith("a: high: utilization 95%")
    _, evidence, _ = loop._links(judged([BUSY, link(0.95, name="z")]))
    assert evidence.startswith("z: high")


def test_retransmissions_count_only_on_busy_links() -> None:
    loop = TuningLoop(LoopSettings())
    share = THRESHOLDS.retransmit_low
    busy = link(0.1)
    busy = dataclasses.replace(busy, retransmit_fraction=share,
                               packets_per_s=THRESHOLDS.min_packets_per_s)
    assert loop._links(judged([busy]))[2] is True
    idle = dataclasses.replace(busy, packets_per_s=THRESHOLDS.min_packets_per_s / 2)
    assert loop._links(judged([idle]))[2] is False
    below = dataclasses.replace(busy, retransmit_fraction=share / 2)
    assert loop._links(judged([below]))[2] is False
    assert loop._links(judged([busy, below]))[2] is True
    assert loop._links(judged([below, busy]))[2] is True


def test_a_job_counts_the_time_it_was_observed_and_congested() -> None:
    host = declared(1, hold=100.0)
    host.step(CALM, 1.0)
    assert (host.job.observed, host.job.congested) == (0.0, 0.0)  # the first pass: no span
    host.step(CALM, 3.0)
    host.step(FULL, 4.0)
    host.step(CALM, 6.0)  # still held high (hold 100 s)
    host.step(CALM, 60.0)  # a long gap counts as at most 10 s
    host.step(CALM, 59.0)  # a clock going back counts nothing
    assert host.job.observed == pytest.approx(2.0 + 1.0 + 2.0 + 10.0)
    assert host.job.congested == pytest.approx(1.0 + 2.0 + 10.0)
    assert host.job.retransmitting is False


def test_the_onset_of_a_choice_is_the_pass_its_level_first_rose() -> None:
    host = declared(1, hold=0.0)
    host.step(CALM, 0.0)      # pass 1
    host.step(FULL, 1.0)      # pass 2: none -> high raises low and high at once
    (local,) = [c for c in host.job.history if c.kind == "local"]
    assert (local.before, local.after, local.step, local.onset_step) == (
        "default", "severe", 2, 2)
    assert local.reason.startswith("eth0: high: utilization 95%")
    assert local.activations == ((COMM, host.entry().at),)
    host.advance(100_000)
    host.step(CALM, 2.0)      # pass 3: calm again; hold 0 steps down at once
    host.step(CALM, 3.0)
    back = [c for c in host.job.history if c.kind == "local"][-1]
    assert (back.after, back.reason) == ("default", "calm for 0 s")
    assert back.onset_step == back.step
    assert host.job.reason == "calm for 0 s"


def test_a_rise_in_two_stages_keeps_the_pass_of_each_stage() -> None:
    host = declared(1, hold=0.0)
    host.step(BUSY, 0.0)      # pass 1: low
    host.advance(100_000)
    host.step(FULL, 1.0)      # pass 2: high
    local = [c for c in host.job.history if c.kind == "local"]
    assert [(c.after, c.onset_step) for c in local] == [("congested", 1), ("severe", 2)]


def test_the_rate_limit_window_is_one_minute() -> None:
    host = declared(1, hold=0.0, max_changes_per_minute=1)
    host.step(CALM, 5.0)
    host.step(FULL, 10.0)
    host.advance(100_000)
    host.step(CALM, 40.0)
    host.step(CALM, 40.1)  # a fall counts from the second calm pass
    assert host.job.choice == "severe"
    assert host.job.waiting == "rate limit: 1 changes in the last minute (max 1)"
    host.step(CALM, 69.9)
    assert host.job.choice == "severe"
    host.step(CALM, 70.0)  # the change at 10 s is a minute old: it no longer counts
    assert host.job.choice == "default"
    assert list(host.job.changes) == [70.0]


def test_a_job_without_rules_stays_with_nccl_whatever_the_links_say() -> None:
    host = Host()
    host.declare(JobDeclaration(JOB, revision=1))
    host.add(1)
    host.step(FULL, 0.0)
    assert host.job.desired_severity == 0
    assert host.job.choice == "default" and host.job.entries == {}


def test_a_calm_link_after_congestion_is_reported_as_waiting_nothing() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    assert host.job.waiting == ""
    assert all(c.waiting == "" for c in host.job.comms.values())


def test_what_a_communicator_waits_for_is_named() -> None:
    host = declared(2, hold=0.0, activation_margin=100)
    host.step(FULL, 0.0)
    at = host.entry().at
    host.advance(at + 5, rank=0)
    host.step(CALM, 1.0)
    host.step(CALM, 1.1)
    assert host.job.waiting == (f"communicator {COMM:#x}: a rank has not passed the "
                                f"previous switch at {at}")


# Two communicators of one job on two hosts: shared by the files of the loop's two phases,
# its wording, a withdrawal and the mutation pins.
A, B = COMM, COMM + 1


def two_comm_multi_host() -> Host:
    host = declared(2, comm=A, n_ranks=4, nodes=2, report_interval=1.0)
    host.add(2, comm=B, n_ranks=4, nodes=2)
    host.advance(500, comm=A)
    host.advance(500, comm=B)
    host.step(FULL, 0.0)
    return host


def arm_comms(host: Host, decision: int, points: dict[int, int],
              choice: str = "severe") -> TuningAck:
    host.sent.clear()
    message = TuningArm(JOB, decision, choice, DERIVED.fingerprint,
                        tuple(Activation(wire_comm(c), at) for c, at in points.items()))
    host.run(host.loop.arm(message, 1.0), 1.0)
    (ack,) = [m for m in host.sent if isinstance(m, TuningAck)]
    return ack


def resolve_comms(host: Host, decision: int, points: dict[int, int], commit: bool = True,
                  now: float = 2.0) -> None:
    message = TuningResolve(JOB, decision, commit,
                            tuple(Activation(wire_comm(c), at) for c, at in points.items()))
    host.run(host.loop.resolve(message, now), now)
