"""The process's descriptor budget: raised at start, shown in status and metrics."""

from __future__ import annotations

import logging
import os
import resource

log = logging.getLogger(__name__)

#: Enough for tens of thousands of agents and tenants; never above the hard limit.
WANTED_DESCRIPTORS = 65536


def raise_descriptor_limit(wanted: int = WANTED_DESCRIPTORS) -> int:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (within the hard limit).

    Every agent, tenant and half-open connection holds one descriptor; with the
    usual soft limit of 1024, a thousand idle connections would starve the rest.
    Returns the soft limit in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the descriptor limit from %d to %d: %s",
                        soft, target, exc)
    if soft < wanted:
        log.warning("descriptor limit is %d (hard limit %s): fewer connections than %d fit",
                    soft, hard, wanted)
    return soft


def descriptors() -> dict[str, int]:
    """Descriptors open now and the soft limit."""
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = -1
    return {"open": used, "limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
