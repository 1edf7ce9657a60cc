"""Energy: what a job's GPUs used and saved (agent to controller), and the slowdown a
job accepts for it (in the tenant's declaration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from harmonaize.schema import (
    Count,
    Ident,
    Num,
)


@dataclass(frozen=True)
class JobEnergy:
    """One job's GPUs on a host since the job started there: the energy they used and
    what the power limits saved, in kJ. The controller sums a job's hosts and gives its
    tenant only a coarse share (controller/redaction.py)."""

    job: Ident
    used_kj: Count
    saved_kj: Count


@dataclass(frozen=True)
class EnergyAllowance:
    """How much slower a job may run so that its GPUs use less energy (the provider
    lowers their power limits within it, and backs off before the job slows that much)."""

    #: The slowdown the job accepts, as a share of its progress (0.05: at most 5% fewer
    #: collectives per second than at the GPUs' own limits); 0: none, nothing is changed.
    max_slowdown: Annotated[float, Num(0.0, 0.5)] = 0.0
    #: The lowest power limit any of the job's GPUs may get, in watts; 0: the provider's
    #: own bounds alone.
    min_watts: Annotated[float, Num(0.0, 100_000.0)] = 0.0
