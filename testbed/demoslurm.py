"""The demo's Slurm act: a job placed by Slurm alone, its GPU failing, the node drained in
Slurm with our reason, the GPU reset and validated, the node resumed.

Real ``munged``, ``slurmctld`` and ``slurmd`` (:mod:`testbed.slurm`), the
controller and one agent whose host id is the Slurm node's name, all on this machine's
loopback: ``scontrol`` and the slurmd must reach slurmctld on 127.0.0.1, which the
first act's namespaces cannot. ``harmonaize-slurm`` is Slurm's PrologSlurmctld and
EpilogSlurmctld; the controller drains and resumes with ``scontrol`` (mode ``act``);
the agent's remediation resets through the fake ``nvidia-smi``.
"""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from testbed.cluster import SMALL_CLUSTER, TestCluster, wait_until
from testbed.narrate import indent, say, show_tenant
from testbed.netns import Lab
from testbed.slurm import SLURM_USER, SlurmCluster, missing

ROOT = Path(__file__).resolve().parent.parent
TENANT = "acme"
ACCOUNT = "physics"


class Loopback(Lab):
    """The lab's interface with every host on this machine's own network (127.0.0.1)."""

    def __init__(self, hosts: list[str]) -> None:
        self.pair = False
        self.hosts = hosts
        self._procs = []
        self._created = []

    def addr(self, host: str) -> str:
        return "127.0.0.1"

    def cmd(self, host: str, argv: Any) -> list[str]:
        return list(argv)

    def create(self) -> None:
        """Nothing to create: the hosts share this machine's namespace."""


def _hook(workdir: Path, socket: Path, node: str) -> Path:
    """The hook's configuration (tenant map, spool, log) and the program slurmctld runs."""
    base = workdir / "slurm-hook"
    base.mkdir(mode=0o755)
    slurm = pwd.getpwnam(SLURM_USER)
    for name in ("spool", "log"):
        (base / name).mkdir(mode=0o750)
        os.chown(base / name, slurm.pw_uid, slurm.pw_gid)
    config = base / "slurm.toml"
    config.write_text(f'socket = "{socket}"\nspool = "{base / "spool"}"\n'
                      f'log = "{base / "log" / "slurm.log"}"\n'
                      f'[accounts]\n{ACCOUNT} = "{TENANT}"\n[hosts]\n')
    program = base / "harmonaize-slurm"
    # What an operator names in slurm.conf is the installed console script; this one
    # only adds the demo's configuration and checkout.
    program.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m "
                       f'harmonaize.slurm.hook --config {config} "$@"\n')
    program.chmod(0o755)
    return program


def _tasks(path: Path) -> dict[str, int]:
    lines = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    found = {rank: int(pid) for pid, rank in (line for line in lines if len(line) == 2)}
    return found if len(found) >= 2 else {}


def _node_line(slurm: SlurmCluster, node: str) -> str:
    fields = slurm.node(node)
    reason = fields.get("Reason", "")
    return f"slurm | {node}: State={fields.get('State')}" + (f" Reason={reason}" if reason
                                                             else "")


def act(workdir: Path) -> None:
    reason = missing()
    if reason is not None:
        raise RuntimeError(f"the Slurm act cannot run here: {reason}")
    node = f"gpu-{secrets.token_hex(2)}"
    base = workdir / "slurm-act"
    base.mkdir(mode=0o755)
    say(f"Slurm: a real slurmctld and slurmd (node {node}), harmonaize-slurm as its "
        "PrologSlurmctld and EpilogSlurmctld; the controller drains and resumes in Slurm "
        "(mode act; max_share 1.0, since this partition has one node)")
    cluster = TestCluster(Loopback(["controller", node, "tenant"]), base,
                          controller_overrides=(
                              f'admin_group = "{SLURM_USER}"\n'
                              f'scheduler_users = ["{SLURM_USER}"]\n' + SMALL_CLUSTER
                              + '[scheduler]\nbackend = "slurm"\nmode = "act"\n'
                              "max_share = 1.0\nreconcile = 5\n"))
    program = _hook(base, cluster.admin_socket, node)
    with SlurmCluster([node], extra_conf=[f"PrologSlurmctld={program}",
                                          f"EpilogSlurmctld={program}"]) as slurm:
        os.environ["SLURM_CONF"] = str(slurm.conf)  # the controller's scontrol finds it
        try:
            _story(cluster, slurm, node, base)
        finally:
            cluster.lab.close()
            os.environ.pop("SLURM_CONF", None)


