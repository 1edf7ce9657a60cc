"""Information regimes: no feed, the redacted feed (and coarser or finer variants), everything.

Each regime is just a :class:`RedactionConfig` for the controller's redactor; the
simulator adds no rules of its own. The sweep varies one knob of the default at a time:

* ``bucket``: every bucket edge, host and GPU, multiplied by ``s`` (``s`` = 1 is the
  default). Relative resolution stays a factor of two, but the smallest count told apart
  grows with ``s``.
* ``host``: only the host-count edges multiplied by ``s``. At ``s`` = 1/2 they begin
  0, 1, 2, 4, the defaults before they were doubled, so "no host down" and "one host
  down" are told apart (the default's first host bucket is 0-1).
* ``k``: ``min_hosts``, the fewest hosts an aggregate may cover.
* ``interval``: ``min_interval``, seconds between two updates of one pool (jitter stays).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.redaction import Mode, RedactionConfig

_DEFAULT = RedactionConfig()

BUCKET_SCALES = (1, 2, 4, 8, 16)
#: 0.5 is the previous default (host edges 0, 1, 2, 4, ...; the GPU edges unchanged).
HOST_SCALES = (0.5, 1, 2, 4)
MIN_HOSTS = (1, 5, 10, 20, 40)
MIN_INTERVALS = (0.0, 10.0, 60.0, 600.0, 3600.0)


@dataclass(frozen=True)
class Regime:
    name: str
    redaction: RedactionConfig
    #: Which knob this sweep point varies ("" for the three main regimes) and its value.
    knob: str = ""
    value: float = 0.0


def scaled(edges: tuple[int, ...], s: float) -> tuple[int, ...]:
    """Every edge times ``s`` (a fraction must keep them whole and apart)."""
    out = tuple(e * s for e in edges)
    if any(e != int(e) for e in out) or len(set(out)) != len(out):
        raise ValueError(f"edges {edges} cannot be scaled by {s}")
    return tuple(int(e) for e in out)


def none() -> Regime:
    return Regime("none", RedactionConfig(mode=Mode.NONE))


def full() -> Regime:
    return Regime("full", RedactionConfig(mode=Mode.FULL))


def redacted(bucket_scale: int = 1, *, host_scale: float = 1, min_hosts: int | None = None,
             min_interval: float | None = None, knob: str = "", value: float = 0.0,
             name: str = "redacted") -> Regime:
    cfg = RedactionConfig(
        mode=Mode.REDACTED,
        min_hosts=_DEFAULT.min_hosts if min_hosts is None else min_hosts,
        host_buckets=scaled(_DEFAULT.host_buckets, bucket_scale * host_scale),
        gpu_buckets=scaled(_DEFAULT.gpu_buckets, bucket_scale),
        min_interval=_DEFAULT.min_interval if min_interval is None else min_interval,
    )
    return Regime(name, cfg, knob, value)


def main_regimes() -> list[Regime]:
    return [none(), redacted(), full()]


def sweep() -> list[Regime]:
    """The default redacted feed and each one-knob variation of it (default included once)."""
    points = [redacted(knob="default", value=0.0)]
    points += [redacted(bucket_scale=s, knob="bucket", value=s, name=f"bucket x{s}")
               for s in BUCKET_SCALES if s != 1]
    points += [redacted(host_scale=s, knob="host", value=s, name=f"host x{s:g}")
               for s in HOST_SCALES if s != 1]
    points += [redacted(min_hosts=k, knob="k", value=k, name=f"k={k}")
               for k in MIN_HOSTS if k != _DEFAULT.min_hosts]
    points += [redacted(min_interval=i, knob="interval", value=i, name=f"interval {i:g}s")
               for i in MIN_INTERVALS if i != _DEFAULT.min_interval]
    return points


def knob_default(knob: str) -> float:
    return {"bucket": 1.0, "host": 1.0, "k": float(_DEFAULT.min_hosts),
            "interval": _DEFAULT.min_interval}[knob]
