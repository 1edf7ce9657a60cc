"""Observers register themselves on import; importing this package loads them all."""

from agent.observers import host  # noqa: F401  (registers "host")
from agent.observers.base import FeatureAbsent, Observer, ObserverSet, registered

__all__ = ["FeatureAbsent", "Observer", "ObserverSet", "registered"]
