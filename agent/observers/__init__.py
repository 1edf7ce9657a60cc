"""Observers register themselves on import; importing this package loads them all."""

import agent.gpu.observer  # noqa: F401  (registers itself; the GPU domain lives in agent.gpu)
from agent.observers import host, links, rdma  # noqa: F401  (each registers itself)
from agent.observers.base import FeatureAbsent, Observer, ObserverSet, registered

__all__ = ["FeatureAbsent", "Observer", "ObserverSet", "registered"]
