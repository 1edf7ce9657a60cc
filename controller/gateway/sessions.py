"""Browser sessions: a random id in a cookie, mapped here to the token it came from.

The cookie is never the token: it is a fresh id (``secrets.token_urlsafe``), useless as
``Authorization: Bearer`` and anywhere but ``GET /v1/feed``; ``DELETE /v1/session``
forgets it, and it lapses after the gateway's session lifetime. The token it was
started from is kept beside it (in memory only, never written) so that each use checks
the token again: a session ends as soon as its token is revoked or expires, whichever
replica the revocation reached. Each tenant holds a bounded number (starting one more
ends its oldest), and all tenants together a bounded number.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

PREFIX = "hzs_"
#: Sessions kept at once over all tenants; beyond, new ones are refused.
MAX_SESSIONS = 100_000


@dataclass(frozen=True)
class Session:
    tenant: str
    token: str
    expires: float


class Sessions:
    def __init__(self, lifetime: float, per_tenant: int, total: int = MAX_SESSIONS) -> None:
        self.lifetime = lifetime
        self.per_tenant = per_tenant
        self.total = total
        self._by_id: dict[str, Session] = {}  # oldest first

    def __len__(self) -> int:
        return len(self._by_id)

    def start(self, tenant: str, token: str, now: float) -> str | None:
        """A new session's id; None where every slot is taken by live sessions."""
        self._forget_expired(now)
        mine = [sid for sid, s in self._by_id.items() if s.tenant == tenant]
        for sid in mine[:max(0, len(mine) - self.per_tenant + 1)]:
            del self._by_id[sid]  # the tenant's oldest make room
        if len(self._by_id) >= self.total:
            return None
        sid = PREFIX + secrets.token_urlsafe(32)
        self._by_id[sid] = Session(tenant, token, now + self.lifetime)
        return sid

    def get(self, sid: str, now: float) -> Session | None:
        session = self._by_id.get(sid)
        if session is not None and session.expires <= now:
            del self._by_id[sid]
            return None
        return session

    def end(self, sid: str) -> Session | None:
        return self._by_id.pop(sid, None)

    def _forget_expired(self, now: float) -> None:
        for sid in [sid for sid, s in self._by_id.items() if s.expires <= now]:
            del self._by_id[sid]
