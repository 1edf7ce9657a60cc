"""A condition's revision: what subscribers see of it (its content, which a new
revision must change) and the same body under a new revision number."""

from __future__ import annotations

from harmonaize.messages import JobHealth, Message, PoolCapacity


def content_of(body: Message) -> object:
    """What subscribers see of a condition, without its revision."""
    if isinstance(body, PoolCapacity):
        return (body.hosts_up, body.hosts_down, body.gpus_available)
    if isinstance(body, JobHealth):
        return (body.degraded, body.lost, body.congestion, body.tuning_choice, body.tuning,
                body.energy)
    return body


def with_revision(body: Message, revision: int) -> Message:
    if isinstance(body, PoolCapacity):
        return PoolCapacity(body.pool, body.gpu_class, body.hosts_up, body.hosts_down,
                            body.gpus_available, body.trend, revision)
    if isinstance(body, JobHealth):
        return JobHealth(body.job, body.degraded, body.lost, body.congestion, revision,
                         body.tuning_choice, body.tuning, body.energy)
    return body
