"""The agent's reader of the tuner plugin's stats files (written by tenants' processes):
any bytes give the file's slots, or None (malformed), in a bounded number of reads, and
nothing else; every slot read is the file's own process's."""

from __future__ import annotations

import os

from common import OURS, atheris, run

with atheris.instrument_imports(include=OURS):
    from agent.plugin.layout import STATS_SLOTS
    from agent.plugin.shm import StatsLimits, read_slots

TRIES = StatsLimits().seqlock_tries
#: One file in memory, rewritten per input: the reader's real preads, no disk.
FILE = os.memfd_create("stats", os.MFD_CLOEXEC)


def one(data: bytes) -> None:
    os.ftruncate(FILE, 0)
    os.pwrite(FILE, data, 0)
    # The name's pid and tag, taken from the header where there is one, so that inputs
    # reach the slots (a mismatch is refused before them).
    pid = int.from_bytes(data[8:12], "little") if len(data) >= 12 else 1
    tag = int.from_bytes(data[16:24], "little") if len(data) >= 24 else 1
    reading = read_slots(FILE, pid, tag, TRIES, {})
    if reading is None:
        return
    if not 1 <= reading.reads <= TRIES or not 0 <= reading.stale <= STATS_SLOTS:
        raise AssertionError(f"unbounded reading: {reading.reads} reads, {reading.stale} stale")
    for index, slot in reading.slots.items():
        if not 0 <= index < STATS_SLOTS or slot.pid != pid or slot.tag != tag:
            raise AssertionError(f"slot {index} is not the file's own: {slot!r:.200}")


if __name__ == "__main__":
    run(one)
