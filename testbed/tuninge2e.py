"""Fault schedules end to end: real agents, the real controller, ranks of other users.

One lab (a controller, three GPU hosts and a tenant, each a network
namespace) serves every schedule. Per schedule: a job is placed on two or
three hosts with a Unix group, declared by the tenant, and run by stand-in
ranks (the real plugin, as unprivileged users of that group, started with
skews); congestion is real UDP traffic from a host's data link (told it
carries 20 Mb/s) to the tenant; faults are real: agents SIGKILLed (also
right after congestion sets in, when a change is being armed), stopped and
continued, restarted into a recreated, corrupted or missing policy file; the
controller SIGKILLed and restarted; a host's link cut; the declaration sent
after the ranks started; ranks stopped and continued. Afterwards every
rank's answers are compared collective by collective, and ranks still
waiting at an unconfirmed switch (after the system had time to settle) are
counted as stuck.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from agent.plugin.shm import policy_path, read_policy, read_stats
from testbed.cluster import TestCluster, wait_until
from testbed.dropper import Dropper
from testbed.e2eschedule import (
    AGENT_TUNING,
    CONTROLLER,
    GROUP,
    HOSTS,
    LINKS,
    SETTLE,
    E2EResult,
    E2ESchedule,
    Event,
    random_schedule,  # noqa: F401 (the bench draws its schedules from here)
)
from testbed.netns import Lab
from testbed.ranks import RankKit, RankProcess, disagreement, issued, stop
from testbed.tuningwindows import MeasuredWindows


class Campaign(MeasuredWindows):
    """The lab and its daemons, shared by every schedule; use as a context manager."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.lab = Lab(["controller", *HOSTS, "tenant"], tag="tdiv")
        self.cluster: TestCluster | None = None
        self.kit: RankKit | None = None
        self._servers: list[subprocess.Popen[Any]] = []
        self._traffic: list[subprocess.Popen[Any]] = []
        self._droppers: dict[tuple[str, str], Dropper] = {}

    def _dropper(self, host: str, direction: str) -> Dropper:
        """One filter per host and direction for the whole lab (they go with it)."""
        key = (host, direction)
        if key not in self._droppers:
            self._droppers[key] = Dropper(self.lab, host, direction)
        return self._droppers[key]

    def __enter__(self) -> Campaign:
        self.lab.create()
        self.kit = RankKit()
        self.cluster = TestCluster(self.lab, self.workdir, controller_overrides=CONTROLLER)
        self.cluster.start_controller()
        for host in HOSTS:
            self._start_agent(host)
        for i, _ in enumerate(HOSTS):
            self._servers.append(self.lab.popen("tenant", [
                "iperf3", "-s", "-p", str(5301 + i)],
                # the faults cut links under running traffic on purpose: its
                # complaints are expected, not findings
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._traffic + self._servers:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        if self.cluster is not None:
            for host in list(self.cluster.agents):
                with contextlib.suppress(Exception):
                    self.cluster.stop_agent(host, signal.SIGKILL)
            if self.cluster.controller is not None:
                self.cluster.controller.kill()
                self.cluster.controller.wait()
        if self.kit is not None:
            self.kit.close()
        self.lab.close()

    # --- daemons --------------------------------------------------------------------

    def _start_agent(self, host: str) -> None:
        assert self.cluster is not None
        self.cluster.start_agent(host, gpus=0, extra=LINKS, tuning=AGENT_TUNING)

    def _kill_agent(self, host: str, sig: signal.Signals = signal.SIGKILL) -> None:
        assert self.cluster is not None
        if host in self.cluster.agents:
            self.cluster.stop_agent(host, sig)

    def _restart_controller(self, down: float) -> None:
        assert self.cluster is not None and self.cluster.controller is not None
        self.cluster.controller.kill()
        self.cluster.controller.wait()
        time.sleep(down)
        self.cluster.start_controller()

    # --- one schedule ---------------------------------------------------------------

    def run(self, schedule: E2ESchedule) -> E2EResult:
        assert self.cluster is not None and self.kit is not None
        began = time.monotonic()
        result = E2EResult(schedule)
        rng = random.Random(schedule.seed ^ 0xE2E)
        job = f"e2e-{schedule.seed}"
        comm = rng.getrandbits(64) | 1
        n_ranks = len(schedule.hosts) * schedule.ranks_per_host
        declaration = self._place(job, schedule.hosts, schedule.ranks_per_host)
        late = next((f for f in schedule.faults if f.kind == "late-declaration"), None)
        if late is None:
            self._declare(declaration, result)
        ranks: list[RankProcess] = []
        start = time.monotonic()
        offsets = sorted((rng.random() * schedule.skew, h) for h in schedule.hosts
                         for _ in range(schedule.ranks_per_host))
        try:
            for offset, host in offsets:
                time.sleep(max(0.0, start + offset - time.monotonic()))
                uid = GROUP + 1 + len(ranks)
                ranks.append(self.kit.start(
                    job=job, directory=self.cluster.policy_dir(host), comm=comm,
                    n_ranks=n_ranks, n_nodes=len(schedule.hosts), rate=schedule.rate, uid=uid,
                    gid=GROUP, lab=self.lab, host=host))
            if late is not None:
                time.sleep(late.duration)
                self._declare(declaration, result)
            self._play(schedule, ranks, start)
            self._settle(job, schedule, result)
            counts = self._counts(job, schedule, ranks)
        finally:
            for proc in self._traffic:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
            self._traffic.clear()
            ended = stop(ranks)
            self._heal(schedule)
        result.stuck = ended.count(False)
        logs = [r.outcomes() for r in ranks]
        totals = [max(issued(r.log) or 0, counts.get(r.proc.pid, 0)) for r in ranks]
        result.diverged = disagreement(logs, totals)
        result.switches = max((len(rows) - 1 for rows in logs), default=0)
        result.collectives = sum(totals)
        with contextlib.suppress(Exception):
            self.cluster.admin_request("unplace", {"job": job})
        result.seconds = time.monotonic() - began
        return result

    def _place(self, job: str, hosts: tuple[str, ...], ranks_per_host: int) -> Path:
        """Place a job (with its Unix group) as the scheduler would; write the
        tenant's declaration of it to a file, to be sent with :meth:`_declare`."""
        assert self.cluster is not None
        members = [{"name": str(i), "host": h}
                   for i, h in enumerate(h for h in hosts for _ in range(ranks_per_host))]
        self.cluster.admin_request("place", {"job": job, "tenant": "acme", "members": members,
                                             "group": str(GROUP)})
        path = self.workdir / f"{job}.json"
        path.write_text(json.dumps({
            "job": job, "revision": 1,
            "tuning": [{"collectives": ["allreduce"], "algorithms": ["ring", "tree"],
                        "protocols": ["ll", "simple"], "min_channels": 2,
                        "max_channels": 16}]}))
        return path

    def _declare(self, path: Path, result: E2EResult) -> None:
        assert self.cluster is not None
        for _ in range(3):  # the controller may be restarting
            done = self.cluster.tenant_cli("declare", str(path))
            if done.returncode == 0:
                return
            time.sleep(1.0)
        result.notes.append(f"declaration failed: {done.stderr.strip()}")

    def _play(self, schedule: E2ESchedule, ranks: list[RankProcess], start: float) -> None:
        timeline: list[tuple[float, int, str, Any]] = []
        for i, (begin, end, host, rate) in enumerate(schedule.congestion):
            timeline.append((begin, i, "traffic", (host, rate, end - begin)))
        for i, fault in enumerate(schedule.faults):
            if fault.kind != "late-declaration":
                timeline.append((fault.at, 100 + i, "fault", fault))
        restarts: list[tuple[float, int, str, Any]] = []
        for at, _, kind, what in sorted(timeline):
            time.sleep(max(0.0, start + at - time.monotonic()))
            self._due(restarts)
            if kind == "traffic":
                host, rate, seconds = what
                port = 5301 + HOSTS.index(host)
                self._traffic.append(self.lab.popen(host, [
                    "iperf3", "-c", self.lab.addr("tenant"), "-p", str(port), "-u", "-b",
                    f"{rate}M", "-t", f"{seconds:.1f}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            else:
                restarts += self._fault(what, ranks)
        time.sleep(max(0.0, start + schedule.duration - time.monotonic()))
        while restarts:
            time.sleep(max(0.0, min(r[0] for r in restarts) - time.monotonic()))
            self._due(restarts)

    def _due(self, restarts: list[tuple[float, int, str, Any]]) -> None:
        for item in sorted(restarts):
            when, _, action, what = item
            if when > time.monotonic():
                continue
            restarts.remove(item)
            if action == "agent":
                assert self.cluster is not None
                if what not in self.cluster.agents:  # two faults may have stopped it
                    self._start_agent(what)
            elif action == "continue":
                with contextlib.suppress(ProcessLookupError):
                    what.send_signal(signal.SIGCONT)
            elif action == "link":
                self.lab.run(what, ["ip", "link", "set", "eth0", "up"])

    def _fault(self, fault: Event, ranks: list[RankProcess]) -> list[tuple[float, int, str, Any]]:
        assert self.cluster is not None
        host, later = fault.host, time.monotonic() + fault.duration
        if fault.kind in ("agent-kill", "agent-kill-onset"):
            self._kill_agent(host)
            return [(later, 0, "agent", host)]
        if fault.kind == "agent-stop":
            proc = self.cluster.agents.get(host)
            if proc is not None:
                proc.send_signal(signal.SIGSTOP)
                return [(later, 1, "continue", proc)]
            return []
        if fault.kind in ("agent-recreate", "agent-corrupt", "agent-lost"):
            self._kill_agent(host)
            jobdir = self.cluster.policy_dir(host)
            for path in jobdir.glob("*/policy"):
                with contextlib.suppress(OSError):
                    if fault.kind == "agent-recreate":
                        data = path.read_bytes()
                        path.unlink()
                        path.write_bytes(data)
                    elif fault.kind == "agent-corrupt":
                        with open(path, "r+b") as f:
                            f.seek(300)
                            f.write(b"\x5a" * 64)
                    else:
                        path.unlink()
            return [(later, 0, "agent", host)]
        if fault.kind == "controller-kill":
            self._restart_controller(fault.duration)
            return []
        if fault.kind == "cut":
            self.lab.run(host, ["ip", "link", "set", "eth0", "down"])
            return [(later, 2, "link", host)]
        if fault.kind == "rank-stall":
            mine = [r for r in ranks if r.host == host]
            if mine:
                target = mine[fault.rank % len(mine)].proc
                target.send_signal(signal.SIGSTOP)
                return [(later, 1, "continue", target)]
        return []

    def _settle(self, job: str, schedule: E2ESchedule, result: E2EResult) -> None:
        """Calm links, every agent up: wait until no host holds an armed change."""
        assert self.cluster is not None

        def settled() -> bool:
            for host in schedule.hosts:
                try:
                    policy = read_policy(policy_path(self.cluster.policy_dir(host), job))
                except (OSError, ValueError):
                    continue
                if any(e.pending for e in policy.comms):
                    return False
            return True

        try:
            wait_until(settled, SETTLE, "every armed change to be resolved", interval=0.2)
        except AssertionError as exc:
            result.notes.append(str(exc))

    def _counts(self, job: str, schedule: E2ESchedule,
                ranks: list[RankProcess]) -> dict[int, int]:
        """Each rank's collective count from its stats (for ranks that cannot say so)."""
        assert self.cluster is not None
        counts: dict[int, int] = {}
        for host in schedule.hosts:
            for slot in read_stats(self.cluster.policy_dir(host), job, remove_dead=False):
                counts[slot.pid] = max(counts.get(slot.pid, 0), slot.collectives)
        return counts

    def _heal(self, schedule: E2ESchedule) -> None:
        assert self.cluster is not None
        for host in HOSTS:
            self.lab.run(host, ["ip", "link", "set", "eth0", "up"])
            proc = self.cluster.agents.get(host)
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
            if proc is None or proc.poll() is not None:
                self.cluster.agents.pop(host, None)
                self._start_agent(host)
        if self.cluster.controller is None or self.cluster.controller.poll() is not None:
            self.cluster.start_controller()
