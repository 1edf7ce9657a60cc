"""What the remediation domain offers the other domains: the phases of a GPU's
remediation (its table is :data:`agent.remediation.engine.REMEDIATION`).

No other domain needs more of it today; the daemon (composition) builds the service
and adds its holds to the host summary.
"""

from __future__ import annotations

from agent.remediation.types import Phase

__all__ = ["Phase"]
