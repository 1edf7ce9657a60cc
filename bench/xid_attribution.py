"""xid-attribution: precision and recall of telling a job's own XIDs from the hardware's.

A labelled set of scenarios (240 by default, seeded), each run through the real GPU
health engine and its attribution, with the kernel's XID lines read by the real kernel
log reader from a fake kernel log file (/dev/kmsg's format, testbed.fakekmsg) and each
GPU process a real process whose ending the observer's own /proc check sees (a killed,
unreaped process is a zombie):

* application faults: XID 13, 31 or 43 of one job's process, the driver's line naming
  it (current drivers) or not (older ones), on a GPU one or two jobs share;
* teardowns: a job's process ends (gone from the GPU, or a zombie at the XID) and the
  driver's cleanup gives XID 45 (or 43), with or without a line;
* hardware faults: XIDs the catalog gives only hardware causes (48, 63, 64, 74, 79, 92,
  95, 119, 120, 140), some with a job's pid in the line, some during a teardown;
* XIDs no job's process is tied to: application-likely XIDs on an idle GPU, or on a
  GPU two jobs share with no line (the driver's or hardware's, labelled hardware);
* a failing GPU: the same application-looking XID in successive, different jobs. Its
  first occurrence is labelled the application's (nothing at that moment tells it
  from a bug of that job: its owner is told, the GPU is not touched); every later one
  is labelled the hardware's.

The line before last: the application class's precision; last: ``xid-attribution
<hardware recall> %``. It also checks what each verdict did: an application XID never
changed a GPU's state, a hardware XID with an effect always did.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.gpu.health import GpuHealthEngine, GpuState
from agent.gpu.nvml import VERSIONS
from agent.gpu.observer import SAMPLES, process_ending
from agent.gpu.settings import GpuObserverSection
from agent.gpu.types import (
    XID_EVENT,
    GpuIdentity,
    GpuProcess,
    GpuSample,
    GpuSnapshot,
    GpuTelemetry,
    JobRef,
    NvmlEvent,
)
from agent.kernel.kmsg import KmsgSource
from bench.common import scratch
from testbed.fakekmsg import FakeKernelLog, pci_bus_id

HARDWARE_XIDS = (48, 63, 64, 74, 79, 92, 95, 119, 120, 140)
APP_XIDS = (13, 31, 43)
PROC = Path("/proc")


@dataclass
class Scenario:
    kind: str
    truth: str  # "hardware" | "application"
    verdict: str = ""
    state_ok: bool = True


@dataclass
class Host:
    """One GPU, its engine, the fake kernel log and a pool of live rank processes."""

    work: Path
    engine: GpuHealthEngine = field(init=False)
    kmsg: FakeKernelLog = field(init=False)
    reader: KmsgSource = field(init=False)
    live: list[subprocess.Popen[bytes]] = field(default_factory=list)
    now: float = 0.0

    def __post_init__(self) -> None:
        self.engine = GpuHealthEngine(GpuObserverSection(kmsg_wait=1.0))
        self.kmsg = FakeKernelLog(self.work / f"kmsg.{id(self)}")
        self.reader = KmsgSource(str(self.kmsg.path))
        self.reader.open()

    def process(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["sleep", "600"])
        self.live.append(proc)
        return proc

    def sample(self, procs: dict[int, JobRef], xid: int | None = None) -> GpuSample:
        identity = GpuIdentity(0, "GPU-0", "NVIDIA H200", pci_bus_id(0), 5, 16, 18)
        telemetry = GpuTelemetry(40, 300.0, 700.0, 1900, 1980, 2600, 90, 50, 141 << 30,
                                 80 << 30, 5, 16, 18,
                                 tuple(GpuProcess(pid, 1 << 30) for pid in procs))
        snap = GpuSnapshot(identity, None, telemetry, version=next(VERSIONS))
        lines = tuple(self.reader.read())
        events = (NvmlEvent(0, XID_EVENT, xid, self.now),) if xid is not None else ()
        # As the observer does: only with an XID to judge, its GPU's processes and the
        # processes the driver's lines name.
        exiting = frozenset(p for p in set(procs) | {x.pid for x in lines if x.pid}
                            if process_ending(PROC, p)) if events or lines else frozenset()
        jobs = tuple(sorted(set(procs.values()), key=lambda r: (r.job, r.rank or "")))
        return GpuSample((snap,), events, {0: jobs} if jobs else {}, 2.0, next(SAMPLES),
                         dict(procs), exiting, lines)

    def xid(self, procs: dict[int, JobRef], xid: int, line: int | bool | None,
            line_after: bool) -> tuple[str, GpuState, GpuState]:
        """Run one XID: (verdict, state before, state after). ``line``: the pid the
        driver's line names, None (a line without pid), False (no line)."""
        before = self.engine.gpus[0].state if 0 in self.engine.gpus else GpuState.HEALTHY
        seen = len(self.engine.gpus[0].recent_xids) if 0 in self.engine.gpus else 0
        if line is not False and not line_after:
            self.kmsg.xid(0, xid, pid=line if isinstance(line, int) else None)
        self.now += 1.0
        self.engine.step(self.sample(procs, xid), self.now)
        if line is not False and line_after:
            self.kmsg.xid(0, xid, pid=line if isinstance(line, int) else None)
        for _ in range(4):  # the wait for the driver's line, then its end
            self.now += 0.4
            self.engine.step(self.sample(procs), self.now)
        gpu = self.engine.gpus[0]
        assert len(gpu.recent_xids) == seen + 1, "the XID was not decided"
        return gpu.recent_xids[-1].verdict, before, gpu.state

    def settle(self, procs: dict[int, JobRef]) -> None:
        self.now += 1.0
        self.engine.step(self.sample(procs), self.now)

    def close(self) -> None:
        self.reader.close()
        for proc in self.live:
            proc.kill()
            proc.wait()


