"""The baseline rule, as in SuperBench: more than 5% worse than usual fails.

A measurement is compared with its baseline: one given in configuration, or
the median of this node's earlier passing runs. Higher-is-better values fail
below ``baseline * (1 - tolerance)``, lower-is-better ones above
``baseline * (1 + tolerance)``. Pure functions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

DEFAULT_TOLERANCE = 0.05
#: Earlier passing runs that make a learned baseline.
LEARN_FROM = 5


def learned(history: Sequence[float]) -> float | None:
    """The baseline from earlier passing values (newest last): the median of the latest."""
    recent = [v for v in history[-LEARN_FROM:] if math.isfinite(v)]
    return statistics.median(recent) if recent else None


def judge(value: float, baseline: float | None, *, higher_is_better: bool = True,
          tolerance: float = DEFAULT_TOLERANCE) -> tuple[bool, str]:
    """(passed, why) for one measurement against its baseline."""
    if baseline is None or baseline <= 0:
        return True, "no baseline yet"
    ratio = value / baseline
    if higher_is_better and ratio < 1 - tolerance:
        return False, f"{(1 - ratio) * 100:.1f}% below its baseline {baseline:g}"
    if not higher_is_better and ratio > 1 + tolerance:
        return False, f"{(ratio - 1) * 100:.1f}% above its baseline {baseline:g}"
    return True, f"within {tolerance * 100:g}% of its baseline {baseline:g}"
