"""A rank slow within the straggler margin, across two hosts: the agents' engines on
their own ranks, their reports into the controller's core, on one simulated clock
(nothing else between them). Nothing hangs, so the owner must be told nothing.

The ranks are coupled as NCCL's are: each collective, the three fast ranks issue it at
once and wait while the slow one takes ``SLOW`` seconds more. So at most of a host's
passes its ranks have not moved since the last one, and a report sent then (every
``report_interval``) says ``still_for`` > 0. This is what the hang-localization
benchmark's slow-rank scenarios showed end to end (testbed/hanglab.py): hangs told,
naming the fast host's ranks too, then withdrawn at the next reports.
"""

from __future__ import annotations

import pytest

from agent.jobhealth.engine import JobHealthEngine
from agent.jobhealth.settings import JobHealthSection
from agent.jobhealth.types import CommReading, HostReading, JobReading, RankReading
from harmonaize import messages as m
from tests.controller.jobhealth.reports import COMM
from tests.controller.jobhealth.test_core_job_progress import JOB, TwoHosts

pytestmark = pytest.mark.jobhealth

#: Members "0" and "1" on h1, "2" and "3" on h2 (TwoHosts' placement); "3" is slow.
PLACED = {"h1": ("0", "1"), "h2": ("2", "3")}
PERIOD, SLOW = 0.05, 0.5  # the pace's own gap; the slow rank's extra seconds each time
CYCLE = PERIOD + SLOW  # one collective: 0.55 s, so it lags 0.55 s of pace at most
TICK = 0.05
PASS = 0.1  # the agents' interval (h2's passes half a tick later than h1's)


def counts(t: float) -> dict[str, int]:
    """Each rank's collectives at time ``t``: the fast ones issue collective k at the
    start of cycle k, the slow one SLOW seconds later."""
    k = int(t / CYCLE + 1e-9)
    slow_done = t - k * CYCLE >= SLOW - 1e-9
    return {"0": k + 1, "1": k + 1, "2": k + 1, "3": k + 1 if slow_done else k}


def reading(host: str, t: float) -> HostReading:
    now = counts(t)
    ranks = tuple(RankReading((1000 + int(r), 1), r, now[r]) for r in PLACED[host])
    return HostReading((JobReading(JOB, (CommReading(COMM, 4, ranks),)),))


def test_a_slow_rank_within_the_margin_is_never_told_as_a_hang() -> None:
    run = TwoHosts()
    agents = {h: JobHealthEngine(JobHealthSection()) for h in PLACED}
    told: list[m.Message] = []
    step = 0
    while step * TICK < 120.0:
        t = round(step * TICK, 3)
        for offset, host in enumerate(PLACED):
            if step % round(PASS / TICK) == offset:
                for report in agents[host].step(reading(host, t), t).reports:
                    told += run.report(host, report, t)
        told += run.tick(t)
        step += 1
    assert agents["h2"].judge.verdict(JOB, COMM) is None  # no straggler: within the margin
    assert [b for b in told if isinstance(b, m.JobProgress)] == []
