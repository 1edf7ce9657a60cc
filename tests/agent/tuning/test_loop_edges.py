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
    CommState,
    Entry,
    LoopSettings,
    Publish,
    Retire,
    TuningLoop,
    WritePolicy,
    build_policy,
    resolved_policy,
    wire_comm,
)
from harmonaize.messages import (
    AckPhase,
    Activation,
    JobDeclaration,
    Level,
    TuningAck,
    TuningArm,
    TuningReport,
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
    race,
    resolve,
    restarted,
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


# --- a restarted agent ---------------------------------------------------------------


def test_adoption_is_recorded_with_what_was_rebuilt_and_left() -> None:
    host = declared(2)
    host.step(FULL, 0.0)
    host.advance(1)
    again = restarted(host, policy=host.policy)
    adopted = again.job.history[-1]
    assert (adopted.kind, adopted.before, adopted.after, adopted.reason) == (
        "adopted", "severe", "severe", "1 communicator(s) from the previous agent")
    assert again.job.level.level is Level.HIGH  # the choice's level: no step down at once
    rebuilt = restarted(host, policy=None)
    assert rebuilt.job.history[-1].reason == (
        "1 communicator(s) from the previous agent; 1 rebuilt from the ranks' records")
    assert rebuilt.job.choice == "severe"


def test_adopting_a_congested_policy_takes_its_level() -> None:
    host = declared(1)
    host.step(BUSY, 0.0)
    host.advance(1)
    again = restarted(host, policy=host.policy)
    assert again.job.choice == "congested" and again.job.level.level is Level.LOW
    assert again.job.desired_severity == 1


def test_adopting_mixed_choices_keeps_the_declared_default() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.add(1, comm=COMM + 1)  # joins later: armed with severe too ...
    host.advance(1, comm=COMM)
    entries = dict(host.job.entries)
    entries[COMM + 1] = dataclasses.replace(entries[COMM], comm_id=COMM + 1, after="congested",
                                            after_rules=CONGESTED_RULES)
    policy = build_policy(entries.values(), 7)  # ... but this one follows another choice
    again = restarted(host, policy=policy)
    assert again.job.choice == "default" and again.job.level.level is Level.NONE
    assert {e.after for e in again.job.entries.values()} == {"severe", "congested"}


def test_ranks_newer_than_the_file_win_and_ranks_with_nothing_are_skipped() -> None:
    host = declared(2)
    host.step(FULL, 0.0)
    host.advance(1)
    stale = build_policy([dataclasses.replace(host.entry(), revision=1, after="default",
                                              after_rules=(), pending=False)], 3)
    host.add(1, comm=COMM + 1)  # a communicator whose rank follows nothing yet
    again = restarted(host, policy=stale)
    entry = again.entry()
    assert (entry.after, entry.revision) == ("severe", 2)  # what the ranks hold
    assert again.entry(COMM + 1) is None
    assert "1 rebuilt from the ranks' records" in again.job.history[-1].reason


def test_a_file_newer_than_the_ranks_is_kept() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    newer = build_policy([dataclasses.replace(host.entry(), revision=9)], 4)
    again = restarted(host, policy=newer)
    assert again.entry().revision == 9
    assert "rebuilt" not in again.job.history[-1].reason


def test_an_orphan_is_named_and_forgotten_with_its_communicator() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.advance(1)
    new = Host(stall=5.0)
    new.ranks, new.sizes, new.policy = host.ranks, host.sizes, host.policy
    other = dataclasses.replace(DECLARATION, revision=2, tuning=(dataclasses.replace(
        DECLARATION.tuning[0], max_channels=12),))
    new.loop.declare(other, 10.0)
    new.loop.file(JOB, FILE)
    new.run(new.loop.adopt(JOB, None, new.slots(), 10.0), 10.0)
    assert new.job.history[-1].reason == (
        "0 communicator(s) from the previous agent; 1 left as their ranks hold them")
    new.run(new.loop.step(judged([FULL]), {JOB: []}, 11.0), 11.0)
    assert COMM in new.job.orphaned
    new.run(new.loop.step(judged([FULL]), {JOB: []}, 16.0), 16.0)
    assert COMM not in new.job.orphaned and COMM not in new.job.comms


def test_a_pending_change_of_a_communicator_with_no_visible_rank_is_kept() -> None:
    """Nobody on this host can say its ranks are local only: leave it for whoever can."""
    host = declared(1)
    host.step(CALM, 0.0)
    armed = host.loop._armed(host.job, host.job.comms[COMM], 150, DERIVED.get("severe"))
    policy = build_policy([armed], 5)
    new = Host()
    new.loop.declare(DECLARATION, 10.0)
    new.run(new.loop.adopt(JOB, policy, [], 10.0), 10.0)
    assert new.entry().pending and new.job.aborted == 0


def test_a_cancelled_adopted_change_counts_as_aborted() -> None:
    host = declared(2)
    host.step(CALM, 0.0)
    armed = host.loop._armed(host.job, host.job.comms[COMM], 150, DERIVED.get("severe"))
    host.policy = build_policy([armed], 5)
    for rank in host.ranks[COMM]:
        rank.see(host.policy.view(COMM))
    again = restarted(host, policy=host.policy)
    assert again.job.aborted == 1
    entry = again.entry()
    assert (entry.revision, entry.after_rules) == (armed.revision + 1, ())



# --- several hosts -------------------------------------------------------------------


def test_an_arm_is_recorded_with_its_decision_and_points() -> None:
    host = multi_host()
    arm(host, decision=4)
    armed = [c for c in host.job.history if c.kind == "armed"][-1]
    assert (armed.before, armed.after, armed.reason, armed.activations) == (
        "default", "severe", "decision 4", ((wire_comm(COMM), 2000),))
    entry = host.entry()
    assert (entry.decision, entry.before, entry.after, entry.revision) == (4, "default",
                                                                          "severe", 1)


def test_an_arm_while_another_decision_is_pending_is_refused() -> None:
    host = multi_host()
    arm(host, decision=1)
    refused = arm(host, decision=2, at=2500)
    assert refused.phase is AckPhase.REFUSED
    assert refused.reason == f"communicator {COMM:#x} has a change pending"
    assert host.entry().decision == 1 and host.entry().at == 2000
    refusal = host.job.history[-1]
    assert (refusal.kind, refusal.reason) == (
        "refused", f"decision 2: communicator {COMM:#x} has a change pending")


def test_an_outcome_for_another_decision_leaves_the_pending_change() -> None:
    host = multi_host()
    arm(host, decision=3)
    writes = host.writes
    ack = resolve(host, True, decision=4)
    assert ack.phase is AckPhase.RESOLVED
    assert host.entry().pending and host.writes == writes  # nothing of its own to write
    assert host.job.choice == "default"


def test_an_agreed_change_is_counted_and_explained() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    assert host.job.reason == "agreed with the job's other hosts (decision 1)"
    assert list(host.job.changes) == [2.0]
    confirmed = host.job.history[-1]
    assert (confirmed.kind, confirmed.before, confirmed.after, confirmed.reason) == (
        "confirmed", "default", "severe", "decision 1")
    assert host.entry().revision == 2
    # Confirming the choice already in force is no change.
    host.advance(2500)
    host.step(FULL, 2.5)
    arm(host, decision=2, at=4000)
    resolve(host, True, decision=2, at=4000)
    assert list(host.job.changes) == [2.0]


def test_a_cancelled_change_is_counted_as_aborted() -> None:
    host = multi_host()
    arm(host)
    ack = resolve(host, False)
    assert host.job.aborted == 1 and host.job.choice == "default"
    cancelled = host.job.history[-1]
    assert (cancelled.kind, cancelled.before, cancelled.after) == ("cancelled", "default",
                                                                  "default")
    entry = host.entry()
    assert (entry.pending, entry.after_rules, entry.revision) == (False, (), 2)
    assert ack.reason == "" and ack.decision == 1


def test_an_outcome_older_than_the_last_answer_is_ignored() -> None:
    host = multi_host()
    arm(host, decision=5)
    host.sent.clear()
    old = TuningResolve(JOB, 4, True, (Activation(wire_comm(COMM), 2000),))
    assert host.loop.resolve(old, 2.0) == []
    assert host.entry().pending


def test_a_repeated_arm_after_its_outcome_gets_the_outcome() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    again = arm(host)
    assert (again.phase, again.reason, again.decision) == (AckPhase.RESOLVED, "repeated", 1)


def test_an_adopted_pending_change_is_armed_by_its_point_not_its_decision() -> None:
    host = multi_host()
    arm(host, decision=6)
    again = restarted(host, policy=host.policy)
    assert again.entry().decision == 0 and again.entry().pending
    # The same decision armed again with its point is taken as already armed (the
    # service reads the ranks' records before it judges an arm).
    again.loop.refresh(JOB, again.slots(), 11.0)
    again.sent.clear()
    message = TuningArm(JOB, 6, "severe", DERIVED.fingerprint,
                        (Activation(wire_comm(COMM), 2000),))
    again.run(again.loop.arm(message, 11.0), 11.0)
    (ack,) = [m for m in again.sent if isinstance(m, TuningAck)]
    assert ack.phase is AckPhase.ARMED and again.entry().decision == 6
    # An outcome naming another switching point is not this entry's.
    other = restarted(host, policy=host.policy)
    wrong = TuningResolve(JOB, 6, True, (Activation(wire_comm(COMM), 2001),))
    other.run(other.loop.resolve(wrong, 11.0), 11.0)
    assert other.entry().pending


def test_a_multi_host_arm_is_checked_against_the_ranks_once_written() -> None:
    cases = {
        "its ranks are gone": lambda h: h.ranks.clear(),
        "a rank does not map the current policy file": lambda h: h.loop.file(JOB, (9, 9)),
        "a rank reached collective 1999 (switch at 2000)":
            lambda h: [r.__setattr__("n", 1999) for r in h.ranks[COMM]],
    }
    for why, tamper in cases.items():
        host = multi_host()
        host.between.append(lambda h=host, t=tamper: t(h))
        ack = arm(host)
        assert ack.phase is AckPhase.REFUSED, why
        assert ack.reason == f"{COMM:#x}: {why}"
        assert host.job.acking == 0


def test_a_single_host_arm_is_checked_against_every_rank_once_written() -> None:
    def hide_one(host: Host) -> None:
        host.ranks[COMM].pop()

    def newer(host: Host) -> None:
        for rank in host.ranks[COMM]:
            rank.held = dataclasses.replace(rank.held, revision=9)

    for tamper, why in [(hide_one, "1 of its 2 ranks visible"),
                        (newer, "a rank follows revision 9, newer than this agent's")]:
        host = Host(activation_margin=50)
        host.declare()
        host.add(2)
        host.step(CALM, 0.0)
        host.between.append(lambda h=host, t=tamper: t(h))
        host.step(FULL, 0.1)
        cancelled = host.job.history[-1]
        assert (cancelled.kind, cancelled.reason) == ("cancelled", f"{COMM:#x}: {why}")
        assert host.job.aborted == 1


def test_a_refusal_of_the_armed_revision_cancels_it() -> None:
    host = declared(1, activation_margin=50)
    host.step(CALM, 0.0)

    def refuse() -> None:
        rank = host.ranks[COMM][0]
        rank.unseen, rank.refused = None, host.entry().revision

    host.between.append(refuse)
    host.step(FULL, 0.1)
    assert host.job.history[-1].reason == f"{COMM:#x}: a rank refused revision 1"


def test_a_host_of_a_multi_host_job_says_what_it_waits_for() -> None:
    host = multi_host()
    assert host.job.reason == ("communicator spans hosts: changes are agreed through the "
                               "controller")
    assert host.job.waiting == ("wants severe: waiting for the controller to agree it with "
                                "the other hosts")
    arm(host)
    resolve(host, True)
    host.step(FULL, 2.5)
    assert host.job.waiting == ""


def test_reports_are_sent_on_change_and_at_the_interval_not_on_progress() -> None:
    host = multi_host()  # reported at 0.0
    host.sent.clear()
    host.advance(100)  # progress alone is no news
    host.step(FULL, 0.9)
    assert host.sent == []
    host.step(FULL, 1.0)  # the interval, exactly
    assert len(host.sent) == 1
    host.sent.clear()
    host.step(CALM, 1.1)  # held high: the same wish
    assert host.sent == []
    host.add(1, comm=COMM + 1, n_ranks=2, nodes=2)
    host.step(CALM, 1.2)  # another communicator: news at once
    (report,) = host.sent
    assert [c.comm for c in report.comms] == [wire_comm(COMM), wire_comm(COMM + 1)]


def test_a_report_names_each_communicator_with_ranks_here_once() -> None:
    host = Host(report_interval=1.0)
    host.declare()
    for i in range(MAX_COMMS + 2):
        host.add(1, comm=i + 1, n_ranks=2, nodes=2)
    host.step(FULL, 0.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert [c.comm for c in report.comms] == list(range(1, MAX_COMMS + 1))
    assert all(c.choice == "default" and c.at == 0 and not c.pending for c in report.comms)
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(1)}, 2.0), 2.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert [c.comm for c in report.comms] == [1]  # the others have no rank this pass


