"""The simulator's assumptions, in one place: parameters and the small performance models.

Every number here is an assumption of the model, not a measurement; the report
(``docs/privacy-utility.md``) lists them next to the results they drive.

Performance models (all relative to the job's speed in the trace, which is 1.0):

* **Scaling.** A job with requested size ``n`` running on ``g`` GPUs progresses at
  ``(g / n) ** speed_alpha`` (sublinear: with 0.8, twice the GPUs is 1.74x as fast).
* **Stragglers.** A job with any member on a degraded host (a soft fault: a PCIe or NIC
  link trained down, a fan at critical speed, ...) runs at ``straggler_factor`` of its
  speed: synchronous training goes at the pace of its slowest member.
* **Collectives under congestion.** Only jobs spanning more than one host use the network
  for their collectives. A fraction ``comm_fraction`` of an uncongested step is
  communication; under congestion level L with algorithm A that part takes
  ``COMM_COST[L][A]`` times as long. Ring is bandwidth-optimal on idle links (tree pays
  for its extra latency terms), but every ring step crosses every link, so one congested
  uplink slows all 2(n-1) steps; a tree crosses it in O(log n) steps. Hence ring is best
  with no congestion and tree under low or high congestion.
"""

from __future__ import annotations

from dataclasses import dataclass

RING, TREE = 0, 1
ALGORITHMS = ("ring", "tree")
#: Congestion levels as small integers, in harmonaize.messages.Level order.
NO_CONGESTION, LOW, HIGH = 0, 1, 2
#: COMM_COST[level][algorithm]: how much longer the communication part of a step takes.
COMM_COST: tuple[tuple[float, float], ...] = (
    (1.0, 1.2),   # none: ring is bandwidth-optimal
    (1.8, 1.4),   # low
    (3.0, 1.9),   # high
)

#: Fault descriptions (InfiniteHBD's ``Desc``) that leave the host running but slow:
#: a degraded link or a throttling GPU. Everything else takes the host down.
SOFT_FAULTS = frozenset({
    "GPU PCI link width low",
    "NIC Link Speed low",
    "NIC PCI link Width low",
    "GPU P2P Bandwidth Low",
    "GPU Temperature High",
    "Speed Critical (Sensor)",
    "Redundancy Lost",
    "Low",
    "GPU SBE(Single Bit ECC) > Threshold",
    "Bus Correctable error",
})
#: Fault classes the host agent can see coming (ECC counts, remapped rows, XIDs precede
#: them), for the share :attr:`SimConfig.precursor_fraction` of such faults.
PRECURSOR_CLASSES = frozenset({"GPU"})
NO_PRECURSOR = frozenset({"Silent Data Corruption"})


#: What tenant policies may act on (sim.policies); a subset switches the others off.
OPPORTUNITIES = ("submit", "elastic", "checkpoint", "replace", "collective")


def is_soft(desc: str) -> bool:
    return desc in SOFT_FAULTS


def has_precursor_class(fault_class: str, desc: str) -> bool:
    return fault_class in PRECURSOR_CLASSES and desc not in NO_PRECURSOR and not is_soft(desc)


def speed(gpus: int, requested: int, alpha: float) -> float:
    """Progress per wall second on ``gpus`` GPUs, relative to the requested size."""
    if gpus == requested:
        return 1.0
    return (gpus / requested) ** alpha


def comm_factor(level: int, algorithm: int, comm_fraction: float) -> float:
    """Speed of a multi-host job under ``level`` with ``algorithm`` (1.0: idle links, ring)."""
    return 1.0 / ((1.0 - comm_fraction) + comm_fraction * COMM_COST[level][algorithm])


def best_algorithm(level: int) -> int:
    costs = COMM_COST[level]
    return RING if costs[RING] <= costs[TREE] else TREE


