"""Tenants' bearer tokens for the HTTP gateway, kept in the controller's database.

A token is ``hzt_<id>_<secret>``: the id names its row, the secret (32 random bytes) is
shown once when it is issued and kept only as its SHA-256, compared in constant time.
Each is issued for one tenant (``harmonctl -C token issue --tenant acme``), may expire,
and may be revoked; a revoked or expired token is refused like an unknown one.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
from typing import Any, Protocol

from harmonaize.schema import IDENT_PATTERN

PREFIX = "hzt_"
_TOKEN = re.compile(r"hzt_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
_TENANT = re.compile(IDENT_PATTERN)
#: The longest a token may be issued for.
MAX_DAYS = 3650


def token_id(token: str) -> str | None:
    """The id part of a token (None: not one of ours)."""
    match = _TOKEN.fullmatch(token)
    return match[1] if match else None


class TokenError(ValueError):
    """An issue or revoke request that cannot be done; the message says why."""


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class TokenBook(Protocol):
    """Where tokens are kept: the controller's database, or (in a cluster) the bus."""

    def tenant_of(self, token: str, now: float) -> str | None: ...

    async def issue(self, tenant: str, days: float, note: str,
                    now: float) -> dict[str, Any]: ...

    async def revoke(self, token_id: str, now: float) -> str: ...

    async def listed(self, now: float) -> list[dict[str, Any]]: ...


def check_issue(tenant: object, days: object, note: object) -> None:
    """An issue request's arguments, or :class:`TokenError` naming the wrong one."""
    if not isinstance(tenant, str) or len(tenant) > 128 or not _TENANT.fullmatch(tenant):
        raise TokenError("tenant must be a tenant name (letters, digits, ._:@+-)")
    if isinstance(days, bool) or not isinstance(days, int | float) or \
            not 0 < days <= MAX_DAYS:
        raise TokenError(f"days must be a number above 0 and at most {MAX_DAYS}")
    if not isinstance(note, str) or len(note) > 200:
        raise TokenError("note must be a string of at most 200 characters")


def new_secret() -> tuple[str, str, bytes]:
    """(id, secret, the secret's digest) of a new token."""
    secret = secrets.token_urlsafe(32)
    return secrets.token_hex(8), secret, _digest(secret)


def check_token(token: str, digest: bytes) -> bool:
    match = _TOKEN.fullmatch(token)
    return match is not None and hmac.compare_digest(digest, _digest(match[2]))


class Tokens:
    """Tokens in the controller's SQLite database."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    async def issue(self, tenant: str, days: float, note: str, now: float) -> dict[str, Any]:
        """A new token for ``tenant``, valid ``days`` from ``now`` (the one time its
        secret is shown)."""
        check_issue(tenant, days, note)
        token_id, secret, digest = new_secret()
        expires = now + days * 86400
        with self.db:
            self.db.execute("INSERT INTO tokens (id, tenant, hash, created, expires, note) "
                            "VALUES (?, ?, ?, ?, ?, ?)",
                            (token_id, tenant, digest, now, expires, note))
        return {"token": f"{PREFIX}{token_id}_{secret}", "id": token_id, "tenant": tenant,
                "expires": expires}

    def tenant_of(self, token: str, now: float) -> str | None:
        """The tenant a presented token stands for; None for anything else."""
        match = _TOKEN.fullmatch(token)
        if match is None:
            return None
        row = self.db.execute("SELECT tenant, hash, expires, revoked FROM tokens WHERE id = ?",
                              (match[1],)).fetchone()
        if row is None:
            return None
        tenant, digest, expires, revoked = row
        if not hmac.compare_digest(digest, _digest(match[2])) or revoked or expires <= now:
            return None
        return tenant

    async def revoke(self, token_id: str, now: float) -> str:
        """Revoke a token by its id; the tenant it was for."""
        row = self.db.execute("SELECT tenant FROM tokens WHERE id = ? AND revoked = 0",
                              (token_id,)).fetchone() if isinstance(token_id, str) else None
        if row is None:
            raise TokenError(f"no token {str(token_id)[:40]!r} in force")
        with self.db:
            self.db.execute("UPDATE tokens SET revoked = ? WHERE id = ?", (now, token_id))
        return row[0]

    async def listed(self, now: float) -> list[dict[str, Any]]:
        """Every token, without its secret."""
        rows = self.db.execute("SELECT id, tenant, created, expires, revoked, note FROM tokens "
                               "ORDER BY tenant, created").fetchall()
        return [{"id": i, "tenant": t, "created": c, "expires": e, "note": n,
                 "state": "revoked" if r else "expired" if e <= now else "valid"}
                for i, t, c, e, r, n in rows]