def test_a_report_counts_waiting_and_refusing_ranks() -> None:
    host = multi_host()
    slots = host.slots()
    slots[0] = dataclasses.replace(slots[0], flags=slots[0].flags | 0x4, wait_at=9)
    slots[1] = dataclasses.replace(slots[1], flags=slots[1].flags | 0x8, refused_revision=3)
    host.sent.clear()
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 5.0), 5.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    (comm,) = report.comms
    assert (comm.waiting, comm.refused) == (1, 1)


def test_an_answer_carries_a_bounded_reason() -> None:
    host = multi_host()
    long = "x" * 3000
    ack = host.loop._ack(host.job, 7, AckPhase.REFUSED, long).message
    assert ack.reason == "x" * 1000 and host.job.acked == (7, AckPhase.REFUSED)
    host.loop._ack(host.job, 2, AckPhase.RESOLVED, "")
    assert host.job.acked == (7, AckPhase.RESOLVED)  # the newest decision is kept
    stranger = host.loop._ack("job-9", 1, AckPhase.REFUSED, long).message
    assert stranger.reason == "x" * 1000 and stranger.comms == ()


def test_a_withdrawn_multi_host_job_retires_once_its_ranks_follow_nccl() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    host.advance(2500)
    host.step(FULL, 2.5)
    host.run(host.loop.withdraw(JOB, 3.0), 3.0)
    assert JOB in host.loop.jobs  # severe in force: the controller agrees the way back
    assert host.job.waiting == ("withdrawn: returning to NCCL's choices before removing the "
                                "policy")
    host.step(FULL, 3.5)
    assert JOB in host.loop.jobs and host.entry().after == "severe"  # never alone
    arm(host, decision=2, at=4000, choice="default")
    resolve(host, True, decision=2, at=4000)
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots()}, 5.0), 5.0)
    assert JOB not in host.loop.jobs


