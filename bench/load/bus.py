"""The bus the cluster benchmarks load: one JetStream node in a scratch directory, and
its streams and buckets made as a replica makes them."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from bench.common import free_port
from controller.bus.nats import Bus
from controller.config import load
from testbed.natscluster import nats_server


def jetstream(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A nats-server with JetStream storing under ``work``, and its URL (its log in
    work/nats.log); the caller stops it."""
    port = free_port()
    with (work / "nats.log").open("wb") as out:
        server = subprocess.Popen([nats_server(), "-a", "127.0.0.1", "-p", str(port),
                                   "-js", "-sd", str(work / "js")], stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    return server, f"nats://127.0.0.1:{port}"


def replica_bus(work: Path, cfg: Path, cpus: set[int]) -> subprocess.Popen[bytes]:
    """A JetStream node on ``cpus`` (streams of one copy), and the controller configured at
    ``cfg`` made the one replica of a cluster on it; the caller stops the node."""
    server, url = jetstream(work)
    os.sched_setaffinity(server.pid, cpus)
    with cfg.open("a") as f:
        f.write(f'[cluster]\nenabled = true\nreplica = "r1"\nservers = ["{url}"]\n'
                "stream_replicas = 1\n")
    return server


async def prepare(cfg_path: Path) -> None:
    """The streams and buckets, as a replica makes them."""
    cfg, _ = load(cfg_path)
    bus = Bus(cfg.cluster)
    await bus.connect()
    await bus.epoch()
    logging.getLogger("harmonaize").setLevel(logging.ERROR)  # "lost the connection": closed
    await bus.close()
