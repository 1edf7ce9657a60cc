"""The leader candidates: a replica's leader (controller/bus/leader.py) in a process of
its own, contending for the lease, with the configuration each one reads."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from controller.bus.leader import Leader
from controller.bus.nats import Bus
from controller.config import load

CANDIDATES = ("r1", "r2", "r3")


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


def config(work: Path, url: str, name: str, lease: float, snapshot: float) -> Path:
    path = work / f"{name}.toml"
    path.write_text(
        f'[controller]\ndatabase = "{work / name}.db"\nlog_level = "info"\n'
        '[pools]\nnames = ["scale"]\ngpu_classes = ["H200"]\n'
        f'[cluster]\nenabled = true\nreplica = "{name}"\nservers = ["{url}"]\n'
        f'stream_replicas = 1\nlease = {lease}\nsnapshot_interval = {snapshot}\n')
    return path


async def prepare(cfg_path: Path) -> None:
    """The streams and buckets, as a replica makes them."""
    cfg, _ = load(cfg_path)
    bus = Bus(cfg.cluster)
    await bus.connect()
    await bus.epoch()
    logging.getLogger("harmonaize").setLevel(logging.ERROR)  # "lost the connection": closed
    await bus.close()


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
