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


def covers(name: str) -> int:
    """The commit a snapshot's name says it covers (0: not a leader's snapshot)."""
    if not (name.startswith("leader-") and name.endswith(".db")):
        return 0
    try:
        return int(name[len("leader-"):-len(".db")])
    except ValueError:
        return 0


async def newest(bus: Bus) -> str | None:
    """The name of the stored snapshot that covers the most commits (None: none).
    Deleted objects are left out (the store lists them too, and they cannot be read)."""
    assert bus.js is not None
    snapshots = await bus.js.object_store(SNAPSHOTS)
    with contextlib.suppress(NotFoundError, ObjectNotFoundError):
        names = [o.name for o in await snapshots.list(ignore_deletes=True)
                 if covers(o.name) > 0]
        if names:
            return max(names, key=covers)
    return None


async def fetch_newest(bus: Bus, mirror: Path) -> None:
    """Begin the mirror anew: the newest snapshot, or no file (no snapshot yet)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{mirror}{suffix}").unlink(missing_ok=True)
    assert bus.js is not None
    snapshots = await bus.js.object_store(SNAPSHOTS)
    name = await newest(bus)
    if name is not None:
        mirror.write_bytes((await snapshots.get(name)).data or b"")


async def take(bus: Bus, store: Store, mirror: Path, covered: int) -> bool:
    """Store the mirror as of commit ``covered``; older snapshots and the commits before
    it go (the last commit stays: the next one is fenced on it). Nothing is stored,
    deleted or purged when a snapshot as new or newer is stored already: a leader that
    was deposed, and still snapshots, must not replace its successor's newer snapshot
    with one whose missing commits the successor purged. Commits have one history (each
    is fenced on the one before), so the commit a snapshot covers orders snapshots
    across terms. Returns whether it was stored."""
    assert bus.js is not None
    if covered == 0 or covers(await newest(bus) or "") >= covered:
        return False
    copy = mirror.with_suffix(".snapshot")
    copy.unlink(missing_ok=True)
    store.db.execute("VACUUM INTO ?", (str(copy),))
    snapshots = await bus.js.object_store(SNAPSHOTS)
    name = f"leader-{covered}.db"
    await snapshots.put(name, copy.read_bytes())
    copy.unlink(missing_ok=True)
    with contextlib.suppress(NotFoundError, ObjectNotFoundError):
        for old in await snapshots.list(ignore_deletes=True):
            if 0 < covers(old.name) < covered:
                await snapshots.delete(old.name)
    # The purge only ever removes commits this snapshot holds, and only while it is the
    # newest: a newer one stored meanwhile purged further (a purge to here is then
    # nothing), and its leader deletes this one. The last commit stays: the next
    # Commit is fenced on it.
    if covers(await newest(bus) or "") == covered:
        await bus.js.purge_stream(STATE, subject=COMMIT_SUBJECT, seq=covered)
    log.info("snapshot of the state to commit %d", covered)
    return True
