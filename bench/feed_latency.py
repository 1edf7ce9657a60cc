"""feed-latency: an event on a host's agent to the owning tenant's job-scoped message.

A real controller, a real agent on eight fake GPUs and the owning tenant's feed
client, on loopback, all authenticated as in production. Eight jobs of tenant
``acme`` each run one rank on their own GPU; the controller knows the
placements. Each round injects XID 74 (an NVLink error: the GPU turns suspect)
on the next job's GPU; the agent judges it, publishes a checkpoint advisory,
the controller commits it, rebuilds it from the placement and publishes it on
``job/acme/<job>/``; the clock stops when the tenant has it. Between two rounds
on one GPU the XID lapses and the GPU is healthy again (short holds), so every
round is a new risk. The figure is the p99 over the rounds; it includes the
fake library's ~5 ms event poll and the controller's durable commit.

Pool capacity is not a per-event message any more: the private feed releases
each pool's noisy count on its own data-independent schedule
(``redaction.release_interval``, 900 s by default), so a change reaches tenants
at the next release whatever the pipeline's speed. The benchmark reports that
schedule on a line of its own instead of timing it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import daemon, free_port, percentile, scratch, wait_until
from controller.redactionconfig import RedactionConfig
from harmonaize.messages import JobAdvisory
from harmonaize.opsocket import request
from harmonaize.tenant import FeedClient
from testbed.fakegpu import STATE_ENV, FakeNvml, library_path
from testbed.keyring import Credentials, Keyring

GPUS = 8


def sleeper(job: str, rank: str) -> subprocess.Popen[bytes]:
    """A stand-in for a training rank, labelled by the provider's scheduler."""
    env = {**os.environ, "HARMONAIZE_JOB": job, "RANK": rank}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], env=env)


def healthy(sock: Path, gpu: int) -> bool:
    row = next(g for g in request(sock, "health")["gpus"] if g["index"] == gpu)
    return row["state"] == "healthy"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    with scratch() as work:
        keyring = Keyring(work / "keys")
        tenant_keys = keyring.tenant("acme")
        listen, feed = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        ctl_cfg = work / "controller.toml"
        ctl_cfg.write_text(
            f'[controller]\nlisten = "{listen}"\nfeed = "{feed}"\n'
            f'admin_socket = "{work / "controller.sock"}"\ndatabase = "{work / "c.db"}"\n'
            'log_level = "warning"\n'
            '[pools]\nnames = ["default"]\ngpu_classes = ["H200"]\n'
            + keyring.controller_config()
        )
        fake = FakeNvml(work / "gpus.state", gpus=GPUS)
        fake.save()
        os.environ[STATE_ENV] = str(fake.path)
        agent_cfg = work / "agent.toml"
        agent_sock = work / "agent.sock"
        # Holds short enough that a GPU is healthy again before its next round.
        agent_cfg.write_text(
            f'[agent]\nhost_id = "bench-host"\nstate_dir = "{work / "state"}"\n'
            'log_level = "warning"\n'
            f'[socket]\npath = "{agent_sock}"\n[controller]\nendpoint = "{listen}"\n'
            + keyring.agent_config("bench-host")
            + "[observers.links]\nenabled = false\n"
            f'[observers.gpu]\nnvml_library = "{library_path()}"\nslow_interval = 0.2\n'
            "xid_hold = 0.3\nsuspect_clear = 0.3\n"
        )
        jobs = [f"job-{gpu}" for gpu in range(GPUS)]
        ranks = [sleeper(job, str(gpu)) for gpu, job in enumerate(jobs)]
        try:
            for gpu, rank in enumerate(ranks):
                fake.set(gpu, processes={rank.pid: 1 << 30})
            with (
                daemon("controller.main", ctl_cfg, work / "controller.log",
                       work / "controller.sock"),
                daemon("agent.main", agent_cfg, work / "agent.log", agent_sock),
            ):
                wait_until(lambda: sum(bool(g["jobs"]) for g in
                                       request(agent_sock, "health")["gpus"]) == GPUS)
                for gpu, job in enumerate(jobs):
                    request(work / "controller.sock", "place", {
                        "job": job, "tenant": "acme",
                        "members": [{"name": str(gpu), "host": "bench-host"}]})
                latencies = rounds(args.rounds, fake, agent_sock, feed, tenant_keys)
        finally:
            for rank in ranks:
                rank.kill()
                rank.wait()
    p50, p99 = statistics.median(latencies), percentile(latencies, 99)
    spread = f"quartiles {percentile(latencies, 25):.2f}-{percentile(latencies, 75):.2f} ms"
    print(f"rounds {len(latencies)}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, {spread}, "
          f"max {max(latencies):.2f} ms (XID to the owning tenant's advisory)")
    print(f"pool capacity: released on schedule every "
          f"{RedactionConfig().release_interval:.0f} s (redaction.release_interval), "
          "not per event")
    print(f"feed-latency {p99:.2f} ms")
    return 0


def rounds(count: int, fake: FakeNvml, agent_sock: Path, feed: str,
           tenant_keys: Credentials) -> list[float]:
    latencies: list[float] = []
    with FeedClient(feed, ["job/acme/"], key=tenant_keys.key,
                    server_key=tenant_keys.server_key) as tenant:
        for n in range(count):
            gpu = n % GPUS
            wait_until(lambda g=gpu: healthy(agent_sock, g))
            topic = f"job/acme/job-{gpu}/"
            began = time.perf_counter()
            fake.inject_xid(gpu, 74)
            while True:
                message = tenant.recv(timeout=10)
                if message is None:
                    raise SystemExit(f"the tenant missed the advisory of round {n}")
                if isinstance(message.body, JobAdvisory) and message.topic == topic:
                    break
            latencies.append((time.perf_counter() - began) * 1000)
    return latencies


if __name__ == "__main__":
    sys.exit(main())
