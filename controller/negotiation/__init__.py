"""Negotiation between tenants and the provider, as a sans-I/O core: capacity
reservations in rounds (offers, counters, refusals, holds) and maintenance windows moved
to a job's checkpoints (docs/tenant-guide.md, "Negotiating capacity and maintenance";
docs/architecture.md, "Negotiation").

``engine.Engine.step(inputs, now)`` decides; ``plain`` stores and restores its state.
"""
