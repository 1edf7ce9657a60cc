"""Outcome metrics of one run.

* **JCT**: completion minus arrival, over jobs that finished (mean and p99, hours).
* **Queueing delay**: first start minus arrival (mean, hours).
* **Goodput**: useful GPU time over allocated GPU time. Useful time is each job's work
  at its requested size (the trace's ``gpu_time``; progress so far for unfinished jobs).
  Everything else a job held is overhead: checkpoints, restarts, rolled-back work,
  slowdowns (stragglers, congestion) and the sublinear part of running wider.
* **GPU-hours lost to faults**: work rolled back by faults (valued at the job's requested
  size) plus the GPU time held during restarts after them.
* **Utilization**: GPU time allocated over GPU time of hosts not down, during the trace
  window (first to last arrival), so a long tail does not dilute it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sim.engine import RunResult
from sim.jobs import DONE, REJECTED


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


@dataclass(frozen=True)
class Summary:
    regime: str
    jobs: int
    finished: int
    unfinished: int
    rejected: int
    mean_jct_h: float
    p99_jct_h: float
    mean_queue_h: float
    goodput: float
    utilization: float
    fault_lost_gpu_h: float
    preempt_lost_gpu_h: float
    useful_gpu_h: float
    allocated_gpu_h: float
    makespan_d: float

    def row(self) -> dict[str, float | int | str]:
        return asdict(self)


def summarize(result: RunResult) -> Summary:
    jobs = result.jobs
    jct, queue = [], []
    useful = 0.0
    allocated = 0.0
    finished = rejected = 0
    for j in jobs:
        allocated += j.alloc_gpu_s
        if j.state == DONE:
            finished += 1
            jct.append(j.finish - j.arrival)
            useful += j.work * j.n
        elif j.state == REJECTED:
            rejected += 1
            continue
        else:
            useful += j.P * j.n
            if j.alloc:  # still running when the run stopped
                allocated += j.alloc * (result.end - j.alloc_since)
        if j.first_start >= 0:
            queue.append(j.first_start - j.arrival)
    fault = result.rollback_gpu_s["fault"] + result.pause_gpu_s["fault"]
    preempt = result.rollback_gpu_s["preempt"] + result.pause_gpu_s["preempt"]
    return Summary(
        regime=result.regime.name,
        jobs=len(jobs),
        finished=finished,
        unfinished=len(jobs) - finished - rejected,
        rejected=rejected,
        mean_jct_h=sum(jct) / len(jct) / 3600 if jct else 0.0,
        p99_jct_h=percentile(jct, 99) / 3600,
        mean_queue_h=sum(queue) / len(queue) / 3600 if queue else 0.0,
        goodput=useful / allocated if allocated else 0.0,
        utilization=(result.alloc_gpu_s_horizon / result.cap_gpu_s_horizon
                     if result.cap_gpu_s_horizon else 0.0),
        fault_lost_gpu_h=fault / 3600,
        preempt_lost_gpu_h=preempt / 3600,
        useful_gpu_h=useful / 3600,
        allocated_gpu_h=allocated / 3600,
        makespan_d=result.end / 86400,
    )


def benefit_share(none: float, redacted: float, full: float) -> float | None:
    """(redacted - none) / (full - none): how much of full visibility's gain is kept."""
    gain = full - none
    if abs(gain) < 1e-12:
        return None
    return (redacted - none) / gain


def per_pool_jct(result: RunResult) -> dict[str, tuple[int, float]]:
    """Per pool: jobs that finished, and their mean JCT in hours."""
    sums: dict[str, list[float]] = {}
    for j in result.jobs:
        if j.state == DONE:
            acc = sums.setdefault(j.pool_name, [0.0, 0.0])
            acc[0] += 1
            acc[1] += j.finish - j.arrival
    return {pool: (int(n), total / n / 3600) for pool, (n, total) in sorted(sums.items())}