def test_a_withdrawn_multi_host_job_with_no_ranks_left_retires() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    host.run(host.loop.withdraw(JOB, 3.0), 3.0)
    actions = host.loop.step(judged([FULL]), {JOB: []}, 4.0)
    assert Retire(JOB) in actions


def test_shutdown_leaves_multi_host_jobs_as_agreed() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    writes = host.writes
    host.run(host.loop.shutdown({JOB: host.slots()}, 3.0), 3.0)
    assert host.writes == writes and host.entry().after == "severe"
    assert host.job.choice == "severe"


def test_shutdown_writes_only_where_something_was_armed() -> None:
    host = declared(1)
    host.step(CALM, 0.0)
    assert host.loop.shutdown({JOB: host.slots()}, 1.0) == []


def test_pending_activations_count_armed_and_unpassed_switches() -> None:
    host = declared(2, hold=0.0, activation_margin=100)
    host.step(CALM, 0.0)
    assert host.loop.pending_activations(JOB) == 0
    host.step(FULL, 0.1)
    at = host.entry().at
    assert host.loop.pending_activations(JOB) == 1  # confirmed, not yet passed
    host.advance(at + 1, rank=0)
    host.step(FULL, 0.2)
    assert host.loop.pending_activations(JOB) == 1  # one rank still before it
    host.advance(at + 1, rank=1)
    host.step(FULL, 0.3)
    assert host.loop.pending_activations(JOB) == 0
    multi = multi_host()
    arm(multi)
    assert multi.loop.pending_activations(JOB) == 1  # armed, not resolved


# --- several jobs, communicators that come and go -------------------------------------


def two_jobs() -> tuple[Host, Host]:
    first = declared(1, hold=0.0)
    second = Host(hold=0.0)
    second.loop = first.loop
    second.declare(dataclasses.replace(DECLARATION, job="job-2"))
    second.add(1, comm=0xB0B)
    return first, second


def test_a_retiring_job_does_not_stop_the_others_being_stepped() -> None:
    first, second = two_jobs()
    loop = first.loop
    first.run(loop.step(judged([FULL]), {JOB: first.slots(), "job-2": second.slots()}, 0.0), 0.0)
    assert first.entry() is not None
    loop.withdraw(JOB, 0.5)
    first.advance(100_000)
    actions = loop.step(judged([FULL]), {JOB: first.slots(), "job-2": second.slots()}, 1.0)
    assert {a.job for a in actions if isinstance(a, WritePolicy)} == {JOB, "job-2"}
    assert loop.jobs["job-2"].choice == "severe"


def test_a_multi_host_job_does_not_stop_the_others_being_stepped() -> None:
    first = multi_host()
    other = Host()
    other.loop = first.loop
    other.declare(dataclasses.replace(DECLARATION, job="job-3"))
    other.add(1, comm=0xC0C)
    loop = first.loop
    actions = loop.step(judged([FULL]), {JOB: first.slots(), "job-3": other.slots()}, 2.0)
    assert any(isinstance(a, Publish) and isinstance(a.message, TuningReport)
               for a in actions)
    assert any(isinstance(a, WritePolicy) and a.job == "job-3" for a in actions)
    arm(first)
    resolve(first, True)
    loop.withdraw(JOB, 2.5)  # severe in force: it stays until the way back is agreed
    loop.step(judged([FULL]), {JOB: first.slots(), "job-3": other.slots()}, 3.0)
    assert JOB in loop.jobs
    actions = loop.step(judged([FULL]), {"job-3": other.slots()}, 4.0)  # job-1's ranks left
    assert Retire(JOB) in actions and JOB not in loop.jobs
    assert loop.jobs["job-3"].last_step == 4.0


def test_a_communicator_gone_for_the_stall_time_is_forgotten_entirely() -> None:
    host = declared(1, stall=2.0)
    for i in range(MAX_COMMS):
        host.add(1, comm=COMM + 1 + i)
    host.step(FULL, 0.0)
    assert COMM + MAX_COMMS in host.job.unlisted
    host.run(host.loop.step(judged([FULL]), {JOB: []}, 1.9), 1.9)
    assert len(host.job.entries) == MAX_COMMS
    actions = host.loop.step(judged([FULL]), {JOB: []}, 2.0)
    assert actions == [WritePolicy(JOB, ())]  # the entries went: the file says so
    assert host.job.comms == {} and host.job.unlisted == set()


def test_a_communicator_forgotten_before_its_arm_was_checked_is_not_checked() -> None:
    """The shell may fail to write an armed policy; if the communicator is then
    forgotten, the next check must not look for it."""
    host = declared(1, stall=1.0, activation_margin=50)
    host.step(CALM, 0.0)
    host.loop.step(judged([FULL]), {JOB: host.slots()}, 0.1)  # armed; never written nor checked
    assert host.job.arming
    host.loop.step(judged([FULL]), {JOB: []}, 1.1)
    assert host.job.arming == {} and host.job.entries == {}
    assert host.loop.confirm({JOB: []}, 1.2) == []


