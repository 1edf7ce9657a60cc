"""Job health in a real agent: a declared job's real ranks, one stopped, shown to the
operator by ``harmonctl job-health`` (finding, cause, the laggard's pid and process
state) and written to the agent's journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from testbed.ranks import RankKit, stop
from tests.conftest import needs_root, python
from tests.daemons import NO_LINKS, Agent, start_agent, wait_until

pytestmark = [pytest.mark.jobhealth, needs_root]

JOB = "train-ops"
COMM = 0x0C0FFEE000000007


def harmonctl(agent: Agent, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket), *argv),
                          capture_output=True, text=True, timeout=30)


def comm_view(agent: Agent) -> dict | None:
    jobs = agent.request("job-health", {"job": JOB})["jobs"]
    return jobs[0]["comms"][0] if jobs and jobs[0]["comms"] else None


def test_item4_harmonctl_job_health_names_the_stopped_rank_with_its_pid(
        spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir, "h1", links=NO_LINKS + "[jobhealth]\nhang_after = 1.0\n")
    agent.request("declare", {"declaration": {"job": JOB, "revision": 1}})
    with RankKit() as kit:
        ranks = [kit.start(job=JOB, directory=workdir / "h1" / "tuner", comm=COMM, n_ranks=3,
                           n_nodes=1, rate=200, env={"RANK": str(r)}) for r in range(3)]
        try:
            wait_until(lambda: (c := comm_view(agent)) and c["ranks_here"] == 3, timeout=30,
                       what="three ranks in job-health")
            os.kill(ranks[0].proc.pid, signal.SIGSTOP)
            wait_until(lambda: (c := comm_view(agent)) and c["laggards"][0]["rank"] == "0"
                       and c["collectives_max"] > c["collectives_min"] + 20, timeout=30,
                       what="rank 0 behind the others")
            for rank in ranks[1:]:
                os.kill(rank.proc.pid, signal.SIGSTOP)  # they would wait for rank 0
            view = wait_until(lambda: (c := comm_view(agent)) and c["finding"] == "hang" and c,
                              timeout=30, what="the hang")
            assert view["cause"] == "process-not-running"
            assert view["laggards"][0]["rank"] == "0"
            assert view["laggards"][0]["pid"] == ranks[0].proc.pid
            assert view["laggards"][0]["process"] == "stopped"
            table = harmonctl(agent, "job-health")
            assert table.returncode == 0, table.stderr
            assert "hang" in table.stdout and str(ranks[0].proc.pid) in table.stdout
            plain = json.loads(harmonctl(agent, "--json", "job-health").stdout)
            assert plain["jobs"][0]["job"] == JOB
            assert f"job {JOB}: communicator {COMM:x}: hang (process-not-running)" in \
                agent.log.read_text()
        finally:
            for rank in ranks:
                if rank.proc.poll() is None:
                    os.kill(rank.proc.pid, signal.SIGCONT)
            stop(ranks)
