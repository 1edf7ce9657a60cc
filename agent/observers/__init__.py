"""Observers register themselves on import; importing this package loads them all.

The GPU and host observers take their own settings section; their registration (which
part of the AgentConfig each gets) is here, in the composition layer.
"""

import agent.gpu.observer
import agent.host.observer
import agent.links.observer
import agent.rdma.observer
from agent.observers.base import FeatureAbsent, Observer, ObserverSet, register, registered

# Through the module at call time: a domain's observer module imports the framework,
# which imports this package, while that module is still loading.
register("gpu", lambda cfg: agent.gpu.observer.GpuObserver(cfg.observers.gpu),
         enabled=lambda cfg: cfg.observers.gpu.enabled)
register("host", lambda cfg: agent.host.observer.HostObserver(cfg.observers.host.interval),
         enabled=lambda cfg: cfg.observers.host.enabled)

__all__ = ["FeatureAbsent", "Observer", "ObserverSet", "registered"]