def test_a_communicator_seen_on_several_nodes_makes_the_job_multi_host() -> None:
    host = declared(1)
    host.step(CALM, 0.0)
    assert not host.job.multi
    host.add(1, comm=COMM + 1, n_ranks=2, nodes=2)
    host.step(CALM, 1.0)
    assert host.job.multi
    assert host.job.reason.startswith("communicator spans hosts")


def test_local_disagreement_names_the_communicator() -> None:
    host = declared(2)
    slots = disagreeing(host)
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 0.0), 0.0)
    (diverged,) = host.job.diverged
    assert diverged.startswith(f"{COMM:#x}: ")
    event = host.job.history[-1]
    assert event.reason.startswith(f"communicator {COMM:#x}: ")
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 0.1), 0.1)
    assert [c.kind for c in host.job.history].count("diverged") == 1  # once, as it began
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.2), 0.2)
    assert host.entry() is None and "its ranks disagree" in host.job.waiting


def test_the_collective_rate_is_the_fastest_of_recent_passes() -> None:
    host = declared(1, activation_margin=1, activation_lead=0.5)
    host.step(CALM, 0.0)
    host.advance(3000)
    host.step(CALM, 1.0)   # 3000/s
    host.advance(1000)
    host.step(CALM, 2.0)   # 1000/s
    host.step(CALM, 2.0)   # no time passed: no rate
    comm = host.job.comms[COMM]
    assert list(comm.rates) == [3000.0, 1000.0] and comm.rate == 3000.0
    assert host.loop._margin(comm) == 1500  # 3000/s for half a second
    host.step(FULL, 3.0)   # 0/s
    assert host.entry().at == 4000 + 1500
    for i in range(8):
        host.step(FULL, 4.0 + i)
    assert comm.rate == 0.0 and host.loop._margin(comm) == 1  # the window forgot


# --- adoption, rule by rule ----------------------------------------------------------


def test_an_adopted_entry_keeps_both_sides_of_its_switch() -> None:
    host = declared(1, hold=0.0)
    host.step(FULL, 0.0)
    host.advance(100_000)
    host.step(BUSY, 1.0)
    host.step(BUSY, 1.1)  # severe -> congested
    host.advance(1)  # the rank took it
    held = host.entry()
    assert (held.before, held.after) == ("severe", "congested")
    for policy in (host.policy, None):
        again = restarted(host, policy=policy)
        entry = again.entry()
        assert (entry.before, entry.after) == ("severe", "congested"), policy
        assert (entry.before_rules, entry.after_rules) == (SEVERE_RULES, CONGESTED_RULES)
        assert (entry.at, entry.revision, entry.pending) == (held.at, held.revision, False)
        assert again.job.history[-1].time == 10.0


def test_after_adoption_nothing_is_written_until_something_changes() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.advance(1)
    loop = TuningLoop(LoopSettings())
    loop.declare(DECLARATION, 10.0)
    actions = loop.adopt(JOB, host.policy, host.slots(), 10.0)
    assert actions == [WritePolicy(JOB, tuple(loop.jobs[JOB].entries.values()))]
    assert loop.step(judged([FULL]), {JOB: host.slots()}, 11.0) == []


def test_adopting_what_the_ranks_follow_when_nccl_was_restored() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.advance(host.entry().at + 1)
    host.run(host.loop.shutdown({JOB: host.slots()}, 1.0), 1.0)  # back to NCCL's choice
    host.advance(1)
    again = restarted(host, policy=None)
    assert again.job.choice == "default" and again.job.level.level is Level.NONE
    assert again.entry().after == "default"


def test_adoption_goes_through_every_communicator() -> None:
    """One skipped communicator (nothing held, newer in the file, or its rules unknown)
    must not stop the others being adopted."""
    host = declared(1, comm=1)
    host.add(1, comm=2)
    host.add(1, comm=3)
    host.step(FULL, 0.0)
    host.advance(1, comm=1)
    host.advance(1, comm=2)
    host.advance(1, comm=3)
    host.add(1, comm=0)  # follows nothing
    host.ranks[2][0].held = dataclasses.replace(host.ranks[2][0].held, after=12345)  # unknown
    newer = dict(host.job.entries)
    newer[3] = dataclasses.replace(newer[3], revision=8)
    stale = build_policy([newer[3]], 4)  # lists only 3, newer than its rank
    order = [0, 2, 3, 1]
    host.ranks = {c: host.ranks[c] for c in order}
    again = restarted(host, policy=stale)
    assert again.job.orphaned == {2}
    assert set(again.job.entries) == {1, 3}
    assert again.entry(3).revision == 8 and again.entry(1).after == "severe"


def test_a_pending_change_rebuilt_from_the_ranks_stays_pending_for_the_controller() -> None:
    host = multi_host()
    arm(host)
    host.advance(1)
    again = restarted(host, policy=None)
    entry = again.entry()
    assert (entry.at, entry.revision, entry.pending, entry.after) == (2000, 1, True, "severe")
    assert again.job.aborted == 0


# --- the two phases, communicator by communicator ------------------------------------

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


def test_refusals_say_exactly_why() -> None:
    host = multi_host()
    refused = arm(host, decision=2, fingerprint="other")
    assert refused.reason == ("this host derived other rules from its declaration "
                              f"({DERIVED.fingerprint}, not other)")
    bogus = arm(host, decision=3, choice="bogus")
    assert bogus.reason.startswith("unknown choice 'bogus'")
    ok = arm(host, decision=4)
    assert (ok.phase, ok.reason, ok.decision) == (AckPhase.ARMED, "", 4)


def test_an_arm_for_no_communicator_here_is_armed_with_nothing_to_do() -> None:
    host = multi_host()
    writes = host.writes
    host.sent.clear()
    message = TuningArm(JOB, 1, "severe", DERIVED.fingerprint, (Activation(12345, 2000),))
    host.run(host.loop.arm(message, 1.0), 1.0)
    (ack,) = [m for m in host.sent if isinstance(m, TuningAck)]
    assert (ack.phase, ack.reason) == (AckPhase.ARMED, "")
    assert host.entry() is None and host.writes == writes + 1


def test_an_unknown_jobs_outcome_is_answered_with_its_decision() -> None:
    loop = TuningLoop(LoopSettings())
    (answer,) = loop.resolve(TuningResolve("job-z", 8, False, ()), 0.0)
    assert answer.message.decision == 8 and answer.message.job == "job-z"


