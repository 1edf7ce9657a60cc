"""Cluster mode: controller replicas over a NATS JetStream cluster (docs/scaling.md).

``codec`` turns the core's Commits into bytes and back (no I/O); ``ingest`` is the
agent protocol a replica speaks before an agent's message is on the bus (sans-I/O);
``nats`` connects, makes the streams and buckets, publishes fenced and holds leases;
``leader`` runs the core on the bus; ``edge`` serves tenants from the bus's feed.
"""
