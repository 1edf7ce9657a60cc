"""xid-reaction: an XID injected into the (fake) driver to the condition on the operator socket.

A real agent with eight fake GPUs at the default 100 ms interval. Each round
injects XID 74 (NVLink error: the GPU turns suspect) on the next GPU and polls
the agent's socket until that GPU's XID count has moved and its Xid condition
holds. The fake library checks its state file for new events every ~5 ms,
which is part of the figure (a real driver wakes the waiting thread at once).
Last line: ``xid-reaction VALUE ms``, the p99.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import daemon, percentile, scratch
from harmonaize.opsocket import request
from testbed.fakegpu import STATE_ENV, FakeNvml, library_path


def xids(sock: Path, gpu: int) -> tuple[int, bool]:
    row = request(sock, "health")["gpus"][gpu]
    return row["xids"], any(c["type"] == "Xid" for c in row["conditions"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=240)
    args = parser.parse_args()
    with scratch() as work:
        fake = FakeNvml(work / "gpus.state", gpus=8)
        config = work / "agent.toml"
        sock = work / "agent.sock"
        config.write_text(
            f'[agent]\nhost_id = "bench"\nstate_dir = "{work / "state"}"\nlog_level = "error"\n'
            f'[socket]\npath = "{sock}"\n[observers.links]\nenabled = false\n'
            f'[observers.gpu]\nnvml_library = "{library_path()}"\nxid_hold = 3600\n'
        )
        os.environ[STATE_ENV] = str(fake.path)
        with daemon("agent.main", config, work / "agent.log", sock):
            time.sleep(1.0)
            latencies = []
            for n in range(args.rounds):
                gpu = n % 8
                before, _ = xids(sock, gpu)
                began = time.perf_counter()
                fake.inject_xid(gpu, 74)
                while True:
                    count, holding = xids(sock, gpu)
                    if count > before and holding:
                        break
                    time.sleep(0.0005)
                latencies.append((time.perf_counter() - began) * 1000)
                time.sleep(0.02)
    print(f"{len(latencies)} XIDs: median {statistics.median(latencies):.1f} ms, "
          f"p99 {percentile(latencies, 99):.1f} ms, max {max(latencies):.1f} ms "
          "(sampling interval 100 ms)")
    print(f"xid-reaction {percentile(latencies, 99):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
