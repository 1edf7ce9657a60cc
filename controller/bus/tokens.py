"""Tenants' gateway tokens in a cluster: in the bus's key-value bucket ``hz-tokens``, so
a token issued at one replica opens every replica's gateway, and a revocation reaches
them all. Each replica watches the bucket and checks tokens against its copy (no
request waits on the bus)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from controller.gateway.tokens import PREFIX, TokenError, check_issue, check_token, new_secret
from controller.gateway.tokens import token_id as id_of

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

log = logging.getLogger("harmonaize.controller.bus")


class BusTokens:
    def __init__(self, bucket: KeyValue) -> None:
        self.bucket = bucket
        self._known: dict[str, dict[str, Any]] = {}
        self._watch: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    def start(self) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch

    async def _follow(self) -> None:
        while True:
            try:
                watcher = await self.bucket.watchall()
                async for entry in watcher:
                    if entry is None:  # the initial values are all in
                        self.ready.set()
                        continue
                    if entry.value:
                        with contextlib.suppress(ValueError):
                            self._known[entry.key] = json.loads(entry.value)
                    else:
                        self._known.pop(entry.key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the bus went away: watch again when it is back
                log.info("watching tokens: %s; again", exc)
                await asyncio.sleep(1.0)

    def tenant_of(self, token: str, now: float) -> str | None:
        token_id = id_of(token)
        record = self._known.get(token_id or "")
        if record is None or record["revoked"] or record["expires"] <= now:
            return None
        return record["tenant"] if check_token(token, bytes.fromhex(record["hash"])) else None

    async def issue(self, tenant: str, days: float, note: str, now: float) -> dict[str, Any]:
        check_issue(tenant, days, note)
        token_id, secret, digest = new_secret()
        expires = now + days * 86400
        record = {"tenant": tenant, "hash": digest.hex(), "created": now, "expires": expires,
                  "revoked": 0, "note": note}
        await self.bucket.put(token_id, json.dumps(record).encode())
        self._known[token_id] = record
        return {"token": f"{PREFIX}{token_id}_{secret}", "id": token_id, "tenant": tenant,
                "expires": expires}

    async def revoke(self, token_id: str, now: float) -> str:
        record = self._known.get(token_id) if isinstance(token_id, str) else None
        if record is None or record["revoked"]:
            raise TokenError(f"no token {str(token_id)[:40]!r} in force")
        record = {**record, "revoked": now}
        await self.bucket.put(token_id, json.dumps(record).encode())
        self._known[token_id] = record
        return str(record["tenant"])

    async def listed(self, now: float) -> list[dict[str, Any]]:
        return [{"id": key, "tenant": r["tenant"], "created": r["created"],
                 "expires": r["expires"], "note": r["note"],
                 "state": "revoked" if r["revoked"] else "expired" if r["expires"] <= now
                 else "valid"}
                for key, r in sorted(self._known.items(),
                                     key=lambda kv: (kv[1]["tenant"], kv[1]["created"]))]
