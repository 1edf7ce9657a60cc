"""What the host domain offers the other domains: its sample of CPU, memory and load.

No other domain needs more of it today; its rules (:mod:`agent.host.rules`) are called
by the agent's step, its commands wired by the daemon (both composition).
"""

from __future__ import annotations

from agent.host.types import HostSample

__all__ = ["HostSample"]
