"""The windows no protocol closes alone, measured on the end-to-end campaign's lab: how
long a rogue writer's change goes unseen, and how long ranks pause when a host is cut
off after it armed a change. A part of :class:`testbed.tuninge2e.Campaign` (a mixin:
it uses the campaign's lab, cluster and ranks)."""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import time

from agent.plugin.shm import PolicyFile, policy_path, read_policy, read_stats
from agent.tuning.loop import Entry, build_policy
from agent.tuning.policies import derive
from harmonaize.messages import JobDeclaration
from harmonaize.schema import from_plain
from testbed.cluster import wait_until
from testbed.e2eschedule import (
    GROUP,
    HOSTS,
    E2EResult,
    E2ESchedule,
)
from testbed.ranks import RankProcess, disagreement, issued, stop


class MeasuredWindows:
    """The windows that are left, measured (the campaign's lab and daemons must be up)."""

    def _job(self, name: str, hosts: tuple[str, ...], rate: float,
             ranks_per_host: int = 1) -> tuple[int, list[RankProcess]]:
        """Place, declare and start a job's ranks; returns its communicator and ranks."""
        assert self.cluster is not None and self.kit is not None
        comm = random.Random(name).getrandbits(64) | 1
        path = self._place(name, hosts, ranks_per_host)
        members = [h for h in hosts for _ in range(ranks_per_host)]
        result = E2EResult(E2ESchedule(0, hosts, ranks_per_host, rate, 0.0, 0.0, (), ()))
        self._declare(path, result)
        ranks = [self.kit.start(job=name, directory=self.cluster.policy_dir(host), comm=comm,
                                n_ranks=len(members), n_nodes=len(hosts), rate=rate,
                                uid=GROUP + 1 + i, gid=GROUP, lab=self.lab, host=host)
                 for i, host in enumerate(members)]
        for host in hosts:
            wait_until(lambda host=host: read_stats(self.cluster.policy_dir(host), name,
                                                    remove_dead=False),
                       30, f"{name}'s ranks on {host}")
        time.sleep(1.5)  # the agents report them; the controller knows every rank
        return comm, ranks

    def detection(self, round_: int) -> tuple[float, float]:
        """A change written on one host only (a writer that is not the agent): seconds
        from the first rank's switch to the controller naming the job diverged, and to
        the tenant's job-health saying so."""
        assert self.cluster is not None
        name = f"rogue-{round_}"
        watcher = self.cluster.tenant_watch(topics=(f"job/acme/{name}/",))
        comm, ranks = self._job(name, ("h0", "h1"), rate=300.0)
        try:
            path = policy_path(self.cluster.policy_dir("h0"), name)
            policy = read_policy(path)
            declared = from_plain(JobDeclaration,
                                  json.loads((self.workdir / f"{name}.json").read_text()))
            severe = derive(declared).get("severe").rules
            count = max(s.collectives for s in read_stats(self.cluster.policy_dir("h0"), name,
                                                          remove_dead=False))
            at = count + 300  # a second ahead
            revision = max((e.revision for e in policy.comms), default=0) + 1000
            with PolicyFile(path) as handle:
                handle.write(build_policy([Entry(comm, at, "default", "severe", (), severe,
                                                 revision)], 999))
            switched = wait_until(lambda: len(ranks[0].outcomes()) >= 2 and time.monotonic(),
                                  20, "the rogue switch", interval=0.005)
            controller = wait_until(
                lambda: self.cluster.admin_request("jobs") and any(
                    j["job"] == name and j["tuning"].get("health") == "diverged"
                    for j in self.cluster.admin_request("jobs")) and time.monotonic(),
                20, "the controller to see the disagreement", interval=0.01)
            watcher.wait_for(lambda m: m.get("kind") == "job-health"
                             and m["body"].get("tuning") == "diverged", 20,
                             "job-health: diverged")
            tenant = time.monotonic()
            return controller - switched, tenant - switched
        finally:
            stop(ranks)
            watcher.proc.kill()
            watcher.proc.wait()
            with contextlib.suppress(Exception):
                self.cluster.admin_request("unplace", {"job": name})

    def cut_after_arm(self, round_: int, cut: float) -> tuple[float, str, float]:
        """The window no protocol closes without the ranks' own help: a host cut off
        after it armed a change and before it heard the outcome. h0's answers are
        dropped first (so the controller waits for them), then, once h0 armed, the
        controller's messages too, for ``cut`` seconds. Returns how long h0's ranks
        paused (s), whether any two ranks disagreed, and the seconds from the first
        waiting rank to the tenant's job-health saying ``paused``."""
        assert self.cluster is not None
        name = f"cut-{round_}"
        watcher = self.cluster.tenant_watch(topics=(f"job/acme/{name}/",))
        _, ranks = self._job(name, ("h0", "h1"), rate=300.0)
        traffic = None
        out, into = self._dropper("h0", "egress"), self._dropper("h0", "ingress")
        try:
            h0 = policy_path(self.cluster.policy_dir("h0"), name)
            out.set(1000)
            traffic = self.lab.popen("h1", [
                "iperf3", "-c", self.lab.addr("tenant"), "-p", str(5301 + HOSTS.index("h1")),
                "-u", "-b", "19M", "-t", "8"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

            def armed() -> bool:
                try:
                    return any(e.pending for e in read_policy(h0).comms)
                except (OSError, ValueError):
                    return False

            wait_until(armed, 20, "h0 to arm the change", interval=0.002)
            into.set(1000)
            healed = time.monotonic() + cut

            def waiting() -> float | bool:
                slots = read_stats(self.cluster.policy_dir("h0"), name, remove_dead=False)
                return any(s.waiting for s in slots) and time.monotonic()

            first = wait_until(waiting, cut + 10, "a rank to wait", interval=0.005)
            watcher.wait_for(lambda m: m.get("kind") == "job-health"
                             and m["body"].get("tuning") == "paused", 20,
                             "job-health: paused")
            told = time.monotonic() - first
            time.sleep(max(0.0, healed - time.monotonic()))
            out.set(0)
            into.set(0)
            wait_until(lambda: not waiting(), 30, "the ranks to resume", interval=0.005)
            paused = time.monotonic() - first
            time.sleep(1.0)
            counts = {}
            for host in ("h0", "h1"):
                for slot in read_stats(self.cluster.policy_dir(host), name, remove_dead=False):
                    counts[slot.pid] = slot.collectives
        finally:
            out.set(0)
            into.set(0)
            if traffic is not None:
                with contextlib.suppress(ProcessLookupError):
                    traffic.kill()
                traffic.wait()
            stop(ranks)
            watcher.proc.kill()
            watcher.proc.wait()
            with contextlib.suppress(Exception):
                self.cluster.admin_request("unplace", {"job": name})
        totals = [max(issued(r.log) or 0, counts.get(r.proc.pid, 0)) for r in ranks]
        return paused, disagreement([r.outcomes() for r in ranks], totals), told
