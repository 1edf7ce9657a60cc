"""datapath-overhead: TCP throughput lost to our eBPF counters on a veth pair.

Two namespaces joined by one veth pair; iperf3 runs one TCP stream from a to
b, client and server pinned to different CPUs. Each round measures, back to
back and in a rotating order: nothing attached; our tc programs on the
sending host's NIC (what one host's agent costs: its egress sees the data,
its ingress the ACKs; the real ``LinkDatapath`` code without the agent's
sampling loop); our programs on both ends (two hosts' agents, both paid for
by this one machine's CPUs); and, for comparison, a userspace counter that
reads every packet from an AF_PACKET socket on the sending host. Overhead is
1 - median(state/off) over the rounds, so drift on a shared machine cancels
out; the spread of the per-round figures is printed beside it (on a shared
2-core machine single rounds swing by tens of percent, so the median needs
many rounds, and ``datapath-cost`` measures the programs' own time instead).
Last line: ``datapath-overhead VALUE %`` for one host's eBPF counters.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.netns import Lab  # noqa: E402


def hold_ebpf(interface: str) -> None:
    """Inside a namespace: attach our programs to ``interface`` until SIGTERM."""
    from agent.kernel.sysfs import list_devices  # noqa: PLC0415
    from agent.links.datapath import LinkDatapath  # noqa: PLC0415

    datapath = LinkDatapath()
    datapath.load([d for d in list_devices() if d.name == interface])
    datapath.attach()
    _wait_for_term()
    datapath.close()


def hold_afpacket(interface: str) -> None:
    """Inside a namespace: read every packet of ``interface`` in userspace until SIGTERM."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    sock.bind((interface, 0))
    sock.settimeout(0.2)
    buf = bytearray(65536)
    packets = total = 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("ready", flush=True)
    while not stop:
        try:
            total += sock.recv_into(buf)
            packets += 1
        except TimeoutError:
            continue
    sock.close()


def _wait_for_term() -> None:
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("ready", flush=True)
    while not stop:
        time.sleep(0.1)


def throughput(lab: Lab, seconds: float) -> float:
    server = subprocess.Popen(lab.cmd("b", ["iperf3", "-s", "-1", "-A", "1"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.2)
    out = subprocess.run(
        lab.cmd("a", ["iperf3", "-c", lab.addr("b"), "-t", str(seconds + 1), "-O", "1", "-J",
                      "-A", "0"]),
        capture_output=True, text=True, check=True,
    ).stdout
    server.wait(timeout=10)
    return json.loads(out)["end"]["sum_received"]["bits_per_second"]


STATES = {  # state -> (holder mode, hosts)
    "off": ("", ()),
    "ebpf": ("ebpf", ("a",)),
    "ebpf-both": ("ebpf", ("a", "b")),
    "afpacket": ("afpacket", ("a",)),
}


def attached(lab: Lab, state: str) -> list[subprocess.Popen[str]]:
    mode, hosts = STATES[state]
    procs = []
    for host in hosts:
        proc = subprocess.Popen(
            lab.cmd(host, [sys.executable, __file__, f"--hold-{mode}", "eth0"]),
            stdout=subprocess.PIPE, text=True,
        )
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{mode} holder failed to start in {host}")
        procs.append(proc)
    return procs


def release(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=20)


def spread(ratios: list[float]) -> str:
    """The per-round overheads' quartiles and extremes, in percent."""
    lost = sorted((1 - r) * 100 for r in ratios)
    quartiles = statistics.quantiles(lost, n=4) if len(lost) >= 2 else [lost[0]] * 3
    return (f"rounds' quartiles {quartiles[0]:.1f} to {quartiles[2]:.1f} %, "
            f"extremes {lost[0]:.1f} to {lost[-1]:.1f} %")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--hold-ebpf", metavar="IFACE")
    parser.add_argument("--hold-afpacket", metavar="IFACE")
    args = parser.parse_args()
    if args.hold_ebpf:
        hold_ebpf(args.hold_ebpf)
        return 0
    if args.hold_afpacket:
        hold_afpacket(args.hold_afpacket)
        return 0
    measured = [state for state in STATES if state != "off"]
    ratios: dict[str, list[float]] = {state: [] for state in measured}
    with Lab(["a", "b"], pair=True, tag="bench") as lab:
        throughput(lab, 1.0)  # warm-up
        for round_no in range(args.rounds):
            order = list(STATES)
            order = order[round_no % len(order):] + order[:round_no % len(order)]
            results = {}
            for state in order:
                procs = attached(lab, state)
                try:
                    results[state] = throughput(lab, args.seconds)
                finally:
                    release(procs)
            for state in measured:
                ratios[state].append(results[state] / results["off"])
            print(f"round {round_no + 1}: " + ", ".join(
                f"{state} {results[state] / 1e9:.2f} Gb/s" for state in STATES), flush=True)
    overhead = {state: (1 - statistics.median(r)) * 100 for state, r in ratios.items()}
    for state, label in (("ebpf", "eBPF counters on the sending host"),
                         ("ebpf-both", "eBPF counters on both ends (two hosts on one machine)"),
                         ("afpacket", "userspace AF_PACKET counter on the sending host")):
        print(f"{label}: {overhead[state]:.1f} % throughput lost; {spread(ratios[state])}")
    print(f"(medians of {args.rounds} interleaved rounds)")
    print(f"datapath-overhead {overhead['ebpf']:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
