"""scheduler-reaction: a GPU quarantined in the agent to its node drained in slurmctld.

Real munged, slurmctld and two slurmd (testbed/slurm.py), a real controller
with ``[scheduler]`` in act mode and a real agent on four fake GPUs, mapped to the first
node. Each round quarantines GPU 2 (``harmonctl drain --gpu 2``) and polls ``scontrol
show node`` until the node shows DRAIN with our reason; then releases the GPU and waits
for the resume (not timed) and a quiet second: the loop runs at most four passes a
second in the long run (ten back to back), so rounds closer together would measure that
limit rather than the reaction. The path: the agent's pass, its summary to the controller,
one scontrol read of the nodes and reservations, the drain. Last line:
``scheduler-reaction VALUE s``, the p99. Needs root.
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
from harmonaize.opsocket import request
from testbed.fakegpu import STATE_ENV, FakeNvml, library_path
from testbed.slurm import SlurmCluster, missing


def drained(env: dict[str, str], node: str) -> bool:
    line = subprocess.run(["scontrol", "-o", "show", "node", node], env=env, check=True,
                          capture_output=True, text=True, timeout=30).stdout
    state = line.split(" State=", 1)[1].split(" ", 1)[0]
    return "DRAIN" in state.split("+") and " Reason=hz: gpu 2" in line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    why = missing()
    if why is not None:
        print(f"scheduler-reaction: cannot start Slurm here: {why}", file=sys.stderr)
        return 2
    with scratch() as work, SlurmCluster(count=2) as cluster:
        node = cluster.nodes[0]
        wrapper = work / "scontrol"
        wrapper.write_text(f"#!/bin/sh\nSLURM_CONF={cluster.conf} exec /usr/bin/scontrol "
                           '"$@"\n')
        wrapper.chmod(0o755)
        listen = f"tcp://127.0.0.1:{free_port()}"
        controller = work / "controller.toml"
        admin = work / "controller.sock"
        controller.write_text(
            f'[controller]\nlisten = "{listen}"\nfeed = "tcp://127.0.0.1:{free_port()}"\n'
            f'admin_socket = "{admin}"\ndatabase = "{work / "controller.db"}"\n'
            f'admin_group = ""\nlog_level = "warning"\n[auth]\nmode = "none"\n'
            f'[scheduler]\nbackend = "slurm"\nmode = "act"\nmax_share = 1.0\n'
            f'scontrol = "{wrapper}"\nnode_map = {{ bench = "{node}" }}\n')
        fake = FakeNvml(work / "gpus.state", gpus=4)
        fake.save()
        agent = work / "agent.toml"
        sock = work / "agent.sock"
        agent.write_text(
            f'[agent]\nhost_id = "bench"\nstate_dir = "{work / "state"}"\n'
            f'log_level = "error"\n[socket]\npath = "{sock}"\n'
            f'[controller]\nendpoint = "{listen}"\nserver_key = ""\n'
            f'[observers.links]\nenabled = false\n'
            f'[observers.gpu]\nnvml_library = "{library_path()}"\n')
        os.environ[STATE_ENV] = str(fake.path)
        with daemon("controller.main", controller, work / "controller.log", admin), \
                daemon("agent.main", agent, work / "agent.log", sock):
            wait_until(lambda: request(admin, "scheduler")["nodes"], timeout=60)
            env = cluster.env
            latencies = []
            for _ in range(args.rounds):
                began = time.perf_counter()
                request(sock, "drain", {"gpu": 2, "reason": "bench"})
                while not drained(env, node):
                    time.sleep(0.005)
                latencies.append(time.perf_counter() - began)
                request(sock, "release", {"gpu": 2, "force": True})
                wait_until(lambda: not drained(env, node), timeout=60)
                time.sleep(1.0)
    print(f"{len(latencies)} rounds: median {statistics.median(latencies):.3f} s, "
          f"p99 {percentile(latencies, 99):.3f} s, max {max(latencies):.3f} s")
    print(f"scheduler-reaction {percentile(latencies, 99):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
