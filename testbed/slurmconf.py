"""The throwaway Slurm cluster's ``slurm.conf``: every daemon on 127.0.0.1, its state,
spool, pid and log files under one directory, jobs tracked in cgroups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

SLURM_USER = "slurm"


def slurm_conf(*, hostname: str, ctld_port: int, munge_socket: Path, directory: Path,
               nodes: Mapping[str, int], cpus: int, node_extra: str, partition: str,
               extra: Sequence[str]) -> str:
    """The text of ``slurm.conf``; ``nodes`` maps each node name to its slurmd's port,
    ``extra`` lines are appended as they are."""
    d = directory
    lines = [
        "ClusterName=hz",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmUser={SLURM_USER}",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={munge_socket}",
        "CredType=cred/munge",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "MailProg=/bin/true",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=300",
        "SlurmdTimeout=30",
    ]
    for node, port in nodes.items():
        lines.append(f"NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 "
                     f"Port={port} CPUs={cpus} State=UNKNOWN {node_extra}".rstrip())
    lines.append(f"PartitionName={partition} Nodes={','.join(nodes)} "
                 "Default=YES State=UP MaxTime=INFINITE")
    lines.extend(extra)
    return "\n".join(lines) + "\n"
