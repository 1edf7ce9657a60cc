"""The demo's job-health scene: a job's rank stops and its owner is told which one.

The job spans h1 and h2 with one stand-in rank on each (the real tuner plugin counting
the collectives each rank issues). h2's rank is stopped with SIGSTOP: its process is
alive but never runs, as a rank stuck in the kernel or frozen by a debugger would be.
Each agent sees only its own rank; the controller joins their reports, finds that h1's
rank went past a collective h2's never issued, and tells the owner the member that holds
the job up, by its placement name, with the cause h2's agent read from /proc. Continued,
the ranks move and the finding is withdrawn.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from testbed.cluster import TenantWatcher, TestCluster, wait_until
from testbed.narrate import indent, say, show_tenant
from testbed.ranks import RankProcess


def _count(cluster: TestCluster, host: str, job: str) -> int:
    """The collectives the host's agent last counted for the job's rank there."""
    jobs = cluster.agent_request(host, "job-health", {"job": job})["jobs"]
    comms = jobs[0]["comms"] if jobs else []
    return comms[0]["collectives_max"] if comms else 0


def _progress(finding: str | None = None, state: str = "active") -> Any:
    def check(message: dict[str, Any]) -> bool:
        body = message.get("body", {})
        return message.get("kind") == "job-progress" and body.get("state") == state and (
            finding is None or body.get("finding") == finding)
    return check


def hung_rank(cluster: TestCluster, job: str, ranks: Sequence[RankProcess],
              owner: TenantWatcher) -> None:
    """``ranks``: the job's rank on h1 (member "0") and on h2 (member "1")."""
    ahead, victim = ranks
    say("h2's rank stops (SIGSTOP: alive, never scheduled). In a real job h1's rank would "
        "block in the next collective, waiting for it; the stand-ins are not coupled, so "
        "the demo stops h1's rank too once it is ahead")
    os.kill(victim.proc.pid, signal.SIGSTOP)
    began = time.monotonic()
    try:
        wait_until(lambda: _count(cluster, "h1", job) > _count(cluster, "h2", job) + 20, 20,
                   "h1's rank to go ahead")
        os.kill(ahead.proc.pid, signal.SIGSTOP)
        say("neither agent alone sees a hang (each has one still rank); the controller "
            "joins their reports and tells the owner which member holds the job up, and why")
        owner.wait_for(_progress("hang"), 30, "the owner told of the hang",
                       on_message=show_tenant)
        print(f"   the owner was told {time.monotonic() - began:.1f} s after the stop "
              "(a hang is named after 3 s without progress)", flush=True)
        say("the operator sees the same finding with its hosts and pids: "
            "harmonctl -C job-findings, and harmonctl job-health on h2")
        argv = [sys.executable, "-m", "harmonaize.harmonctl", "-C",
                str(cluster.admin_socket), "job-findings"]
        print(indent(subprocess.run(argv, check=False, capture_output=True,
                                    text=True).stdout), flush=True)
        print(indent(cluster.harmonctl("h2", "job-health")), flush=True)
    finally:
        for rank in ranks:
            os.kill(rank.proc.pid, signal.SIGCONT)
    say("both ranks continue: they move again and the finding is withdrawn")
    owner.wait_for(_progress(state="withdrawn"), 30, "the hang withdrawn",
                   on_message=show_tenant)
