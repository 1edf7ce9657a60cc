"""prolog-cost: the wall time harmonaize-slurm adds to a job's start, as Slurm's
PrologSlurmctld, with the controller up and with it down.

Each round runs the installed console script (``.venv/bin/harmonaize-slurm``, what an
operator names in slurm.conf) as slurmctld does: a fresh process whose environment is
only the job's Slurm variables, timed from its start to its exit. Rounds alternate
between the two cases so that both see the same machine: "up" against a real
controller (its placement recorded, then the job's epilog run untimed), "down" against
a socket path nobody serves (the request is spooled; the spool grows by one each such
round, as in an outage). A third, "floor", times the same Python starting and doing
nothing, in the same rounds: what the interpreter and this machine's site hooks cost
before the hook's first line; here that includes this checkout's editable-install
finder and whatever .pth files the machine's Python carries, which an installed
/opt/harmonaize does not have. So a fourth, "bare", runs the hook against the live
controller as ``python -S`` with the checkout and the venv's packages on PYTHONPATH:
the hook's own cost on a Python without site hooks. Prints p50, p99, max and the
spread per case; the last line is ``prolog-cost VALUE ms``, the worse p99 of the
installed script's up and down.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import daemon, free_port, percentile, scratch
from harmonaize.opsocket import request
from testbed.cluster import TEST_POOLS
from testbed.keyring import Keyring

HOOK = Path(sys.executable).parent / "harmonaize-slurm"


def hook_config(work: Path, name: str, socket: Path) -> Path:
    base = work / name
    (base / "spool").mkdir(parents=True)
    config = base / "slurm.toml"
    config.write_text(f'socket = "{socket}"\nspool = "{base / "spool"}"\n'
                      f'log = "{base / "hook.log"}"\n'
                      '[accounts]\nphysics = "acme"\n')
    return config


def job_env(job: int, context: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": str(job), "SLURM_JOBID": str(job), "SLURM_JOB_ACCOUNT": "physics",
            "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "1000",
            "SLURM_JOB_NODELIST": "gpu-[001-008]", "SLURM_JOB_PARTITION": "gpu",
            "SLURM_JOB_NUM_NODES": "8", "SLURM_SCRIPT_CONTEXT": context,
            "SLURM_CLUSTER_NAME": "bench"}


#: CPU seconds (user + system) of every process run, by case: less sensitive than wall
#: time to what else the machine is doing.
CPU: dict[str, list[float]] = {}


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


ROOT = Path(__file__).resolve().parent.parent
BARE = [sys.executable, "-S", "-m", "harmonaize.slurm.hook"]


def run_hook(config: Path, job: int, context: str, *, bare: bool = False) -> float:
    """Seconds from the hook's start to its exit."""
    argv, env = [str(HOOK)], job_env(job, context)
    if bare:
        packages = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
        argv, env = BARE, {**env, "PYTHONPATH": f"{ROOT}:{packages}"}
    cpu = cpu_of_children()
    start = time.perf_counter()
    done = subprocess.run([*argv, "--config", str(config)], env=env,
                          cwd="/", capture_output=True, check=False, timeout=30)
    elapsed = time.perf_counter() - start
    key = f"{'bare ' if bare else ''}{config.parent.name} {context}"
    CPU.setdefault(key, []).append(cpu_of_children() - cpu)
    if done.returncode != 0:
        raise RuntimeError(f"the hook exited {done.returncode}: {done.stderr!r}")
    return elapsed


def run_floor() -> float:
    cpu = cpu_of_children()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env={}, cwd="/", check=True, timeout=30)
    elapsed = time.perf_counter() - start
    CPU.setdefault("floor", []).append(cpu_of_children() - cpu)
    return elapsed


def summary(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (f"{name}: n={len(ms)} p50={percentile(ms, 50):.1f} ms "
            f"p99={percentile(ms, 99):.1f} ms max={max(ms):.1f} ms "
            f"stdev={statistics.stdev(ms):.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=200, help="job starts per case")
    args = parser.parse_args()
    if not HOOK.exists():
        raise SystemExit(f"no {HOOK}: run ./scripts/setup")
    with scratch() as work:
        admin = work / "controller.sock"
        cfg = work / "controller.toml"
        cfg.write_text(
            f'[controller]\nlisten = "tcp://127.0.0.1:{free_port()}"\n'
            f'feed = "tcp://127.0.0.1:{free_port()}"\nadmin_socket = "{admin}"\n'
            f'database = "{work / "c.db"}"\nadmin_group = ""\nlog_level = "warning"\n'
            + TEST_POOLS + Keyring(work / "keys").controller_config())
        up = hook_config(work, "up", admin)
        down = hook_config(work, "down", work / "nobody-serves-this.sock")
        times: dict[str, list[float]] = {"up": [], "down": [], "bare": []}
        floor: list[float] = []
        with daemon("controller.main", cfg, work / "controller.log", admin):
            for _ in range(3):  # warm the page cache: the first start reads every module
                run_hook(down, 0, "prolog_slurmctld")
            for n in range(1, args.rounds + 1):
                times["up"].append(run_hook(up, n, "prolog_slurmctld"))
                run_hook(up, n, "epilog_slurmctld")  # untimed: keeps the controller's jobs few
                times["down"].append(run_hook(down, n, "prolog_slurmctld"))
                floor.append(run_floor())
                times["bare"].append(run_hook(up, 100_000 + n, "prolog_slurmctld", bare=True))
                run_hook(up, 100_000 + n, "epilog_slurmctld", bare=True)
            placed = len(request(admin, "jobs"))
        spooled = len(list((work / "down" / "spool" / "queue").glob("*.json")))
        if placed != 0 or spooled != args.rounds + 3:
            raise SystemExit(f"unexpected: {placed} jobs left placed, {spooled} spooled")
        print(summary("floor (python -c pass)", floor))
        for case in ("up", "down"):
            print(summary(f"controller {case}", times[case]))
        print(summary("bare (python -S), controller up", times["bare"]))
        p99 = {case: percentile(values, 99) * 1000 for case, values in times.items()}
        for case, key in (("floor", "floor"), ("up", "up prolog_slurmctld"),
                          ("down", "down prolog_slurmctld"),
                          ("bare", "bare up prolog_slurmctld")):
            print(f"CPU time {case}: p50={percentile(CPU[key], 50) * 1000:.1f} ms "
                  f"p99={percentile(CPU[key], 99) * 1000:.1f} ms")
        for case in ("up", "down"):
            print(f"prolog-cost-{case} {p99[case]:.1f} ms")
        print(f"prolog-cost {max(p99.values()):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
