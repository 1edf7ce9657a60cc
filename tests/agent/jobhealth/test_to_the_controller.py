"""A real agent's ``rank-progress`` reaches the real controller, which tells the job's
owner the stopped rank by its member name (the agent's side of item 2), and withdraws it
when the rank moves again."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from harmonaize import messages as m
from harmonaize.messages.jobhealth import Cause, Finding, ProgressState
from testbed.ranks import RankKit, stop
from tests.agent.jobhealth.test_agent_job_health import comm_view
from tests.conftest import needs_root
from tests.controller.test_feed import drain
from tests.daemons import NO_LINKS, start_agent, start_controller, tenant_feed, wait_until

pytestmark = [pytest.mark.jobhealth, needs_root]

JOB = "train-ops"
COMM = 0x0C0FFEE000000007


def test_item2_the_agents_report_tells_the_owner_its_stopped_rank_by_member_name(
        spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir, extra="[jobhealth]\nhang_after = 1.0\n")
    controller.request("place", {"job": JOB, "tenant": "alpha", "members": [
        {"name": str(i), "host": "h1"} for i in range(3)]})
    agent = start_agent(spawn, workdir, "h1", endpoint=controller.listen,
                        links=NO_LINKS + "[jobhealth]\nhang_after = 1.0\n")
    agent.request("declare", {"declaration": {"job": JOB, "revision": 1}})
    with RankKit() as kit, tenant_feed(controller, [f"job/alpha/{JOB}/"], "alpha") as feed:
        ranks = [kit.start(job=JOB, directory=workdir / "h1" / "tuner", comm=COMM, n_ranks=3,
                           n_nodes=1, rate=200, env={"RANK": str(r)}) for r in range(3)]
        try:
            wait_until(lambda: (c := comm_view(agent)) and c["ranks_here"] == 3, timeout=30,
                       what="three ranks in job-health")
            os.kill(ranks[2].proc.pid, signal.SIGSTOP)
            wait_until(lambda: (c := comm_view(agent)) and c["laggards"][0]["rank"] == "2"
                       and c["collectives_max"] > c["collectives_min"] + 20, timeout=30,
                       what="rank 2 behind the others")
            for rank in ranks[:2]:
                os.kill(rank.proc.pid, signal.SIGSTOP)  # they would wait for rank 2
            hangs = [p for p in drain(feed, 1, m.JobProgress, timeout=30)
                     if p.finding is Finding.HANG]
            assert hangs, "no hang told to the owner"
            (hang,) = hangs
            assert (hang.job, hang.comm, hang.ranks, hang.state) == (
                JOB, COMM, ("2",), ProgressState.ACTIVE)
            assert hang.cause is Cause.PROCESS_NOT_RUNNING
            for rank in ranks:
                os.kill(rank.proc.pid, signal.SIGCONT)
            (withdrawn,) = drain(feed, 1, m.JobProgress, timeout=30)
            assert (withdrawn.state, withdrawn.ranks) == (ProgressState.WITHDRAWN, ("2",))
        finally:
            for rank in ranks:
                if rank.proc.poll() is None:
                    os.kill(rank.proc.pid, signal.SIGCONT)
            stop(ranks)
