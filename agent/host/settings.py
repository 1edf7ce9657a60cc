"""The host observer's settings (``[observers.host]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from harmonaize.schema import Fraction, Num


@dataclass(frozen=True)
class HostObserverSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: Rules' settings: a reload applies them to the running engine (see live_changes).
    LIVE: ClassVar[frozenset[str]] = frozenset({"memory_available_min", "sustain"})
    enabled: bool = True
    #: Seconds between reads of CPU, memory and load (slower than the loop: they move slowly).
    interval: Annotated[float, Num(0.01, 3600.0)] = 1.0
    #: Memory pressure holds while available memory is below this fraction.
    memory_available_min: Fraction = 0.05
    #: ... for at least this many seconds (one dip does not flap the condition).
    sustain: Annotated[float, Num(0.0, 3600.0)] = 2.0
