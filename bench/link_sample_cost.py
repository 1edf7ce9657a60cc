"""link-sample-cost: CPU time of one link-observer sampling pass over 4 interfaces.

A namespace with four watched interfaces (eth0 towards a peer namespace and
three more veths), our eBPF programs attached by the real ``LinksObserver``,
and iperf3 traffic on eth0 while we sample, so rates, classes and
retransmit attribution all have work to do. The figure is the median CPU time
(of the sampling thread) of one ``sample()`` call, the way the agent makes it
every interval. Last line: ``link-sample-cost VALUE us``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.netns import Lab  # noqa: E402


def inner(samples: int, idle_first: bool = True) -> None:
    """Inside the namespace: start the observer, sample, print per-pass CPU time."""
    from agent.links.observer import LinksObserver  # noqa: PLC0415
    from agent.links.settings import LinkMode, LinksSection  # noqa: PLC0415

    observer = LinksObserver(LinksSection(include=("eth0", "x*"), mode=LinkMode.EBPF,
                                          speeds={"eth0": 10000}))
    observer.start()
    try:
        for _ in range(20):  # warm caches and the route cache
            observer.sample(time.time())
            time.sleep(0.01)
        print(observer.detail)
        for phase in ("idle", "traffic"):
            if phase == "traffic":
                print("start traffic", flush=True)
                sys.stdin.readline()  # the parent started iperf3
            costs = []
            for _ in range(samples):
                began = time.thread_time_ns()
                sample = observer.sample(time.time())
                costs.append((time.thread_time_ns() - began) / 1000)
                time.sleep(0.01)
            assert len(sample.links) == 4, sample
            print(" ".join(f"{c:.1f}" for c in costs), flush=True)
    finally:
        observer.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--inner", action="store_true")
    args = parser.parse_args()
    if args.inner:
        inner(args.samples)
        return 0
    with Lab(["a", "b"], pair=True, tag="lsc") as lab:
        for i in range(1, 4):
            subprocess.run(lab.cmd("a", ["ip", "link", "add", f"x{i}", "type", "veth", "peer",
                                         "name", f"y{i}"]), check=True)
            subprocess.run(lab.cmd("a", ["ip", "link", "set", f"x{i}", "up"]), check=True)
            subprocess.run(lab.cmd("a", ["ip", "link", "set", f"y{i}", "up"]), check=True)
        probe = subprocess.Popen(
            lab.cmd("a", [sys.executable, __file__, "--inner", "--samples", str(args.samples)]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert probe.stdin is not None and probe.stdout is not None
        detail = probe.stdout.readline().strip()
        idle = [float(c) for c in probe.stdout.readline().split()]
        probe.stdout.readline()  # "start traffic"
        server = subprocess.Popen(lab.cmd("b", ["iperf3", "-s", "-1"]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.2)
        client = subprocess.Popen(lab.cmd("a", ["iperf3", "-c", lab.addr("b"), "-t", "30"]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            probe.stdin.write("go\n")
            probe.stdin.flush()
            busy = [float(c) for c in probe.stdout.readline().split()]
            probe.wait(timeout=60)
        finally:
            for proc in (client, server, probe):
                proc.kill()
                proc.wait()
    print(detail)
    for name, costs in (("idle", idle), ("under iperf3 traffic", busy)):
        print(f"{name}: {len(costs)} passes, median {statistics.median(costs):.0f} us, "
              f"p90 {sorted(costs)[int(0.9 * len(costs))]:.0f} us")
    print(f"link-sample-cost {statistics.median(busy):.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
