"""A level held with hysteresis: a rise shows at once, a fall only after the lower level
persisted ``hold`` seconds. Shared by link health (each link's levels) and the tuning
loop (each job's choice). Sans-I/O: time is a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

from harmonaize.messages import Level


@dataclass
class LevelHold:
    """Rises at once; falls only after lower raw levels persisted ``hold`` seconds.

    It falls to the highest raw level seen while it waited, so high -> low ->
    none takes two holds, as a level that only just went quiet should.
    """

    hold: float
    level: Level = Level.NONE
    _lower_since: float | None = None
    _lower_max: Level = Level.NONE

    def falls_at(self) -> float:
        """When the held level falls if the raw level stays below it (inf: it is not
        waiting to fall)."""
        return float("inf") if self._lower_since is None else self._lower_since + self.hold

    def update(self, raw: Level, now: float) -> Level:
        if raw.rank >= self.level.rank:
            self.level, self._lower_since = raw, None
            return self.level
        if self._lower_since is None:
            self._lower_since, self._lower_max = now, raw
            return self.level
        if raw.rank > self._lower_max.rank:
            self._lower_max = raw
        if now - self._lower_since >= self.hold:
            self.level = self._lower_max
            self._lower_since, self._lower_max = now, raw
        return self.level
