"""What the scheduler-loop tests share: a Slurm cluster, a controller whose
``[scheduler]`` runs scontrol through a wrapper the test can make fail or hang, and a
real agent on the fake NVML mapped to a Slurm node."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.slurm import SlurmCluster
from tests.daemons import (
    NO_LINKS,
    Agent,
    Controller,
    fake_gpus,
    gpu_section,
    start_agent,
    start_controller,
    wait_until,
)

#: The wrapper fails while scontrol.fail exists, refuses changes while
#: scontrol.refuse exists, hangs while scontrol.hang exists, else runs scontrol.
WRAPPER = """#!/bin/sh
[ -e {dir}/scontrol.hang ] && exec sleep 600
if [ -e {dir}/scontrol.fail ]; then
  echo "slurm_load_node error: Unable to contact slurm controller (connect failure)" >&2
  exit 1
fi
if [ -e {dir}/scontrol.refuse ] && [ "$1" = update ]; then
  echo "slurm_update error: Access/permission denied" >&2
  exit 1
fi
SLURM_CONF={conf} exec /usr/bin/scontrol "$@"
"""


def scontrol_wrapper(workdir: Path, cluster: SlurmCluster) -> Path:
    path = workdir / "scontrol"
    path.write_text(WRAPPER.format(dir=workdir, conf=cluster.conf))
    path.chmod(0o755)
    return path


def scheduler_section(workdir: Path, cluster: SlurmCluster, *, mode: str = "act",
                      share: float = 1.0, hosts: tuple[str, ...] = ("h1",)) -> str:
    """``hosts[i]`` is the cluster's i-th node (node_map: host ids are not node names)."""
    mapping = ", ".join(f'{h} = "{n}"' for h, n in zip(hosts, cluster.nodes, strict=False))
    return (f'[scheduler]\nbackend = "slurm"\nmode = "{mode}"\nmax_share = {share}\n'
            f'scontrol = "{scontrol_wrapper(workdir, cluster)}"\ntimeout = 1.0\n'
            f"reconcile = 1.0\nnode_map = {{ {mapping} }}\n")


@dataclass
class Rig:
    cluster: SlurmCluster
    controller: Controller
    workdir: Path
    spawn: Any

    def agent(self, name: str = "h1", gpus: int = 4) -> Agent:
        _, env = fake_gpus(self.workdir / name if (self.workdir / name).is_dir()
                           else _made(self.workdir / name), gpus=gpus)
        return start_agent(self.spawn, self.workdir, name, endpoint=self.controller.listen,
                           env=env, links=NO_LINKS + gpu_section())

    def node(self, index: int = 0) -> dict[str, str]:
        return self.cluster.node(self.cluster.nodes[index])

    def drained(self, index: int = 0) -> bool:
        return "DRAIN" in self.node(index).get("State", "").split("+")

    def view(self) -> dict[str, Any]:
        return self.controller.request("scheduler")

    def row(self, index: int = 0) -> dict[str, Any]:
        name = self.cluster.nodes[index]
        return next((r for r in self.view()["nodes"] if r["node"] == name), {})

    def passes_after(self, count: int = 2) -> None:
        """Until the loop read the scheduler ``count`` more times (it had its chance)."""
        start = self.view()["counters"]["passes"]
        wait_until(lambda: self.view()["counters"]["passes"] >= start + count,
                   what=f"{count} more scheduler passes")

    def restart_controller(self) -> None:
        proc = self.controller.proc
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        ports = (int(self.controller.listen.rsplit(":", 1)[1]),
                 int(self.controller.feed.rsplit(":", 1)[1]))
        text = self.controller.config.read_text()
        section = text[text.index("[scheduler]"):]
        self.controller = start_controller(self.spawn, self.workdir, section, ports=ports)

    def log_lines(self, needle: str) -> list[str]:
        return [line for line in self.controller.log.read_text(errors="replace").splitlines()
                if needle in line]


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_rig(spawn: Any, workdir: Path, cluster: SlurmCluster, extra: str = "",
              **section: Any) -> Rig:
    """``extra``: more sections for the controller, before [scheduler]."""
    controller = start_controller(spawn, workdir, extra + scheduler_section(
        workdir, cluster, **section))
    return Rig(cluster, controller, workdir, spawn)


def hand(cluster: SlurmCluster, *args: str) -> None:
    """An operator's own scontrol (not through the controller)."""
    subprocess.run(["scontrol", *args], check=True, env={**os.environ,
                                                          "SLURM_CONF": str(cluster.conf)},
                   capture_output=True, timeout=30)
