"""Observers register themselves on import; importing this package loads them all."""

from agent.observers import gpu, host, links, rdma  # noqa: F401  (each registers itself)
from agent.observers.base import FeatureAbsent, Observer, ObserverSet, registered

__all__ = ["FeatureAbsent", "Observer", "ObserverSet", "registered"]
