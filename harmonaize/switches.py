"""Do ranks of one communicator agree? A check over their switch records.

The tuner plugin records, per rank, every collective index at which its
answer changed, as a count, a hash chain over (index, ruleset) pairs, the
chain before the last change and the index of the last change. Ranks agree
at every index both have issued exactly when their records say so:

* two ranks with the same count must have the same chain;
* a rank one change behind another must have the other's chain before its
  last change, and must not have completed the index of that change yet
  (it would have changed there too);
* a rank further behind must at least not have passed the other's last change.

The agent compares its own ranks with this, and the controller every host's
records of a communicator. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Hash chains travel as 62-bit values (the wire's counts).
WIRE_MASK = (1 << 62) - 1


@dataclass(frozen=True)
class Record:
    """A group of ranks with one switch record; ``collectives`` is the most
    collectives a rank of the group completed."""

    switches: int
    history: int
    prev_history: int
    last_switch: int
    collectives: int

    def masked(self) -> Record:
        return Record(self.switches, self.history & WIRE_MASK, self.prev_history & WIRE_MASK,
                      self.last_switch, self.collectives)


def merge(records: Iterable[Record]) -> list[Record]:
    """One record per distinct switch record, with the most collectives of its ranks."""
    groups: dict[tuple[int, int, int, int], Record] = {}
    for record in records:
        key = (record.switches, record.history, record.prev_history, record.last_switch)
        known = groups.get(key)
        if known is None or record.collectives > known.collectives:
            groups[key] = record
    return sorted(groups.values(), key=lambda r: (r.switches, r.collectives))


def disagreement(records: Iterable[Record]) -> str:
    """Why these ranks do not answer alike ("" if nothing shows that they do not)."""
    groups = merge(records)
    for i, low in enumerate(groups):
        for high in groups[i + 1:]:
            if high.switches == low.switches:
                return (f"ranks that changed {low.switches} times did so at different "
                        "collectives or to different rules")
            if high.switches == low.switches + 1:
                if low.history != high.prev_history:
                    return (f"ranks disagree before collective {high.last_switch}: their "
                            "earlier changes differ")
                if low.collectives > high.last_switch:
                    return (f"a rank passed collective {high.last_switch} without the change "
                            "other ranks made there")
            elif low.collectives > high.last_switch:
                return (f"a rank {high.switches - low.switches} changes behind passed "
                        f"collective {high.last_switch}, where others changed")
    return ""
