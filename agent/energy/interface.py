"""What the energy domain offers the other domains: what it reports of a job's energy.

No other domain needs more of it today; the daemon (composition) builds the service,
tells it which GPUs are out of service, and adds its report to the host summary.
"""

from __future__ import annotations

from harmonaize.messages import EnergyAllowance, JobEnergy

__all__ = ["EnergyAllowance", "JobEnergy"]
