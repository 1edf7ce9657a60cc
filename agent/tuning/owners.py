"""The users whose sockets are a job's on this host: its Unix group's, from the system's
user database (the provider's, never the tenant's), for the bulk classifier.

The job's group comes with its placement (``JobDeclaration.group``); without one, the
job's processes are root's. A user counts when the group is its primary group or lists
it as a member. Looked up at most once per ``ttl`` seconds per group: the user database
may be a directory service, and the agent's pass must not wait on it often.
"""

from __future__ import annotations

import grp
import logging
import pwd
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: A group with more users than this is cut there (a job's group is small).
MAX_USERS = 4096


class GroupUsers:
    def __init__(self, ttl: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[str, tuple[float, tuple[int, ...]]] = {}

    def uids(self, group: str) -> tuple[int, ...]:
        """The job's users; root alone for no group; none for a group unknown here."""
        if not group:
            return (0,)
        now = self.clock()
        cached = self._cache.get(group)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        found = members(group)
        if len(self._cache) > MAX_USERS:
            self._cache.clear()
        self._cache[group] = (now, found)
        return found


def members(group: str) -> tuple[int, ...]:
    try:
        entry = grp.getgrgid(int(group)) if group.isdigit() else grp.getgrnam(group)
    except (KeyError, ValueError, OverflowError):
        return ()
    uids: set[int] = set()
    for name in entry.gr_mem[:MAX_USERS]:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    for user in pwd.getpwall():
        if len(uids) >= MAX_USERS:
            break
        if user.pw_gid == entry.gr_gid:
            uids.add(user.pw_uid)
    return tuple(sorted(uids))


def resolve_group(group: str) -> int | None:
    """A group name or number from a placement; None (root only) if empty or unknown."""
    if not group:
        return None
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        log.warning("group %r is not known on this host: only root's processes can follow "
                    "the job's policy", group)
        return None
