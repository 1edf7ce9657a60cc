"""agent-cost: CPU share of one core and RSS of the whole agent at 10 Hz.

The real agent, in a network namespace with four watched interfaces (eBPF
link counters attached), eight fake GPUs behind the real pynvml, the host and
RDMA observers, and its operator socket, sampling every 100 ms. After a
warm-up, CPU time (user + system, all threads) is read from /proc over a
measurement window, as the median of several consecutive windows. Beside it,
over the same windows, runs a baseline: a Python process with the agent's
imports and an empty 10 Hz asyncio loop, the cheapest daemon of this shape.
On a virtual machine every wakeup and page walk is expensive and noisy, so
the baseline says how much of the figure is the machine. Last line:
``agent-cost VALUE %`` of one core (the agent's own median).
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

from bench.common import answers, scratch, wait_until  # noqa: E402
from harmonaize.opsocket import request  # noqa: E402
from testbed.fakegpu import STATE_ENV, FakeNvml, library_path  # noqa: E402
from testbed.netns import Lab  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
BASELINE = f"""
import asyncio, gc, sys
sys.path.insert(0, {str(ROOT)!r})
import agent.daemon, agent.observers, pynvml, pyroute2, zmq
gc.freeze()
async def tick():
    while True:
        await asyncio.sleep(0.1)
asyncio.run(tick())
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime, all threads


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (threads of one name added up)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        name = name.rstrip("0123456789") or name
        fields = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one window")
    parser.add_argument("--windows", type=int, default=7)
    args = parser.parse_args()
    with scratch() as work, Lab(["a", "b"], pair=True, tag="cost") as lab:
        work.chmod(0o755)
        for i in range(1, 4):
            subprocess.run(lab.cmd("a", ["ip", "link", "add", f"x{i}", "type", "veth", "peer",
                                         "name", f"y{i}"]), check=True)
            subprocess.run(lab.cmd("a", ["ip", "link", "set", f"x{i}", "up"]), check=True)
        fake = FakeNvml(work / "gpus.state", gpus=8)
        sock = work / "agent.sock"
        config = work / "agent.toml"
        config.write_text(
            f'[agent]\nhost_id = "bench"\nstate_dir = "{work / "state"}"\ninterval = 0.1\n'
            f'log_level = "warning"\n[socket]\npath = "{sock}"\n'
            '[observers.links]\ninclude = ["eth0", "x*"]\nmode = "ebpf"\n'
            f'[observers.gpu]\nnvml_library = "{library_path()}"\n'
        )
        env = {**os.environ, STATE_ENV: str(fake.path)}
        idle = subprocess.Popen(lab.cmd("a", [sys.executable, "-c", BASELINE]))
        with (work / "agent.log").open("wb") as log:
            proc = subprocess.Popen(lab.cmd("a", [sys.executable, "-m", "agent.main", "-c",
                                                  str(config)]),
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until(lambda: answers(sock))
            status = request(sock, "status")
            running = [o["name"] for o in status["observers"] if o["state"] == "running"]
            time.sleep(args.warmup)
            passes0 = request(sock, "status")["loop"]["passes"]
            threads0, began = thread_cpu(proc.pid), time.monotonic()
            shares, baseline = [], []
            for _ in range(args.windows):
                cpu0, idle0, t0 = cpu_seconds(proc.pid), cpu_seconds(idle.pid), time.monotonic()
                time.sleep(args.seconds)
                elapsed = time.monotonic() - t0
                shares.append((cpu_seconds(proc.pid) - cpu0) / elapsed * 100)
                baseline.append((cpu_seconds(idle.pid) - idle0) / elapsed * 100)
            threads1, ended = thread_cpu(proc.pid), time.monotonic()
            status = request(sock, "status")
            rss = rss_mb(proc.pid)
        finally:
            proc.terminate()
            idle.kill()
            proc.wait(timeout=20)
            idle.wait(timeout=20)
    share = statistics.median(shares)
    rate = (status["loop"]["passes"] - passes0) / (ended - began)
    durations = ", ".join(f"{o['name']} {o['last_duration_seconds'] * 1e6:.0f} us"
                          for o in status["observers"] if o["state"] == "running")
    print(f"observers running: {', '.join(running)}; {rate:.1f} passes/s; "
          f"last pass {status['loop']['last_pass_seconds'] * 1e6:.0f} us ({durations}); "
          f"RSS {rss:.0f} MB")
    by_thread = {name: (threads1[name] - threads0.get(name, 0.0)) / (ended - began) * 100
                 for name in threads1}
    print("by thread: " + ", ".join(f"{name} {pct:.2f} %" for name, pct in
                                    sorted(by_thread.items(), key=lambda kv: -kv[1]) if pct))
    print(f"windows: agent {' '.join(f'{x:.2f}' for x in shares)} %; baseline "
          f"{' '.join(f'{x:.2f}' for x in baseline)} %")
    print(f"baseline (empty 10 Hz asyncio loop with the agent's imports): median "
          f"{statistics.median(baseline):.2f} %; RSS {rss:.0f} MB (target 150 MB)")
    print(f"agent-cost {share:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
