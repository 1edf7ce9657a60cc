"""The leader's snapshots: its mirror of the state (SQLite), kept in the bus's object
store, so that a new leader reads the newest snapshot and only the commits after it.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from nats.js.errors import NotFoundError, ObjectNotFoundError

from controller.bus.nats import COMMIT_SUBJECT, SNAPSHOTS, STATE, Bus
from controller.store import Store

log = logging.getLogger("harmonaize.controller.leader")


async def fetch_newest(bus: Bus, mirror: Path) -> None:
    """Begin the mirror anew: the newest snapshot, or no file (no snapshot yet)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{mirror}{suffix}").unlink(missing_ok=True)
    assert bus.js is not None
    snapshots = await bus.js.object_store(SNAPSHOTS)
    with contextlib.suppress(NotFoundError, ObjectNotFoundError):
        names = [o.name for o in await snapshots.list() if o.name.startswith("leader-")]
        if names:
            newest = max(names, key=lambda n: int(n.split("-")[1].split(".")[0]))
            mirror.write_bytes((await snapshots.get(newest)).data or b"")


async def take(bus: Bus, store: Store, mirror: Path, covered: int) -> None:
    """Store the mirror as of commit ``covered``; older snapshots and the commits before
    it go (the last commit stays: the next one is fenced on it)."""
    assert bus.js is not None
    if covered == 0:
        return
    copy = mirror.with_suffix(".snapshot")
    copy.unlink(missing_ok=True)
    store.db.execute("VACUUM INTO ?", (str(copy),))
    snapshots = await bus.js.object_store(SNAPSHOTS)
    name = f"leader-{covered}.db"
    await snapshots.put(name, copy.read_bytes())
    copy.unlink(missing_ok=True)
    with contextlib.suppress(NotFoundError, ObjectNotFoundError):
        for old in await snapshots.list():
            if old.name.startswith("leader-") and old.name != name:
                await snapshots.delete(old.name)
    # Keep the last commit: the next one is fenced on it.
    await bus.js.purge_stream(STATE, subject=COMMIT_SUBJECT, seq=covered)
    log.info("snapshot of the state to commit %d", covered)
