"""Observers register on import; importing this package loads them all.

The composition layer: each domain's observer takes its own settings section, and the
registrations below map the agent's whole configuration to those arguments. (Plain
module imports, read when an observer is built: a domain's observer module imports
:mod:`agent.observers.base`, which runs this file first.)
"""

import agent.gpu.observer
import agent.host.observer
import agent.links.observer
import agent.rdma.observer
from agent.observers.base import FeatureAbsent, Observer, ObserverSet, register, registered

register("gpu", lambda cfg: agent.gpu.observer.GpuObserver(cfg.observers.gpu),
         enabled=lambda cfg: cfg.observers.gpu.enabled)
register("host", lambda cfg: agent.host.observer.HostObserver(cfg.observers.host.interval),
         enabled=lambda cfg: cfg.observers.host.enabled)
register("links", lambda cfg: agent.links.observer.LinksObserver(cfg.observers.links),
         enabled=lambda cfg: cfg.observers.links.enabled)
register("rdma", lambda cfg: agent.rdma.observer.RdmaObserver(cfg.observers.rdma),
         enabled=lambda cfg: cfg.observers.rdma.enabled)

__all__ = ["FeatureAbsent", "Observer", "ObserverSet", "registered"]
