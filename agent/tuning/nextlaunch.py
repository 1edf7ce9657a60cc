"""Recommendations for parameters NCCL reads only when a communicator starts.

IB queue pairs, traffic class, buffer size and socket threads are fixed for a
communicator's lifetime (``research/nccl.md`` §3), so what the agent learned
about a job's links becomes a file for the job's next launch, in the format
NCCL reads from ``NCCL_CONF_FILE`` (2.23+): one ``NAME=value`` per line.
NCCL applies each with ``setenv(name, value, 0)``, so anything the tenant set
in the environment still wins. NCCL has no comment syntax: it skips lines
without ``=``, so the explanatory lines here never contain one.

Pure functions; the service writes the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.tuning.policies import BANDWIDTH_BOUND
from harmonaize.messages import JobDeclaration

#: NCCL's default buffer is 4 MiB; twice that keeps a step's data in flight
#: when queueing on a congested path stretches the round trip.
CONGESTED_BUFFSIZE = 8 << 20
#: Several QPs per connection, with the data split over them, spread one
#: connection over several ECMP paths, so one hot path slows only a share.
CONGESTED_QPS = 4
#: More sockets recover from loss faster than one: each halves its own
#: window, not the whole transfer's (product with threads must stay <= 64).
LOSSY_SOCKET_THREADS = 4
LOSSY_SOCKS_PER_THREAD = 2


@dataclass(frozen=True)
class Experience:
    """What the agent saw of a job's links while it ran."""

    #: Share of the observed time the job's choice was congested or worse.
    congested_share: float = 0.0
    #: Retransmissions were seen on the job's kernel-path links (sockets, bulk).
    retransmitting: bool = False
    observed_seconds: float = 0.0


def experience(congested: float, observed: float, retransmitting: bool) -> Experience:
    """What a job saw: the share of its observed time its links were congested."""
    return Experience(congested / observed if observed else 0.0, retransmitting, observed)


def _channel_bounds(declaration: JobDeclaration) -> tuple[int, int] | None:
    """A channel count inside every bandwidth-bound declared range, if one exists
    (NCCL's channel limits apply to the whole communicator, not per range)."""
    bands = [b for b in declaration.tuning if b.max_bytes > BANDWIDTH_BOUND]
    if not bands:
        return None
    low = max(b.min_channels for b in bands)
    high = min(b.max_channels for b in bands)
    return (low, high) if low <= high else None


def recommend(declaration: JobDeclaration, seen: Experience, *,
              ib_traffic_class: int = -1, congested_share: float = 0.2,
              ) -> dict[str, tuple[str, str]]:
    """NCCL variable -> (value, why); only values inside what the job declared."""
    out: dict[str, tuple[str, str]] = {}
    if ib_traffic_class >= 0:
        out["NCCL_IB_TC"] = (str(ib_traffic_class),
                             "the provider's traffic class for collective RDMA traffic")
    if seen.congested_share >= congested_share:
        why = f"congested {seen.congested_share:.0%} of the time"
        out["NCCL_IB_QPS_PER_CONNECTION"] = (str(CONGESTED_QPS), why)
        out["NCCL_IB_SPLIT_DATA_ON_QPS"] = ("1", why)
        out["NCCL_BUFFSIZE"] = (str(CONGESTED_BUFFSIZE), why)
        bounds = _channel_bounds(declaration)
        if bounds is not None:
            low, high = bounds
            cap = str(max(low, min(high, high >> 1)))
            out["NCCL_MAX_NCHANNELS"] = (cap, why + ", within the declared channels")
            out["NCCL_MAX_CTAS"] = (cap, why + ", within the declared channels")
    if seen.retransmitting:
        why = "retransmissions on the job's kernel-path links"
        out["NCCL_SOCKET_NTHREADS"] = (str(LOSSY_SOCKET_THREADS), why)
        out["NCCL_NSOCKS_PERTHREAD"] = (str(LOSSY_SOCKS_PER_THREAD), why)
    return out


def render(job: str, values: dict[str, tuple[str, str]], seen: Experience) -> str:
    """The file NCCL reads through NCCL_CONF_FILE."""
    lines = [
        f"# HarmonAIze next-launch recommendations for job {job}",
        f"# from {seen.observed_seconds:.0f} s observed: congested "
        f"{seen.congested_share:.0%} of the time"
        + (", retransmissions seen" if seen.retransmitting else ""),
        "# variables already set in the environment take precedence",
    ]
    for name in sorted(values):
        value, why = values[name]
        lines.append(f"# {why.replace('=', ' ')}")
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, str]:
    """What NCCL would set from ``text`` (for tests and operators)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            out.setdefault(name, value)
    return out