@dataclass(frozen=True)
class SimConfig:
    """Everything the model assumes; defaults are the documented scenario."""

    seed: int = 1
    gpus_per_node: int = 8
    # --- cluster ---
    #: Each pool gets enough nodes for ``load_factor`` times this quantile of its demand
    #: (see sim.cluster).
    demand_quantile: float = 0.9
    load_factor: float = 1.0
    #: GPU classes, given to pools in turn (one class per pool).
    gpu_classes: tuple[str, ...] = ("p100", "p40")
    #: Explicit (pool, nodes) counts (override the sizing rule for those pools).
    nodes_per_pool: tuple[tuple[str, int], ...] = ()
    #: Nodes sharing one congestible uplink.
    rack_size: int = 4
    # --- tenants and jobs ---
    tenants: tuple[str, ...] = ("tenant-a", "tenant-b", "tenant-c", "tenant-d")
    #: Jobs at least this long may be elastic...
    elastic_min_duration: float = 3600.0
    #: ...and this share of them is (seeded).
    elastic_fraction: float = 0.5
    speed_alpha: float = 0.8
    # --- checkpoints and restarts ---
    #: The tenant's fixed checkpoint interval (wall seconds of running), and its cost.
    ckpt_interval: float = 3600.0
    ckpt_cost: float = 60.0
    #: Reload and warm-up after a restart (fault, preemption, re-placement).
    restart_cost: float = 300.0
    #: Extra pause of a graceful resize on top of the checkpoint it takes first.
    rescale_cost: float = 120.0
    straggler_factor: float = 0.6
    comm_fraction: float = 0.3
    # --- faults ---
    #: "trace": replay the fault trace; "model": a Poisson model fitted to it.
    fault_source: str = "trace"
    #: Seconds of simulation per second of the fault trace (1: real time).
    fault_time_scale: float = 1.0
    #: Servers behind the fault trace (those without a fault do not appear in it).
    trace_nodes: int = 400
    #: Share of precursor-class faults the agent sees coming, and the lead time range.
    precursor_fraction: float = 0.5
    precursor_lead: tuple[float, float] = (300.0, 1800.0)
    # --- congestion (no public trace: a renewal process per rack) ---
    congestion_per_rack_day: float = 1.0
    congestion_mean_s: float = 1800.0
    congestion_high_share: float = 0.4
    # --- tenant policies ---
    #: Which decisions policies make from the feed (the others keep their defaults).
    opportunities: tuple[str, ...] = OPPORTUNITIES
    #: A job is resized at most once per this many seconds.
    dwell_s: float = 1800.0
    #: GPUs the policy leaves free in a pool when growing into it.
    reserve_gpus: int = 8
    # --- provider scheduler ---
    #: How far down the queue the FIFO scheduler looks for a job that fits.
    backfill_depth: int = 256
    # --- feed plumbing ---
    #: Host changes within this many seconds reach the redactor as one observation.
    observe_batch_s: float = 1.0
    # --- measurement ---
    #: Ground truth for the leakage attack is sampled this often...
    sample_s: float = 600.0
    #: ...and the failure attack asks about windows this long.
    attack_window_s: float = 3600.0
    #: The tenant who attacks (index into ``tenants``).
    attacker: int = 0

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.rack_size < 1:
            raise ValueError("gpus_per_node and rack_size must be positive")
        if not 0 < self.load_factor <= 10 or not 0 < self.demand_quantile <= 1:
            raise ValueError("load_factor must be in (0, 10] and demand_quantile in (0, 1]")
        if not self.tenants or not self.gpu_classes:
            raise ValueError("need at least one tenant and one GPU class")
        if self.fault_source not in ("trace", "model", "none"):
            raise ValueError("fault_source must be trace, model or none")
        if self.ckpt_interval <= 0 or min(self.ckpt_cost, self.restart_cost,
                                          self.rescale_cost) < 0:
            raise ValueError("checkpoint interval must be positive and costs non-negative")
        unknown = set(self.opportunities) - set(OPPORTUNITIES)
        if unknown:
            raise ValueError(f"unknown opportunities: {', '.join(sorted(unknown))}")
        if not 0 <= self.attacker < len(self.tenants):
            raise ValueError("attacker must index a tenant")