def test_an_arm_makes_a_job_multi_host_even_before_its_ranks_say_so() -> None:
    host = declared(2)
    host.advance(500)
    host.step(CALM, 0.0)
    assert not host.job.multi
    assert arm(host).phase is AckPhase.ARMED
    assert host.job.multi  # from now on the controller decides
    host.step(FULL, 1.5)
    assert host.entry().pending and host.job.choice == "default"


def test_an_arm_adds_to_what_a_previous_agent_armed() -> None:
    host = two_comm_multi_host()
    arm_comms(host, 1, {A: 2000})
    host.policy = build_policy([host.entry(A)], 3)  # B had nothing armed
    new = restarted(host, policy=host.policy)
    assert set(new.job.entries) == {A}
    new.loop.refresh(JOB, new.slots(), 10.0)
    ack = arm_comms(new, 1, {A: 2000, B: 2000})
    assert ack.phase is AckPhase.ARMED
    assert new.entry(A).pending and new.entry(B).pending
    assert new.entry(A).decision == new.entry(B).decision == 1


def test_an_outcome_resolves_every_communicator_it_names() -> None:
    host = two_comm_multi_host()
    arm_comms(host, 1, {A: 2000})
    resolve_comms(host, 1, {A: 2000})
    host.advance(2500, comm=A)
    host.step(FULL, 2.5)
    arm_comms(host, 2, {B: 3000})
    assert not host.entry(A).pending and host.entry(B).pending
    resolve_comms(host, 2, {B: 3000}, now=3.0)
    assert host.entry(B).pending is False and host.entry(B).after == "severe"


def test_a_settled_communicator_does_not_block_arming_another() -> None:
    host = two_comm_multi_host()
    arm_comms(host, 1, {A: 2000})
    resolve_comms(host, 1, {A: 2000})
    host.advance(2500, comm=A)  # A's ranks far past its switch
    host.step(FULL, 2.5)
    ack = arm_comms(host, 2, {B: 2000})
    assert (ack.phase, ack.reason) == (AckPhase.ARMED, "")


def test_confirming_goes_through_every_job() -> None:
    quiet = Host()
    quiet.declare(JobDeclaration("job-0", revision=1))  # nothing to tune, stepped first
    host = Host(activation_margin=50)
    host.loop = quiet.loop
    host.declare()
    host.add(1)
    other = Host(activation_margin=50)
    other.loop = quiet.loop
    other.declare(dataclasses.replace(DECLARATION, job="job-2"))
    other.add(1, comm=0xB0B)
    loop = quiet.loop
    loop.step(judged([CALM]), {JOB: host.slots(), "job-2": other.slots()}, 0.0)
    loop.step(judged([FULL]), {JOB: host.slots(), "job-2": other.slots()}, 0.1)
    assert loop.jobs[JOB].arming and loop.jobs["job-2"].arming
    actions = loop.confirm({JOB: host.slots(), "job-2": other.slots()}, 0.1)
    assert {a.job for a in actions if isinstance(a, WritePolicy)} == {JOB, "job-2"}
    assert not loop.jobs[JOB].entries[COMM].pending
    assert not loop.jobs["job-2"].entries[0xB0B].pending


def test_a_job_missing_from_the_records_cancels_what_it_armed() -> None:
    host = declared(1, activation_margin=50)
    host.step(CALM, 0.0)
    host.loop.step(judged([FULL]), {JOB: host.slots()}, 0.1)
    host.loop.confirm({}, 0.1)
    assert host.job.history[-1].reason == f"{COMM:#x}: its ranks are gone"
    assert host.entry().pending is False and host.entry().after == "default"


def test_cancellations_are_listed_and_added_up() -> None:
    host = declared(1, comm=A, activation_margin=50, hold=0.0)
    host.add(1, comm=B)
    host.step(CALM, 0.0)

    def both_gone() -> None:
        host.ranks[A].clear()
        host.ranks[B].clear()

    host.between.append(both_gone)
    host.step(FULL, 0.1)
    cancelled = host.job.history[-1]
    assert cancelled.reason == f"{A:#x}: its ranks are gone; {B:#x}: its ranks are gone"
    assert host.job.aborted == 2
    host.add(1, comm=A)
    host.add(1, comm=B)
    host.between.append(both_gone)
    host.step(FULL, 0.2)
    assert host.job.aborted == 4


def test_a_confirmation_lists_where_each_communicator_switches() -> None:
    host = declared(1, comm=A, activation_margin=50)
    host.add(1, comm=B)
    host.step(CALM, 0.0)
    host.step(FULL, 0.1)
    confirmed = host.job.history[-1]
    assert confirmed.kind == "confirmed" and confirmed.reason == "2 communicator(s)"
    assert confirmed.activations == ((A, host.entry(A).at), (B, host.entry(B).at))
    assert host.entry(A).pending is False


# --- what operators read, word for word ----------------------------------------------


def blocked(tamper, *, entry_revision: int | None = None, n_ranks: int | None = None,
            count: int = 2) -> str:
    """Why one congested pass arms nothing when ``tamper`` changes the second rank."""
    host = declared(count, n_ranks=n_ranks)
    host.advance(100)
    slots = host.slots()
    slots[-1] = tamper(slots[-1])
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.0), 0.0)
    assert host.entry() is None
    (comm,) = host.job.comms.values()
    assert host.job.waiting == f"communicator {COMM:#x}: {comm.waiting}"
    return comm.waiting


def same(slot):
    return slot


def test_each_reason_not_to_arm_is_named_exactly() -> None:
    assert blocked(lambda s: dataclasses.replace(s, flags=s.flags | 0x4, wait_at=3)) == (
        "a rank waits at collective 3")
    assert blocked(lambda s: dataclasses.replace(s, flags=s.flags | 0x10)) == (
        "a rank defers a copy until it passes its own switch")
    assert blocked(lambda s: dataclasses.replace(s, policy_file=(1, 3))) == (
        "a rank does not map the current policy file yet")
    assert blocked(lambda s: dataclasses.replace(s, revision=1)) == (
        "a rank follows revision 1, newer than this agent's")
    assert blocked(lambda s: dataclasses.replace(s, flags=s.flags | 0x8,
                                                 refused_revision=0)) == (
        "a rank refused revision 0")
    assert blocked(same, n_ranks=3) == "2 of its 3 ranks visible"
    assert blocked(same, n_ranks=2, count=3) == (
        "3 ranks share its id, more than its 2: ambiguous (NCCL before 2.28 gives no "
        "communicator id)")


