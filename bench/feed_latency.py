"""feed-latency: an event on a host's agent to the tenant receiving the aggregate.

A real controller, a real agent and a tenant feed client on loopback. Each
round an operator drains or undrains the host through the agent's socket; the
agent publishes its new summary, the controller commits it, re-aggregates the
pool and publishes the new capacity; the clock stops when the tenant has it.
The figure is the p99 over the rounds (it includes the operator socket and the
controller's durable commit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import daemon, free_port, percentile, scratch
from harmonaize.messages import PoolCapacity
from harmonaize.opsocket import request
from harmonaize.tenant import FeedClient
from harmonaize.testbed.keyring import Keyring


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1000)
    args = parser.parse_args()
    with scratch() as work:
        keyring = Keyring(work / "keys")  # authenticated, as in production
        tenant_keys = keyring.tenant("bench")
        listen, feed = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        ctl_cfg = work / "controller.toml"
        ctl_cfg.write_text(
            f'[controller]\nlisten = "{listen}"\nfeed = "{feed}"\n'
            f'admin_socket = "{work / "controller.sock"}"\ndatabase = "{work / "c.db"}"\n'
            'log_level = "warning"\n'
            # One host, and no deliberate delay: this measures the pipeline itself. The
            # default host buckets begin 0-1, so one host up reads as none: finer ones.
            "[redaction]\nmin_hosts = 1\nmin_interval = 0\njitter = 0\n"
            "host_buckets = [0, 1, 2]\n"
            '[pools]\nnames = ["p", "default"]\ngpu_classes = ["H200"]\n'
            + keyring.controller_config()
        )
        agent_cfg = work / "agent.toml"
        agent_sock = work / "agent.sock"
        agent_cfg.write_text(
            f'[agent]\nhost_id = "bench-host"\nstate_dir = "{work / "state"}"\n'
            'log_level = "warning"\n'
            f'[socket]\npath = "{agent_sock}"\n[controller]\nendpoint = "{listen}"\n'
            + keyring.agent_config("bench-host")
        )
        with (
            daemon("controller.main", ctl_cfg, work / "controller.log", work / "controller.sock"),
            daemon("agent.main", agent_cfg, work / "agent.log", agent_sock),
            FeedClient(feed, ["pool/"], key=tenant_keys.key,
                       server_key=tenant_keys.server_key) as tenant,
        ):
            first = tenant.recv(timeout=30)
            if first is None:
                raise SystemExit("the tenant never saw the first aggregate")
            latencies = []
            drained = False
            for _ in range(args.rounds):
                drained = not drained
                began = time.perf_counter()
                request(agent_sock, "drain" if drained else "undrain")
                while True:
                    message = tenant.recv(timeout=10)
                    if message is None:
                        raise SystemExit("the tenant missed an aggregate")
                    body = message.body
                    if isinstance(body, PoolCapacity) and (body.hosts_up.lo == 0) == drained:
                        break
                latencies.append((time.perf_counter() - began) * 1000)
    p50, p99 = statistics.median(latencies), percentile(latencies, 99)
    print(f"rounds {len(latencies)}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
          f"max {max(latencies):.2f} ms")
    print(f"feed-latency {p99:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
