"""The operator's ``/etc/harmonaize/slurm.toml``: where the controller's socket is, the
spool and the log, and which Slurm accounts and users are which tenants.

Checked by hand (six keys and three maps) rather than through harmonaize.schema, and
a plain class rather than a dataclass: their imports alone would cost every job start
more than the rest of the hook.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

DEFAULT_PATH = "/etc/harmonaize/slurm.toml"
#: The controller's identifiers (harmonaize.schema.IDENT_PATTERN, 128 at most).
IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")


class ConfigError(ValueError):
    """The configuration file is unreadable or wrong: one line says where."""


class HookConfig:
    #: The controller's operator socket (controller.admin_socket), or a cluster-mode
    #: replica's on this host: it forwards place and unplace to the leader.
    socket = "/run/harmonaize/controller.sock"
    #: Requests wait here, in order, until the controller has them.
    spool = "/var/spool/harmonaize/slurm"
    #: One line per event (Slurm drops a PrologSlurmctld's output).
    log = "/var/log/harmonaize/slurm.log"
    #: Seconds one delivery may take (connect, send, reply) before it is left spooled.
    timeout = 0.25
    #: Seconds a prolog or epilog spends delivering in all (its own and older requests).
    budget = 0.5
    #: Spooled requests a prolog or epilog delivers at most (the timer's replay: all).
    replay_limit = 32

    def __init__(self, **values: Any) -> None:
        for key, value in values.items():
            setattr(self, key, value)
        #: Slurm account -> tenant, tried first; then Slurm user -> tenant.
        self.accounts: dict[str, str] = values.get("accounts", {})
        self.users: dict[str, str] = values.get("users", {})
        #: Slurm node name -> the host id its agent reports (identity where absent).
        self.hosts: dict[str, str] = values.get("hosts", {})

    def tenant_of(self, account: str | None, user: str | None) -> str | None:
        if account and account in self.accounts:
            return self.accounts[account]
        if user and user in self.users:
            return self.users[user]
        return None

    def host_of(self, node: str) -> str:
        return self.hosts.get(node, node)


SCALARS: dict[str, tuple[type, float, float]] = {
    "timeout": (float, 0.01, 10.0),
    "budget": (float, 0.01, 60.0),
    "replay_limit": (int, 1, 100_000),
}


def load(path: str | None = None) -> HookConfig:
    """The file's settings over the defaults; a missing default file is the defaults."""
    target = path or DEFAULT_PATH
    try:
        with open(target, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        if path is None:
            return HookConfig()
        raise ConfigError(f"{target}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{target}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{target}: not TOML: {exc}") from None
    return parse(raw, str(target))


def parse(raw: dict[str, Any], where: str = "slurm.toml") -> HookConfig:
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("socket", "spool", "log"):
            if not isinstance(value, str) or not value.startswith("/"):
                raise ConfigError(f"{where}: {key} must be an absolute path")
            values[key] = value
        elif key in SCALARS:
            kind, low, high = SCALARS[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or \
                    (kind is int and not isinstance(value, int)) or not low <= value <= high:
                raise ConfigError(f"{where}: {key} must be a {kind.__name__} from {low:g} "
                                  f"to {high:g}")
            values[key] = kind(value)
        elif key in ("accounts", "users", "hosts"):
            # "" in [accounts] or [users]: known, and not a tenant's (placed quietly never).
            values[key] = _mapping(value, f"{where}: [{key}]", empty=key != "hosts")
        else:
            raise ConfigError(f"{where}: unknown key {key!r}")
    return HookConfig(**values)


def _mapping(value: Any, where: str, *, empty: bool) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table of names")
    if len(value) > 100_000:
        raise ConfigError(f"{where} has more than 100000 entries")
    for key, target in value.items():
        if empty and target == "":
            continue
        if not isinstance(target, str) or not IDENT.fullmatch(target):
            raise ConfigError(f"{where}: {key!r} must map to a name of letters, digits and "
                              "._:@+- (at most 128)")
    return dict(value)