def test_a_refusal_only_blocks_while_it_is_of_the_newest_revision() -> None:
    host = declared(2, hold=0.0)
    host.step(FULL, 0.0)
    host.advance(100_000)
    revision = host.entry().revision
    slots = host.slots()
    slots[1] = dataclasses.replace(slots[1], flags=slots[1].flags | 0x8,
                                   refused_revision=revision - 1)
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 1.0), 1.0)
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 1.1), 1.1)
    assert host.entry().after == "default"  # an older refusal: the ranks moved on
    unflagged = declared(2, hold=0.0)
    slots = unflagged.slots()
    slots[1] = dataclasses.replace(slots[1], refused_revision=5)  # flag clear: no refusal
    unflagged.run(unflagged.loop.step(judged([FULL]), {JOB: slots}, 0.0), 0.0)
    assert unflagged.entry() is not None


def test_a_rank_on_the_current_revision_does_not_block() -> None:
    host = declared(1, hold=0.0)
    host.step(FULL, 0.0)
    host.advance(100_000)  # the rank follows the confirmed revision, and passed it
    host.step(CALM, 1.0)
    host.step(CALM, 1.1)
    assert host.entry().after == "default" and host.job.waiting == ""


def test_an_unfiled_policy_file_is_not_held_against_the_ranks() -> None:
    loop = TuningLoop(LoopSettings())
    loop.declare(DECLARATION, 0.0)  # the shell never said which file
    host = Host()
    host.loop = loop
    host.add(1)
    loop.step(judged([FULL]), {JOB: host.slots()}, 0.0)
    loop.confirm({JOB: host.slots()}, 0.0)
    assert loop.jobs[JOB].entries[COMM].after == "severe"


def test_a_point_less_than_two_collectives_ahead_is_too_close_to_arm() -> None:
    host = multi_host()  # ranks at 500
    too_close = arm(host, at=501)
    assert too_close.reason == f"{COMM:#x}: a rank reached collective 500 (switch at 501)"
    assert arm(host, decision=2, at=502).phase is AckPhase.ARMED


def test_a_point_less_than_two_collectives_ahead_is_too_close_to_confirm() -> None:
    for lead, ok in [(1, False), (2, True)]:
        host = multi_host()

        def close(h: Host = host, lead: int = lead) -> None:
            for rank in h.ranks[COMM]:
                rank.n = 2000 - lead

        host.between.append(close)
        ack = arm(host)
        assert (ack.phase is AckPhase.ARMED) is ok, lead


def test_a_rank_exactly_at_a_switch_has_not_passed_it() -> None:
    host = declared(1, hold=0.0, activation_margin=100)
    host.step(FULL, 0.0)
    at = host.entry().at
    host.advance(at - host.ranks[COMM][0].n)  # its next collective is the switch
    host.step(FULL, 0.1)
    assert host.ranks[COMM][0].n == at and host.loop.pending_activations(JOB) == 1
    host.advance(1)
    host.step(FULL, 0.2)
    assert host.loop.pending_activations(JOB) == 0


def test_a_local_change_is_this_agents_own_and_a_cancel_is_final() -> None:
    host = declared(2, activation_margin=50)
    host.step(CALM, 0.0)
    host.step(FULL, 0.1)
    assert host.entry().decision == 0 and host.entry().pending is False
    raced = declared(2, activation_margin=50)
    raced.step(CALM, 0.0)
    race(raced)
    raced.step(FULL, 0.1)
    entry = raced.entry()
    assert (entry.pending, entry.revision) == (False, 2)


def test_refusals_are_dated_by_the_jobs_last_pass() -> None:
    host = Host()
    host.declare(now=3.0)
    host.sent.clear()
    host.run(host.loop.arm(TuningArm(JOB, 1, "severe", "other", ()), 9.0), 9.0)
    assert host.job.history[-1].time == 3.0  # no pass yet: its declaration
    host.step(CALM, 4.0)
    host.run(host.loop.arm(TuningArm(JOB, 2, "severe", "other", ()), 9.0), 9.0)
    refusal = host.job.history[-1]
    assert (refusal.kind, refusal.time) == ("refused", 4.0)
    assert refusal.reason.startswith("decision 2: this host derived other rules")


def test_a_fresh_loop_says_there_is_no_congestion() -> None:
    loop = TuningLoop(LoopSettings())
    assert loop.evidence == "no congestion on the job's links" and loop.steps == 0
    loop.step(judged([]), {}, 0.0)
    assert loop.steps == 1


def test_a_link_without_a_known_speed_counts_as_idle() -> None:
    loop = TuningLoop(LoopSettings())
    unknown = dataclasses.replace(FULL, utilization=None, ce_fraction=THRESHOLDS.ce_high)
    level, evidence, _ = loop._links(judged([unknown]))
    assert level is Level.HIGH
    assert evidence == (f"eth0: high: utilization 0%, CE/CNP {THRESHOLDS.ce_high:.2%}, "
                        "retransmits 0.00%")


def test_low_congestion_counts_as_congested_time_and_retransmits_are_remembered() -> None:
    host = declared(1, hold=100.0)
    host.step(CALM, 0.0)
    host.step(BUSY, 1.0)
    host.step(BUSY, 2.0)
    assert host.job.congested == pytest.approx(2.0)  # each span ending congested
    lossy = dataclasses.replace(CALM, retransmit_fraction=THRESHOLDS.retransmit_low,
                                packets_per_s=THRESHOLDS.min_packets_per_s)
    host.step(lossy, 3.0)
    host.step(CALM, 4.0)
    assert host.job.retransmitting is True  # since the job began, not only now


def test_a_job_absent_from_the_records_is_still_stepped() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.run(host.loop.step(judged([FULL]), {}, 1.0), 1.0)
    assert host.job.last_step == 1.0 and host.entry() is not None
    host.run(host.loop.shutdown({}, 2.0), 2.0)


def test_after_a_change_a_quiet_pass_writes_nothing_and_waits_for_nothing() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    writes = host.writes
    host.step(FULL, 0.5)
    assert host.writes == writes and host.job.waiting == ""


def test_one_communicator_not_ready_does_not_hold_back_the_others() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    slots = host.slots()
    slots[0] = dataclasses.replace(slots[0], flags=slots[0].flags | 0x10)  # A defers
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.0), 0.0)
    assert host.entry(A) is None and host.entry(B).after == "severe"
    assert host.job.waiting.startswith(f"communicator {A:#x}: a rank defers")


def test_a_communicator_without_ranks_this_pass_does_not_hold_back_the_others() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    host.step(CALM, 0.0)
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(B)}, 0.1), 0.1)
    assert host.entry(A) is None and host.entry(B).after == "severe"


def test_communicators_still_listed_are_kept_when_another_is_forgotten() -> None:
    host = declared(1, comm=A, stall=5.0)
    host.add(1, comm=B)
    host.step(FULL, 6.0)
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(A)}, 7.0), 7.0)
    assert set(host.job.comms) == {A, B}  # seen at 6 s: 1 s is not the stall time
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(A)}, 11.0), 11.0)
    assert set(host.job.comms) == {A} and set(host.job.entries) == {A}


