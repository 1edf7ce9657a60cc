"""The hang lab: a job of eight coupled ranks on two hosts, and real faults to hang it.

    with HangLab() as lab:
        comm = lab.first.start()
        lab.first.running()
        lab.signal(5, signal.SIGSTOP)
        lab.wait_progress(lambda b: b["finding"] == "hang", 20, "a hang told", comm=comm)

Namespaces ``controller``, ``h0``, ``h1`` and ``tenant`` (testbed/netns.Lab), the real
controller and two real agents (testbed/cluster.TestCluster) with fake GPUs (one per
rank), tuning on (it reads the ranks' stats) and job health at the shipped defaults
unless ``settings`` says otherwise. Jobs are placed by the operator on both hosts
(members "0".."7": "0"-"3" on h0, "4"-"7" on h1) with a Unix group, so that ranks run
as unprivileged users of it, and declared by the tenant, who watches ``job/acme/``.

The data path. Each host has a second link, ``data0``, on a bridge of its own (the
agents watch it as their ``data`` link); ``eth0`` carries the control path to the
controller and the tenant's feed. The ranks' coupling (testbed/rendezvous.py) runs on
h0's data address, as NCCL's bootstrap root runs with rank 0: h1's ranks reach it over
``data0``, h0's within h0. :meth:`HangLab.cut` drops, with nft at the data bridge (in the
lab's switch namespace), every frame to or from that host's data link: its link stays
up and its stack retransmits into nothing, as behind a failed switch port (either way,
h1's ranks are cut off from their fellows); the control path stays up.

Faults, on a job (testbed/hangjob.py): :meth:`LabJob.signal` (SIGSTOP, SIGKILL,
SIGCONT), :meth:`LabJob.hold` (the rank stops issuing while its process runs: stuck in
data loading) and :meth:`LabJob.release`, :meth:`LabJob.gpu_fault` (an XID on the rank's
GPU in the fake NVML); on the lab, :meth:`HangLab.cut` and :meth:`HangLab.mend`. The
lab's own shortcuts act on its first job. Everything (ranks, daemons, nft tables,
namespaces) goes on exit, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harmonaize.switches import WIRE_MASK
from testbed.cluster import SMALL_CLUSTER, TenantWatcher, TestCluster, wait_until
from testbed.hangjob import GROUP, HOSTS, N_RANKS, RANKS_PER_HOST, LabJob
from testbed.netns import Lab
from testbed.ranks import ROOT, RankKit

NAMESPACES = ["controller", "h0", "h1", "tenant"]
TENANT = "acme"
JOB = "train-hang"
DATA_NET = "10.232.0"  # data0 addresses: h0 .1, h1 .2
RENDEZVOUS_PORT = 7470
NFT_TABLE = "hzhang"
#: The job's first communicator id; each start takes the next (within the wire's 62 bits).
FIRST_COMM = 0x0A11_0000_0000_0000


#: The agents' link observer: ``data0`` only (class ``data``), told it carries 10 Gb/s
#: so that the ranks' trickle never reads as congestion; eBPF, whose tracepoints count
#: retransmissions per link (a dead path behind a link that looks fine).
DATA_LINKS = ('[observers.links]\ninclude = ["data0"]\nmode = "ebpf"\n'
              'speeds = { data0 = 10000 }\n')


class HangLab:
    """The lab and its daemons; use as a context manager."""

    def __init__(self, workdir: Path | None = None, *, settings: str = "",
                 tag: str = "hlab") -> None:
        """``settings``: ``[jobhealth]`` keys both agents and the controller take (e.g.
        ``stall_after = 10``); none: the shipped defaults."""
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="hz-hanglab-"))
        self.workdir.chmod(0o755)
        self.settings = settings
        self.lab = Lab(NAMESPACES, tag=tag)
        self.cluster = TestCluster(self.lab, self.workdir,
                                   controller_overrides=SMALL_CLUSTER + self._jobhealth())
        self.kit: RankKit | None = None
        self.jobs: dict[str, LabJob] = {}
        #: The first job placed (the lab's own shortcuts act on it).
        self.job: LabJob | None = None
        self.rendezvous = ""
        self.watcher: TenantWatcher | None = None
        #: Every message the tenant got, with when (monotonic) it was read.
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self._arrived = threading.Condition()
        self._cut: set[str] = set()
        self._gpu_pids: dict[tuple[str, int], set[int]] = {}
        self._comms = 0
        self.lock = threading.RLock()

    def _jobhealth(self) -> str:
        return "[jobhealth]\n" + self.settings if self.settings else ""

    def data_addr(self, host: str) -> str:
        return f"{DATA_NET}.{HOSTS.index(host) + 1}"

    # --- set-up and teardown ----------------------------------------------------------

    def __enter__(self) -> HangLab:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        self.lab.create()
        self._data_network()
        self.kit = RankKit()
        self.cluster.start_controller()
        for host in HOSTS:
            self.cluster.start_agent(host, gpus=RANKS_PER_HOST,
                                     extra=DATA_LINKS + self._jobhealth())
        self._start_rendezvous()
        self.place(JOB)
        self._watch()

    def _data_network(self) -> None:
        """A second bridge in the lab's switch namespace, a ``data0`` on each GPU host."""
        switch = self.lab.switch

        def ip(*args: str) -> None:
            subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

        ip("-n", switch, "link", "add", "br1", "type", "bridge")
        ip("-n", switch, "link", "set", "br1", "up")
        for index, host in enumerate(HOSTS):
            port = f"d{index}"
            ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", "data0",
               "netns", self.lab.ns(host))
            ip("-n", switch, "link", "set", port, "master", "br1", "up")
            ip("-n", self.lab.ns(host), "addr", "add", f"{self.data_addr(host)}/24", "dev",
               "data0")
            ip("-n", self.lab.ns(host), "link", "set", "data0", "up")

    def _start_rendezvous(self) -> None:
        address = f"{self.data_addr('h0')}:{RENDEZVOUS_PORT}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = self.lab.popen("h0", [sys.executable, "-m", "testbed.rendezvous", "--listen",
                                     address], stdout=subprocess.PIPE, env=env, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening"):
            raise RuntimeError(f"the rendezvous server did not start: {line!r}")
        self.rendezvous = address

    def _watch(self) -> None:
        """The tenant watches its jobs' topics; its first message (a placed job's present
        health) says it is subscribed."""
        self.watcher = self.cluster.tenant_watch(topics=(f"job/{TENANT}/",), tenant=TENANT)
        threading.Thread(target=self._collect, args=(self.watcher,), daemon=True).start()
        wait_until(lambda: self.messages, 30, "the tenant's first message")

    def _collect(self, watcher: TenantWatcher) -> None:
        while watcher.proc.poll() is None or not watcher.messages.empty():
            try:
                message = watcher.messages.get(timeout=0.5)
            except queue.Empty:
                continue  # does it still run?
            with self._arrived:
                self.messages.append((time.monotonic(), message))
                self._arrived.notify_all()

    def close(self) -> None:
        for job in self.jobs.values():
            with contextlib.suppress(Exception):
                job.stop()
        with contextlib.suppress(Exception):
            self.mend()
        if self.kit is not None:
            self.kit.close()
        self.lab.close()  # the daemons, the watcher, the rendezvous; then the namespaces
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # --- jobs ---------------------------------------------------------------------------

    def next_comm(self) -> int:
        with self.lock:
            self._comms += 1
            return (FIRST_COMM + self._comms) & WIRE_MASK

    def place(self, name: str) -> LabJob:
        """Place ``name`` on both hosts (with the group), declare it as the tenant, and
        wait until both agents have the declaration."""
        members = [{"name": str(r), "host": LabJob.host_of(r)} for r in range(N_RANKS)]
        self.cluster.admin_request("place", {"job": name, "tenant": TENANT,
                                             "members": members, "group": str(GROUP)})
        path = self.workdir / f"{name}.json"
        path.write_text(json.dumps({"job": name, "revision": 1}))
        done = self.cluster.tenant_cli("declare", str(path), tenant=TENANT)
        if done.returncode != 0:
            raise RuntimeError(f"the declaration of {name} was refused: {done.stderr.strip()}")
        for host in HOSTS:
            wait_until(lambda h=host: name in {j["job"] for j in self.cluster.agent_request(
                h, "jobs")["jobs"]}, 20, f"{host}'s agent to get {name}'s declaration")
        job = self.jobs[name] = LabJob(self, name)
        if self.job is None:
            self.job = job
        return job

    def on_gpu(self, host: str, gpu: int, pid: int, gone: bool = False) -> None:
        """Keep the fake NVML's process list of ``host``'s GPU ``gpu`` (a rank runs there)."""
        with self.lock:
            pids = self._gpu_pids.setdefault((host, gpu), set())
            (pids.discard if gone else pids.add)(pid)
            self.cluster.gpus[host].set(gpu, processes={p: 1 << 30 for p in sorted(pids)}
                                        or None)

    # --- the first job's faults ---------------------------------------------------------

    @property
    def first(self) -> LabJob:
        assert self.job is not None, "the lab is not running"
        return self.job

    def signal(self, rank: int, sig: signal.Signals) -> None:
        self.first.signal(rank, sig)

    def hold(self, rank: int) -> None:
        self.first.hold(rank)

    def release(self, rank: int) -> None:
        self.first.release(rank)

    def gpu_fault(self, rank: int, xid: int = 48) -> None:
        self.first.gpu_fault(rank, xid)

    # --- the data path ------------------------------------------------------------------

    def cut(self, host: str) -> None:
        """Drop every frame between ``host``'s data link and the other host's, at the
        data bridge (nft's bridge family in the lab's switch namespace): as a failed
        switch port, the host's link stays up and its own stack keeps sending and
        retransmitting into nothing; the control path (``eth0``) stays up."""
        port = f"d{HOSTS.index(host)}"
        table = f"{NFT_TABLE}_{host}"
        script = (f"table bridge {table} {{\n"
                  "  chain forward { type filter hook forward priority 0; policy accept;\n"
                  f'    iifname "{port}" drop\n    oifname "{port}" drop\n  }}\n}}\n')
        done = subprocess.run(["ip", "netns", "exec", self.lab.switch, "nft", "-f", "-"],
                              input=script, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"nft, cutting {host}: {done.stderr.strip()}")
        self._cut.add(table)

    def mend(self) -> None:
        """Remove every cut."""
        for table in sorted(self._cut):
            subprocess.run(["ip", "netns", "exec", self.lab.switch, "nft", "delete", "table",
                            "bridge", table], capture_output=True, check=False)
        self._cut.clear()

    # --- what the tenant was told -------------------------------------------------------

    def progress(self, job: str | None = None, comm: int | None = None,
                 since: int = 0) -> list[tuple[float, dict[str, Any]]]:
        """``job-progress`` bodies told so far (from message ``since`` on), with when."""
        with self._arrived:
            got = self.messages[since:]
        return [(at, m["body"]) for at, m in got if m.get("kind") == "job-progress"
                and (job is None or m["body"]["job"] == job)
                and (comm is None or m["body"]["comm"] == comm & WIRE_MASK)]

    def messages_after(self, since: int, timeout: float) -> list[dict[str, Any]]:
        """Messages from ``since`` on, waiting up to ``timeout`` for one."""
        with self._arrived:
            if len(self.messages) <= since:
                self._arrived.wait(timeout)
            return [m for _, m in self.messages[since:]]

    def mark(self) -> int:
        """Where the messages are now (for ``since``)."""
        with self._arrived:
            return len(self.messages)

    def wait_progress(self, predicate: Callable[[dict[str, Any]], bool], timeout: float,
                      what: str, *, job: str | None = None, comm: int | None = None,
                      since: int = 0) -> tuple[float, dict[str, Any]]:
        """The first ``job-progress`` body from ``since`` on that satisfies ``predicate``,
        and when it was read; AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                for at, body in self.progress(job, comm, since):
                    if predicate(body):
                        return at, body
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the tenant was not told {what} within {timeout:g} s")
                self._arrived.wait(left)
