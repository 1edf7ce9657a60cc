"""Observers register themselves on import; importing this package loads them all."""

import agent.gpu.observer
import agent.host.observer
import agent.links.observer
import agent.rdma.observer  # noqa: F401  (the RDMA domain: agent.rdma)
from agent.observers.base import FeatureAbsent, Observer, ObserverSet, registered

__all__ = ["FeatureAbsent", "Observer", "ObserverSet", "registered"]