def test_a_report_is_capped_to_what_the_wire_carries() -> None:
    host = multi_host()
    huge = 2**63
    slots = [dataclasses.replace(s, collectives=huge, last_switch=huge - 1) for s in host.slots()]
    host.job.entries[COMM] = dataclasses.replace(
        host.loop._armed(host.job, host.job.comms[COMM], huge, DERIVED.get("severe")))
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.5), 0.5)
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 5.0), 5.0)
    reports = [m for m in host.sent if isinstance(m, TuningReport)]
    comm = reports[-1].comms[0]
    assert reports[-1].job == JOB
    assert (comm.collectives_min, comm.collectives_max, comm.at) == (2**62, 2**62, 2**62)
    assert comm.per_second == 1e9
    assert (comm.ahead.last_switch, comm.ahead.collectives) == (2**62, 2**62)
    assert (comm.behind.last_switch, comm.behind.collectives) == (2**62, 2**62)


def test_reports_list_communicators_by_id_and_skip_those_without_ranks() -> None:
    host = Host(report_interval=1.0)
    host.declare()
    for comm in (9, 3, 7):
        host.add(1, comm=comm, n_ranks=2, nodes=2)
    host.step(FULL, 0.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert [c.comm for c in report.comms] == [3, 7, 9]
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(9)}, 2.0), 2.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert [c.comm for c in report.comms] == [9]


def test_a_report_says_when_the_ranks_here_disagree() -> None:
    host = multi_host()
    slots = disagreeing(host)
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.5), 0.5)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert report.comms[0].diverged is True


def test_an_armed_answer_carries_the_ranks_state() -> None:
    host = multi_host()
    ack = arm(host)
    (comm,) = ack.comms
    assert (comm.comm, comm.pending, comm.at) == (wire_comm(COMM), True, 2000)


# --- a withdrawn job, step by step ---------------------------------------------------


def test_a_withdrawn_job_waits_for_its_way_back_to_be_passed() -> None:
    host = declared(1, activation_margin=100)
    host.step(FULL, 0.0)
    host.advance(host.entry().at + 1)
    host.step(FULL, 0.5)
    host.run(host.loop.withdraw(JOB, 1.0), 1.0)
    back = host.entry()
    assert back.after == "default" and not back.pending
    host.step(FULL, 2.0)
    assert JOB in host.loop.jobs  # the way back is not passed yet
    host.advance(back.at - host.ranks[COMM][0].n)
    host.step(FULL, 3.0)
    assert JOB in host.loop.jobs  # at the switch, not past it
    host.advance(1)
    host.step(FULL, 4.0)
    assert JOB not in host.loop.jobs


def test_a_withdrawn_job_with_a_change_pending_waits_for_it() -> None:
    host = declared(1)
    host.step(CALM, 0.0)
    host.job.entries[COMM] = host.loop._armed(host.job, host.job.comms[COMM], 5000,
                                              DERIVED.get("default"))
    actions = host.loop.withdraw(JOB, 1.0)
    assert Retire(JOB) not in actions and JOB in host.loop.jobs


def test_a_withdrawn_multi_host_job_without_entries_retires_at_once() -> None:
    host = multi_host()
    assert host.loop.withdraw(JOB, 1.0) == [Retire(JOB)]


def test_a_withdrawn_multi_host_job_writes_what_it_forgot() -> None:
    host = two_comm_multi_host()
    arm_comms(host, 1, {A: 2000, B: 2000})
    resolve_comms(host, 1, {A: 2000, B: 2000})
    host.advance(2500, comm=A)
    host.advance(2500, comm=B)
    host.step(FULL, 2.5)
    host.run(host.loop.withdraw(JOB, 3.0), 3.0)
    host.loop.step(judged([FULL]), {JOB: host.slots(A)}, 3.5)
    actions = host.loop.step(judged([FULL]), {JOB: host.slots(A)}, 14.0)  # B forgotten
    (write,) = [a for a in actions if isinstance(a, WritePolicy)]
    assert [e.comm_id for e in write.entries] == [A]
    assert JOB in host.loop.jobs


def test_jobs_after_a_retiring_or_multi_host_one_keep_their_actions() -> None:
    loop = TuningLoop(LoopSettings(report_interval=0.05))
    first, multi, leaving = Host(), Host(), Host()
    for host, job in ((first, JOB), (multi, "job-m"), (leaving, "job-q")):
        host.loop = loop
        host.declare(dataclasses.replace(DECLARATION, job=job))
    first.add(1)
    multi.add(1, comm=0xD0D, n_ranks=2, nodes=2)
    leaving.add(1, comm=0xE0E)

    def stats() -> dict[str, list]:
        return {JOB: first.slots(), "job-m": multi.slots(), "job-q": leaving.slots()}

    leaving.run(loop.step(judged([FULL]), stats(), 0.0), 0.0)  # job-q takes severe
    leaving.advance(100_000, comm=0xE0E)
    leaving.run(loop.step(judged([FULL]), stats(), 0.1), 0.1)
    leaving.run(loop.withdraw("job-q", 0.2), 0.2)  # and arms its way back
    leaving.advance(1_000_000, comm=0xE0E)  # past the way back (a fast communicator)
    first.advance(100_000)
    actions = loop.step(judged([FULL]), stats(), 0.3)  # job-q passed its way back
    assert any(isinstance(a, WritePolicy) and a.job == JOB for a in actions)
    assert any(isinstance(a, Publish) and a.message.job == "job-m" for a in actions)
    assert Retire("job-q") in actions


# --- what a second mutation pass found unpinned ----------------------------------------


def test_rules_of_an_older_declaration_are_rebuilt_from_the_old_file_as_previous() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    host.step(FULL, 0.0)
    host.advance(1, comm=A)
    host.advance(1, comm=B)
    # The file is older than the ranks (revision 1), but it still holds the old rules;
    # B's ranks follow rules nobody can name.
    stale = build_policy([dataclasses.replace(host.entry(A), revision=1),
                          dataclasses.replace(host.entry(B), revision=1)], 3)
    rank_b = host.ranks[B][0]
    rank_b.held = dataclasses.replace(rank_b.held, after=4242)
    new = Host()
    new.ranks, new.sizes, new.policy = host.ranks, host.sizes, stale
    other = dataclasses.replace(DECLARATION, revision=2, tuning=(dataclasses.replace(
        DECLARATION.tuning[0], max_channels=12),))  # other rules from now on
    new.loop.declare(other, 10.0)
    new.loop.file(JOB, FILE)
    new.run(new.loop.adopt(JOB, stale, new.slots(), 10.0), 10.0)
    entry = new.entry(A)
    assert (entry.after, entry.after_rules, entry.revision) == ("previous", SEVERE_RULES, 2)
    assert new.entry(B) is None and new.job.orphaned == {B}  # not the file's stale entry
    assert new.job.history[-1].reason == (
        "1 communicator(s) from the previous agent; 1 rebuilt from the ranks' records; "
        "1 left as their ranks hold them")


