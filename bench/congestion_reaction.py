"""congestion-reaction: congestion onset to a new collective policy in shared memory.

Two namespaces joined by a veth pair. The agent runs in "a" at the default
100 ms interval, watching eth0 with eBPF and told it carries 100 Mb/s; a job
is declared, and a stand-in rank (tests/bin/nccl_rank.py, the real tuner
plugin) issues 1000 collectives a second so the policy lists a communicator.
In "b" an iperf3 UDP sender pushes 200 Mb/s at "a" through a TBF qdisc that
serves as a gate: closed (8 kbit/s, the packets are dropped in "b") or open
(10 Gbit/s). Each round opens the gate (the onset: the link goes from idle to
full within a millisecond), then polls the policy file, as the plugin maps
it, every millisecond until the communicator's entry switches to a congested
choice; closes the gate and waits for the policy to return to NCCL's own
choice. The figure is the time from onset to the new policy, in sampling
intervals; the p99 over the rounds is the last line:
``congestion-reaction VALUE intervals`` (target: <= 2).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import answers, percentile, scratch, wait_until  # noqa: E402
from harmonaize.opsocket import request  # noqa: E402
from testbed.netns import Lab  # noqa: E402

JOB = "bench-job"
COMM = 0x5EED00000000BE4C
SPEED = 100
DECLARATION = {
    "job": JOB, "revision": 1,
    "tuning": [{"collectives": ["allreduce"], "algorithms": ["ring", "tree"],
                "protocols": ["ll", "simple"], "min_channels": 2, "max_channels": 16}],
}


def gate(lab: Lab, rate: str) -> None:
    done = lab.run("b", ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:",
                         "tbf", "rate", rate, "burst", "64kb", "limit", "64kb"])
    if done.returncode != 0:
        raise RuntimeError(f"tc: {done.stderr.strip()}")


def policy_choice(path: Path) -> int | None:
    """The ruleset the communicator follows after its switching point (None: NCCL's),
    armed or confirmed (for one host both are written in the same pass)."""
    from agent.plugin.shm import read_policy  # noqa: PLC0415

    try:
        entry = read_policy(path).entry(COMM)
    except (OSError, ValueError):
        return None
    return None if entry is None else entry.after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("congestion-reaction needs root (network namespaces)", file=sys.stderr)
        return 1
    subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "tuner")], check=True)
    with scratch() as work, Lab(["a", "b"], pair=True) as lab:
        tuner = work / "tuner"
        sock = work / "agent.sock"
        config = work / "agent.toml"
        config.write_text(
            f'[agent]\nhost_id = "bench"\nstate_dir = "{work / "state"}"\n'
            f'interval = {args.interval}\nlog_level = "warning"\n'
            f'[socket]\npath = "{sock}"\ngroup = ""\n'
            '[observers.links]\ninclude = ["eth0"]\nmode = "ebpf"\n'
            f"speeds = {{ eth0 = {SPEED} }}\n[observers.gpu]\nenabled = false\n"
            f'[tuning]\npolicy_dir = "{tuner}"\nhold = 0.3\nmax_changes_per_minute = 600\n'
            "htb = false\n")
        agent = lab.popen("a", [sys.executable, "-m", "agent.main", "-c", str(config)],
                          log=work / "agent.log")
        wait_until(lambda: answers(sock) or agent.poll() is not None, timeout=120)
        if agent.poll() is not None:
            sys.stderr.write((work / "agent.log").read_text())
            return 1
        request(sock, "declare", {"declaration": DECLARATION})
        env = {**os.environ, "HARMONAIZE_JOB": JOB, "HARMONAIZE_TUNER_DIR": str(tuner)}
        lab.popen("a", [sys.executable, str(ROOT / "tests" / "bin" / "nccl_rank.py"),
                        str(ROOT / "native" / "build" / "libnccl-tuner-harmonaize.so"),
                        hex(COMM), "1", "1", "1000", str(work / "rank.log")], env=env)
        wait_until(lambda: request(sock, "policy", {"job": JOB})["communicators"], timeout=60)
        gate(lab, "8kbit")
        lab.popen("a", ["iperf3", "-s", "-p", "5301"], log=work / "iperf-server.log")
        time.sleep(0.3)
        lab.popen("b", ["iperf3", "-c", lab.addr("a"), "-p", "5301", "-u", "-b", "200M",
                        "-t", "3600", "-l", "1400"], log=work / "iperf-client.log")
        from agent.plugin.shm import policy_path  # noqa: PLC0415

        path = policy_path(tuner, JOB)
        intervals = []
        for _ in range(args.rounds):
            wait_until(lambda: policy_choice(path) is None, timeout=60)
            time.sleep(0.5 + (time.monotonic() % 0.1))  # onsets at any phase of the pass
            gate(lab, "10gbit")
            onset = time.monotonic()
            while policy_choice(path) is None:
                if time.monotonic() - onset > 30:
                    raise RuntimeError("no policy change within 30 s")
                time.sleep(0.001)
            intervals.append((time.monotonic() - onset) / args.interval)
            gate(lab, "8kbit")
        steps = [h for h in request(sock, "policy", {"job": JOB})["history"]
                 if h["kind"] == "local" and h["from"] == "default"]
        in_agent = [h["step"] - h["onset_step"] for h in steps if h["onset_step"] is not None]
    print(f"{len(intervals)} onsets at {args.interval * 1000:.0f} ms sampling: median "
          f"{statistics.median(intervals):.2f}, p99 {percentile(intervals, 99):.2f}, "
          f"max {max(intervals):.2f} intervals from onset to the new policy in shared memory; "
          f"the agent changed it {max(in_agent, default=0)} passes at most after the pass "
          "that saw the congestion; target <= 2 intervals")
    print(f"congestion-reaction {percentile(intervals, 99):.2f} intervals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
