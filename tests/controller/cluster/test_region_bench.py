"""The region-failover benchmark's own arithmetic (bench/region/): a failover's figures
come from what the bus stored, not from the old leader's last words, and a lost or
repeated feed entry is counted, never hidden. Without a bus: the benchmark itself is the
end-to-end run."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import msgpack
import pytest

from bench.region.load import Plan, host_name, job_hosts, job_name, schedule
from bench.region.watch import Acks, Kill, Watch, agents_seq, measure, restore_seconds, tally
from controller.bus import codec
from controller.outputs import Writes
from harmonaize.messages import decode

pytestmark = pytest.mark.cluster


def test_the_load_numbers_each_hosts_frames_in_turn_and_only_job_hosts_advise() -> None:
    plan = Plan(hosts=40, rate=20.0, duration=10.0, jobs=4, advisories=2.0, events=0.1,
                changes=0.1)
    frames = schedule(plan, list(range(0, 40, 2)), seed=1)
    assert [at for at, *_ in frames] == sorted(at for at, *_ in frames)
    by_host: dict[str, list[int]] = {}
    advising = set()
    for _, host, seq, frame, job in frames:
        env = decode(frame)
        assert (env.sender, env.seq) == (host, seq)
        by_host.setdefault(host, []).append(seq)
        if job:
            assert env.kind == "job-advisory" and env.body.job == job
            advising.add(host)
    # Seq 0 and 1 are the warm-up's: each host's load numbers on from 2, without a gap.
    assert all(seqs == list(range(2, 2 + len(seqs))) for seqs in by_host.values())
    # Half the hosts, a summary every 2 s for 10 s; the job hosts (all even here) 2
    # advisories a second in all.
    assert len(by_host) == 20
    assert sum(1 for *_, job in frames if not job) == 20 * 5
    assert sum(1 for *_, job in frames if job) == 2 * 10
    assert advising == {host_name(h) for h in job_hosts(40, 4) if h % 2 == 0}


def test_a_commits_agents_position_is_read_without_its_writes() -> None:
    data = codec.encode(codec.Commit(Writes(), 123_456))
    assert agents_seq(data) == 123_456
    with pytest.raises(ValueError, match="agents_seq"):
        agents_seq(msgpack.packb({"format": 1}))


def test_a_failover_is_timed_from_the_successors_lease_and_commits() -> None:
    watch = Watch(
        # The old leader renewed just before the kill; r2 took the lease 2.1 s after it.
        leases=[(99.0, "r1"), (99.9, "r1"), (102.1, "r2"), (102.6, "r2")],
        # r1's last Commit landed just after the kill: it is not the successor's.
        commits=[(99.5, 50), (100.05, 55), (102.3, 60), (102.5, 90), (103.0, 95)],
        feed=[100.01, 102.4, 103.1])
    acks = Acks.of([(99.0, 50), (100.0, 56), (101.0, 70), (102.2, 90), (102.9, 95)])
    kill = Kill("r1", 100.0)
    measure(kill, watch, acks)
    assert kill.successor == "r2"
    assert kill.lease == pytest.approx(2.1)
    assert kill.commit == pytest.approx(2.3)
    assert kill.feed == pytest.approx(2.4)
    # Acknowledged by the successor's first Commit (90), not covered by the last one
    # before its lease (55); covered by the Commit at 102.5.
    assert kill.backlog == 35
    assert kill.drain == pytest.approx(0.2)


def test_a_kill_with_no_successor_has_no_time() -> None:
    kill = Kill("r1", 100.0)
    measure(kill, Watch(leases=[(99.0, "r1")], commits=[(99.5, 5)]), Acks.of([(99.0, 5)]))
    assert kill.commit != kill.commit  # NaN: the run fails on it


def test_lost_and_repeated_feed_entries_are_counted() -> None:
    jobs = [job_name(0), job_name(1)]
    acked = Counter({jobs[0]: 3, jobs[1]: 2})

    def counted(numbers: dict[str, list[int]]) -> tuple[int, int, int]:
        # Placing each job published its number 1; the advisories follow.
        found = tally(acked, numbers, {job: [n for n in seqs if n > 1]
                                       for job, seqs in numbers.items()})
        return found.lost, found.stored_twice, found.numbered_twice

    assert counted({jobs[0]: [1, 2, 3, 4], jobs[1]: [1, 2, 3]}) == (0, 0, 0)
    assert counted({jobs[0]: [1, 2, 3], jobs[1]: [1, 2, 3]}) == (1, 0, 0)  # one short
    assert counted({jobs[0]: [1, 2, 4, 5], jobs[1]: [1, 2, 3]}) == (1, 0, 0)  # 3 skipped
    # The same entry stored again (a republication the bus did not recognise).
    assert counted({jobs[0]: [1, 2, 3, 3, 4], jobs[1]: [1, 2, 3]}) == (0, 1, 0)
    # An advisory numbered twice (applied twice), and a job nobody advised for.
    assert counted({jobs[0]: [1, 2, 3, 4, 5], jobs[1]: [1, 2, 3]}) == (0, 0, 1)
    assert counted({jobs[0]: [1, 2, 3, 4], jobs[1]: [1, 2, 3],
                    job_name(2): [1, 2]}) == (0, 0, 1)


def test_the_successors_restore_is_read_from_its_log() -> None:
    log = ("2026-12-04 10:00:01,000 harmonaize.controller.leader leading: state to commit 3, "
           "agents' stream to 40, 20 hosts (cold, 0.50 s)\n"
           "2026-12-04 10:00:09,250 harmonaize.controller.leader leading: state to commit 9, "
           "agents' stream to 80, 20 hosts (warm, 1.25 s)\n")
    eight = datetime(2026, 12, 4, 10, 0, 8).astimezone().timestamp()
    assert restore_seconds(log, eight) == (1.25, "warm")
    never, began = restore_seconds(log, eight + 60)
    assert never != never and began == ""  # NaN: no takeover after it