def test_every_change_a_dead_agent_armed_alone_is_cancelled() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    host.step(CALM, 0.0)
    armed = [host.loop._armed(host.job, host.job.comms[c], 150, DERIVED.get("severe"))
             for c in (A, B)]
    host.policy = build_policy(armed, 5)
    again = restarted(host, policy=host.policy)
    assert again.job.aborted == 2
    assert not again.entry(A).pending and not again.entry(B).pending


def test_two_rebuilt_communicators_are_counted() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    host.step(FULL, 0.0)
    host.advance(1, comm=A)
    host.advance(1, comm=B)
    again = restarted(host, policy=None)
    assert again.job.history[-1].reason == (
        "2 communicator(s) from the previous agent; 2 rebuilt from the ranks' records")


def test_a_withdrawal_is_recorded() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.run(host.loop.withdraw(JOB, 1.0), 1.0)
    withdrawn = [c for c in host.job.history if c.kind == "withdrawn"]
    assert [(c.before, c.after, c.reason, c.time) for c in withdrawn] == [
        ("severe", "default", "declaration withdrawn", 1.0)]


def test_every_cancel_counts() -> None:
    host = multi_host()
    arm(host, decision=1)
    resolve(host, False, decision=1)
    host.step(FULL, 2.5)
    arm(host, decision=2, at=3000)
    resolve(host, False, decision=2, at=3000)
    assert host.job.aborted == 2


def test_a_rank_that_already_took_the_armed_copy_confirms_it() -> None:
    host = declared(2, activation_margin=50)
    host.step(CALM, 0.0)
    host.between.append(lambda: host.advance(1))  # both take the armed copy, below `at`
    host.step(FULL, 0.1)
    assert host.job.history[-1].kind == "confirmed"
    assert not host.entry().pending


def test_a_stale_refusal_number_without_the_flag_confirms() -> None:
    host = declared(1, activation_margin=50)
    host.step(CALM, 0.0)

    def stale() -> None:
        host.ranks[COMM][0].refused = None  # no refusal flagged ...

    host.between.append(stale)
    original = host.ranks[COMM][0].slot

    def slot(*args, **kwargs):
        return dataclasses.replace(original(*args, **kwargs), refused_revision=9)  # ... a number

    host.ranks[COMM][0].slot = slot  # type: ignore[method-assign]
    host.step(FULL, 0.1)
    assert host.job.history[-1].kind == "confirmed"


def test_a_fall_is_dated_by_its_own_pass_and_a_late_rise_by_its_onset() -> None:
    host = declared(1, hold=0.0, max_changes_per_minute=2)
    host.step(FULL, 0.0)                   # pass 1: severe (rise)
    host.advance(100_000)
    host.step(BUSY, 1.0)
    host.step(BUSY, 1.1)                   # pass 3: congested (fall)
    fall = [c for c in host.job.history if c.kind == "local"][-1]
    assert (fall.after, fall.step, fall.onset_step) == ("congested", 3, 3)
    host.advance(100_000)
    host.step(CALM, 2.0)
    host.step(FULL, 2.1)                   # pass 5: the rise waits for the rate limit
    assert host.job.choice == "congested"
    host.step(FULL, 60.5)                  # pass 6: the change at 0 s no longer counts
    rise = [c for c in host.job.history if c.kind == "local"][-1]
    assert (rise.after, rise.step, rise.onset_step) == ("severe", 6, 5)


def test_an_answer_names_its_job() -> None:
    host = multi_host()
    assert arm(host).job == JOB
    assert resolve(host, True).job == JOB


def test_a_link_skipped_does_not_hide_the_next_one() -> None:
    loop = TuningLoop(LoopSettings())
    down = dataclasses.replace(FULL, name="eth9", up=False)
    storage = link(0.95, name="sda-net", link_class="storage")
    assert loop._links(judged([down, storage, FULL]))[0] is Level.HIGH


def test_shutdown_goes_through_every_job() -> None:
    first = multi_host()
    single = Host()
    single.loop = first.loop
    single.declare(dataclasses.replace(DECLARATION, job="job-s"))
    single.add(1, comm=0xB0B)
    first.loop.step(judged([FULL]), {JOB: first.slots(), "job-s": single.slots()}, 1.0)
    first.loop.confirm({"job-s": single.slots()}, 1.0)
    single.advance(100_000, comm=0xB0B)
    actions = first.loop.shutdown({JOB: first.slots(), "job-s": single.slots()}, 2.0)
    assert [a.job for a in actions if isinstance(a, WritePolicy)] == ["job-s"]


def test_a_multi_host_job_withdrawn_after_another_keeps_the_others_actions() -> None:
    loop = TuningLoop(LoopSettings())
    single, multi = Host(), Host()
    for host, job in ((single, JOB), (multi, "job-m")):
        host.loop = loop
        host.declare(dataclasses.replace(DECLARATION, job=job))
    single.add(1)
    multi.add(2, comm=0xD0D, n_ranks=4, nodes=2)
    multi.advance(500, comm=0xD0D)
    stats = {JOB: single.slots(), "job-m": multi.slots()}
    loop.step(judged([CALM]), stats, 0.0)
    message = TuningArm("job-m", 1, "severe", DERIVED.fingerprint,
                        (Activation(wire_comm(0xD0D), 2000),))
    loop.arm(message, 0.5)
    loop.confirm(stats, 0.5)
    loop.resolve(TuningResolve("job-m", 1, True, message.activations), 0.6)
    loop.withdraw("job-m", 0.7)  # severe agreed: it stays, reporting, until agreed back
    actions = loop.step(judged([FULL]), {JOB: single.slots(), "job-m": multi.slots()}, 1.0)
    assert any(isinstance(a, WritePolicy) and a.job == JOB for a in actions)
    assert "job-m" in loop.jobs


def test_a_communicator_without_live_ranks_is_never_ready() -> None:
    host = Host()
    host.declare()
    assert host.loop._not_ready(host.job, CommState(7), 100) == "no live rank"


def test_an_orphan_says_why_it_waits() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.advance(1)
    rank = host.ranks[COMM][0]
    rank.held = dataclasses.replace(rank.held, after=4242, revision=5)
    again = restarted(host, policy=None)
    again.step(FULL, 11.0)
    assert again.job.waiting == (f"communicator {COMM:#x}: its ranks follow rules this "
                                 "agent could not rebuild")
