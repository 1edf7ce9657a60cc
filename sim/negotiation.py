"""The negotiation regime's terms and what it is measured by.

Who negotiates, and why them: the Philly trace gives each job its submission time, its
length, its GPUs and its pool, and no deadline. What it does show is gang jobs: jobs over
one host (12 to 128 GPUs) need whole free hosts at once, and a FIFO scheduler with
backfill lets the one- and two-GPU jobs behind them take every host that frees first, so
they wait longest. Those are the jobs whose tenants propose reservations here: a hold is
what a gang job lacks, and a deadline would have to be invented.

The model (stated, not measured):

* A gang job's tenant plans it :attr:`NegotiationPlan.lead_s` ahead (a day): at its
  submission time less the lead it proposes its pool, its whole hosts' GPUs (minimum =
  maximum), a window from its submission to :attr:`window_s` later, its length as the
  duration, and time flexibility. It accepts an offer or a time counter; a count counter
  is no use to a gang job and is rejected. Refused (its share of the pool's last release
  is too small) or told its count is above the release's upper edge, it proposes again
  at each new release of its pool until it holds or its job has started.
* The provider's scheduler keeps an accepted hold's hosts out of what it gives others
  from the acceptance (or :attr:`drain_s` before the hold's start) until its job
  starts: no other job starts on a whole free host while the free hosts are no more
  than those held, and no elastic job grows in that pool. The held job goes to the
  front of its pool's queue.
* A share :attr:`no_show_rate` of accepted holds are no-shows (seeded): the tenant's
  plans changed, its job is submitted as an ordinary one, and the hold keeps its hosts
  until it expires unused (the engine charges the tenant's record).
* A hold whose job came but could not be placed before the hold's grace ran out was not
  honoured: the provider cancels it (nothing charged) and the job waits as any other.
* Maintenance: a host that degrades (a soft fault in the trace: a link trained down, a
  GPU too hot, correctable errors) gets a validation notice for every job on it. Under
  ``notice`` the provider's window stands (its least notice for the condition) and the
  job is stopped there, losing the work since its last checkpoint; under
  ``checkpoint`` the job's declaration carries its checkpoint cadence, the provider's
  window is aligned to it and the tenant answers with its next checkpoints (the real
  negotiation engine settles both), so the stop loses nothing unless the job was
  restarted in between. The host's own repair follows the fault trace in both.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.negotiation.maintenance import Cause

MAINTENANCE_MODES = ("off", "notice", "checkpoint")


@dataclass(frozen=True)
class NegotiationPlan:
    reservations: bool = True
    maintenance: str = "off"
    #: Jobs above this many GPUs (more than one 8-GPU host) reserve.
    gang_above: int = 8
    lead_s: float = 86400.0
    window_s: float = 4 * 3600.0
    #: The scheduler keeps a hold's hosts from this long before its start (None: from
    #: the acceptance).
    drain_s: float | None = None
    no_show_rate: float = 0.1
    #: The operator's per-tenant cap (every tenant weighs the same).
    max_share: float = 0.5
    #: The attacker proposes and withdraws every hour in every pool (sim.probing).
    probe: bool = False

    def __post_init__(self) -> None:
        if self.maintenance not in MAINTENANCE_MODES:
            raise ValueError(f"maintenance must be one of {', '.join(MAINTENANCE_MODES)}")
        if not 0.0 <= self.no_show_rate <= 1.0:
            raise ValueError("no_show_rate must be in [0, 1]")
        if self.lead_s < 0 or self.window_s < 0 or self.gang_above < 1:
            raise ValueError("lead and window must be 0 or more, gang_above at least 1")


def cause_of(desc: str) -> Cause:
    """The coarse condition behind a soft fault (sim.model.SOFT_FAULTS), for its urgency."""
    if "Temperature" in desc or "Speed Critical" in desc:
        return Cause.THERMAL
    if "ECC" in desc or "Correctable" in desc:
        return Cause.CORRECTABLE_TREND
    return Cause.LINK_DEGRADED


@dataclass
class NegotiationCounters:
    proposals: int = 0
    offers: int = 0
    refusals: int = 0
    errors: int = 0
    holds: int = 0
    honoured: int = 0
    not_honoured: int = 0
    no_shows: int = 0
    notices: int = 0
    maintained: int = 0
    maintained_clean: int = 0
    maintenance_moot: int = 0
    maintenance_lost_gpu_s: float = 0.0
    probes: int = 0
