"""The leader candidates: a replica's leader (controller/bus/leader.py) in a process of
its own, contending for the lease, with the configuration each one reads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import msgpack

from bench.region.load import RANKS, host_name, job_hosts, job_name
from controller.bus.leader import Leader
from controller.bus.nats import LEADER_ADMIN, SNAPSHOTS, Bus
from controller.config import load

CANDIDATES = ("r1", "r2", "r3")
TENANT = "acme"


def candidate(cfg_path: Path, mirror: Path) -> None:
    """A replica's leader, contending for the lease until SIGTERM (or SIGKILL)."""
    cfg, _ = load(cfg_path)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")

    async def run() -> None:
        bus = Bus(cfg.cluster)
        await bus.connect()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await Leader(cfg, bus, await bus.epoch(), mirror).run(stop)
        await bus.close()

    asyncio.run(run())


def config(work: Path, url: str, name: str, lease: float, snapshot: float, *,
           standby: bool = True) -> Path:
    path = work / f"{name}.toml"
    path.write_text(
        f'[controller]\ndatabase = "{work / name}.db"\nlog_level = "info"\n'
        '[pools]\nnames = ["scale"]\ngpu_classes = ["H200"]\n'
        f'[cluster]\nenabled = true\nreplica = "{name}"\nservers = ["{url}"]\n'
        f'stream_replicas = 1\nlease = {lease}\nsnapshot_interval = {snapshot}\n'
        f'warm_standby = {str(standby).lower()}\n')
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def place_jobs(nc: Any, hosts: int, jobs: int) -> None:
    """A job on each job host, placed through the leader as an operator's command."""
    for j, index in enumerate(job_hosts(hosts, jobs)):
        members = [{"name": str(r), "host": host_name(index)} for r in range(RANKS)]
        request = {"command": "place", "args": {"job": job_name(j), "tenant": TENANT,
                                                "members": members}}
        for _ in range(20):
            with contextlib.suppress(Exception):  # no leader yet, a timeout: again
                reply = await nc.request(LEADER_ADMIN, msgpack.packb(request), timeout=10.0)
                answer = msgpack.unpackb(reply.data, raw=False)
                if "result" in answer and not answer["result"].get("unknown_hosts"):
                    break
            await asyncio.sleep(0.5)
        else:
            raise SystemExit(f"region-failover: the leader did not place {job_name(j)}")


async def snapshot_at(js: Any) -> int:
    """The commit the newest snapshot covers (0: none)."""
    store = await js.object_store(SNAPSHOTS)
    with contextlib.suppress(Exception):
        return max((int(o.name.split("-")[1].split(".")[0]) for o in await store.list()
                    if o.name.startswith("leader-")), default=0)
    return 0