def ranks(host: Host, job: str, n: int) -> dict[int, JobRef]:
    return {host.process().pid: JobRef(job, str(r)) for r in range(n)}


def judge(scenario: Scenario, result: tuple[str, GpuState, GpuState]) -> Scenario:
    """An application's XID leaves the GPU as it was; a hardware one here always has an
    effect (every hardware-class XID in the set has one, and an application-likely XID
    judged the hardware's is at least suspect)."""
    verdict, before, after = result
    scenario.verdict = verdict
    scenario.state_ok = after is before if verdict == "application" \
        else after is not GpuState.HEALTHY
    return scenario


def one(rng: random.Random, work: Path, kind: str) -> list[Scenario]:
    host = Host(work)
    try:
        return run(rng, host, kind)
    finally:
        host.close()


def run(rng: random.Random, host: Host, kind: str) -> list[Scenario]:
    after = rng.random() < 0.3  # the driver's line comes after NVML's event
    if kind == "application-fault":
        own = ranks(host, "job-a", rng.randint(1, 2))
        procs = {**own, **(ranks(host, "job-b", 1) if rng.random() < 0.5 else {})}
        host.settle(procs)
        # One in five drivers is old enough to log no line: on a shared GPU nothing
        # then ties the XID to either job, and doubt is the hardware's.
        line = rng.choice(list(own)) if rng.random() < 0.8 else False
        return [judge(Scenario(kind, "application"),
                      host.xid(procs, rng.choice(APP_XIDS), line, after))]
    if kind == "teardown":
        own = ranks(host, "job-a", rng.randint(1, 4))
        other = ranks(host, "job-b", 1) if rng.random() < 0.5 else {}
        host.settle({**own, **other})
        ending = rng.choice(list(own))
        victim = next(p for p in host.live if p.pid == ending)
        victim.kill()  # not reaped: a zombie while the driver cleans up
        for _ in range(1000):  # the driver's cleanup XID follows the process's end
            if process_ending(PROC, ending):
                break
            time.sleep(0.001)
        if rng.random() < 0.5:
            host.settle({p: r for p, r in {**own, **other}.items() if p != ending})
            procs = {p: r for p, r in {**own, **other}.items() if p != ending}
        else:
            procs = {**own, **other}
        line = ending if rng.random() < 0.5 else False
        return [judge(Scenario(kind, "application"),
                      host.xid(procs, rng.choice((45, 45, 43)), line, after))]
    if kind in ("hardware-fault", "hardware-during-teardown"):
        procs = ranks(host, "job-a", rng.randint(1, 2))
        host.settle(procs)
        if kind == "hardware-during-teardown":
            next(p for p in host.live if p.pid in procs).kill()
        line = rng.choice([*procs, None, False])
        return [judge(Scenario(kind, "hardware"),
                      host.xid(procs, rng.choice(HARDWARE_XIDS), line, after))]
    if kind == "untied":
        procs = {**ranks(host, "job-a", 1), **ranks(host, "job-b", 1)} \
            if rng.random() < 0.5 else {}
        host.settle(procs)
        line = rng.choice([None, False])
        return [judge(Scenario(kind, "hardware"),
                      host.xid(procs, rng.choice(APP_XIDS), line, after))]
    # A failing GPU: the same application-looking XID under three successive jobs.
    xid, out = rng.choice((13, 31)), []
    for n, job in enumerate(("job-a", "job-b", "job-c")):
        procs = ranks(host, job, 1)
        host.settle(procs)
        truth = "application" if n == 0 else "hardware"
        out.append(judge(Scenario(kind, truth),
                         host.xid(procs, xid, next(iter(procs)), after)))
        host.settle({})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenarios", type=int, default=240)
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kinds = ("application-fault", "teardown", "hardware-fault", "hardware-during-teardown",
             "untied", "recurring")
    results: list[Scenario] = []
    with scratch() as work:
        turn = 0
        while len(results) < args.scenarios:
            results += one(rng, work, kinds[turn % len(kinds)])
            turn += 1
    by_kind: dict[str, list[Scenario]] = {}
    for s in results:
        by_kind.setdefault(s.kind, []).append(s)
    for kind, items in by_kind.items():
        right = sum(s.verdict == s.truth for s in items)
        print(f"{kind:26} {len(items):4} scenarios, {right:4} judged as labelled")
    figures = {}
    for cls in ("application", "hardware"):
        tp = sum(s.verdict == cls and s.truth == cls for s in results)
        said = sum(s.verdict == cls for s in results)
        real = sum(s.truth == cls for s in results)
        precision, recall = 100 * tp / max(said, 1), 100 * tp / max(real, 1)
        figures[cls] = (precision, recall)
        print(f"{cls:11} precision {precision:5.1f} % ({tp}/{said}), "
              f"recall {recall:5.1f} % ({tp}/{real})")
    wrong_state = [s for s in results if not s.state_ok]
    print(f"{len(results)} XIDs; verdicts whose effect on the GPU was wrong: {len(wrong_state)}")
    print(f"application precision {figures['application'][0]:.1f} %")
    print(f"xid-attribution {figures['hardware'][1]:.1f} %")
    return 0 if not wrong_state else 1


if __name__ == "__main__":
    sys.exit(main())