def _story(cluster: TestCluster, slurm: SlurmCluster, node: str, base: Path) -> None:
    cluster.start_controller()
    smi = f'["{sys.executable}", "-m", "testbed.fakesmi", "--gpu-reset", ' \
          '"-i", "{pci_bus_id}"]'
    cluster.start_agent(node, extra=(
        '[remediation]\nenabled = true\nmode = "act"\nmax_resets = 2\nreset_interval = 0\n'
        f"reset_command = {smi}\n"))
    print("   " + _node_line(slurm, node), flush=True)
    tenant = cluster.tenant_watch((f"job/{TENANT}/",))

    say(f"the tenant submits a job with plain sbatch/srun under account {ACCOUNT} "
        "(no variable of ours): the prolog records its placement")
    tasks = base / "tasks"
    tasks.touch()
    tasks.chmod(0o666)
    job = slurm.sbatch("-A", ACCOUNT, "-N1", "-n2", "--export=NONE", script=(
        "#!/bin/sh\n"
        f"/usr/bin/srun -n2 /bin/sh -c 'echo $$ $SLURM_PROCID >> {tasks}; "
        "exec /bin/sleep 600'\n"))
    ranks = wait_until(lambda: _tasks(tasks), 60, "the job's two tasks")
    wait_until(lambda: any(j["job"] == job for j in cluster.admin_request("jobs")), 30,
               "the prolog's placement")
    argv = [sys.executable, "-m", "harmonaize.harmonctl", "-C", str(cluster.admin_socket),
            "jobs"]
    print(indent(subprocess.run(argv, check=False, capture_output=True, text=True).stdout),
          flush=True)

    say("its two ranks run on GPUs 0 and 1; the agent finds their job in Slurm's cgroup "
        "and their ranks in SLURM_PROCID")
    gpus = cluster.gpus[node]
    gpus.set(0, processes={ranks["0"]: 1 << 30})
    gpus.set(1, processes={ranks["1"]: 1 << 30})

    def jobs_on(index: int) -> list[dict[str, Any]]:
        rows = cluster.agent_request(node, "health")["gpus"]
        return next(g for g in rows if g["index"] == index)["jobs"]

    wait_until(lambda: jobs_on(1) == [{"job": job, "rank": "1"}], 30, "the job's GPUs")
    print(f"   gpu 0: {jobs_on(0)}, gpu 1: {jobs_on(1)}", flush=True)

    say("GPU 1 reports an uncorrectable ECC error: quarantined (reset-gpu); the tenant is "
        "told in its job's terms, and the node is drained in Slurm with our reason")
    began = time.monotonic()
    gpus.set(1, ecc_dbe_volatile=1)
    tenant.wait_for(lambda m: m.get("kind") == "job-advisory", 30, "the job's advisory",
                    on_message=show_tenant)
    wait_until(lambda: "DRAIN" in slurm.node(node).get("State", ""), 30, "the drain")
    print(f"   {_node_line(slurm, node)}  ({time.monotonic() - began:.1f} s after the "
          "error)", flush=True)
    print(indent(cluster.harmonctl(node, "remediation")), flush=True)

    say("the tenant checkpoints and ends the job: the epilog removes its placement; the "
        "GPU is idle, so remediation resets it, validation runs, the GPU is released and "
        "the node resumed in Slurm")
    slurm.run("scancel", job)
    gpus.set(0, processes={})
    gpus.set(1, processes={})
    wait_until(lambda: all(j["job"] != job for j in cluster.admin_request("jobs")), 30,
               "the epilog's unplace")
    wait_until(lambda: slurm.node(node).get("State") == "IDLE", 90, "the node resumed")
    print(indent(cluster.harmonctl(node, "remediation")), flush=True)
    print(indent(cluster.harmonctl(node, "validations")), flush=True)
    print(f"   {_node_line(slurm, node)}", flush=True)
