"""CurveZMQ keys for a test cluster or the demo, laid out as a controller expects.

``<root>/controller.key_secret`` is the controller's pair; an agent's pair
lives in ``<root>/hosts/<host>/`` with its public key filed in
``<root>/agents/<host>.key``; a tenant's in ``<root>/tenant-<name>/`` and
``<root>/tenants/<name>.key``. The controller re-reads its allow-lists when
they change, so hosts and tenants can be added while it runs.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from harmonaize import keys


@dataclass(frozen=True)
class Credentials:
    """What a client needs: its own pair and the controller's public key."""

    key: Path
    server_key: Path


class Keyring:
    def __init__(self, root: Path) -> None:
        self.root = root
        if not (root / f"controller{keys.SECRET_SUFFIX}").exists():
            keys.generate(root, "controller")
        self.server_key = root / f"controller{keys.PUBLIC_SUFFIX}"

    def _member(self, kind: str, home: Path, name: str, allowed: bool) -> Credentials:
        secret = home / f"{name}{keys.SECRET_SUFFIX}"
        if not secret.exists():
            public, secret = keys.generate(home, name)
            if allowed:
                (self.root / kind).mkdir(exist_ok=True)
                shutil.copyfile(public, self.root / kind / f"{name}{keys.PUBLIC_SUFFIX}")
        return Credentials(secret, self.server_key)

    def agent(self, host: str, *, allowed: bool = True) -> Credentials:
        return self._member("agents", self.root / "hosts" / host, host, allowed)

    def tenant(self, name: str, *, allowed: bool = True) -> Credentials:
        return self._member("tenants", self.root / f"tenant-{name}", name, allowed)

    def agent_config(self, host: str) -> str:
        """Lines for an agent's [controller] section."""
        creds = self.agent(host)
        return f'secret_key = "{creds.key}"\nserver_key = "{creds.server_key}"\n'

    def controller_config(self) -> str:
        return f'[auth]\nkeys_dir = "{self.root}"\n'
