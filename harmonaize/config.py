"""Loading TOML configuration into typed, validated dataclasses."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, ClassVar, TypeVar

from harmonaize.schema import SchemaError, Str, from_plain

T = TypeVar("T")

AbsPath = Annotated[str, Str(max_len=4096, min_len=1, pattern=r"/.*")]
"""An absolute filesystem path."""
OptionalPath = Annotated[str, Str(max_len=4096, pattern=r"(/.*)?")]
"""An absolute filesystem path, or empty for none."""
_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
Endpoint = Annotated[str, Str(
    max_len=256, pattern=rf"tcp://(\*|[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):{_PORT}|ipc:///\S+",
    expected="a ZeroMQ endpoint: tcp://HOST:PORT (port 1-65535, HOST * for all) or "
             "ipc:///PATH")]
"""A ZeroMQ endpoint such as ``tcp://10.0.0.1:7400``; empty where optional."""


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class ConfigError(ValueError):
    """The configuration is unusable; the message names the file and the key."""


def load(cls: type[T], path: Path | None, *, default: Path) -> tuple[T, Path | None]:
    """Read ``path`` (or ``default`` if it exists) into ``cls``.

    A missing default file means built-in defaults; a missing explicit file is
    an error. Returns the config and the file it came from, if any.
    """
    source = path if path is not None else default
    if not source.exists():
        if path is not None:
            raise ConfigError(f"{source}: no such configuration file")
        return from_plain(cls, {}, ""), None
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    return loads(cls, raw, source), source


def loads(cls: type[T], raw: bytes, source: Path | str = "<config>") -> T:
    """Parse a configuration file's bytes into ``cls``; raises only ConfigError."""
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    return parse(cls, data, source)


def parse(cls: type[T], data: dict, source: Path | str = "<config>") -> T:
    try:
        return from_plain(cls, data, "")
    except SchemaError as exc:
        raise ConfigError(f"{source}: {exc}") from None


# --- [metrics], shared by the agent and the controller --------------------------------

ListenAddress = Annotated[str, Str(
    max_len=300, pattern=r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}")]
"""``HOST:PORT`` (``[::1]:9480`` for IPv6); empty where the endpoint is off."""


@dataclass(frozen=True)
class MetricsSection:
    """``[metrics]`` in the agent's and the controller's configuration."""

    STRICT_KEYS: ClassVar[bool] = True
    #: Serve Prometheus text on GET /metrics here, e.g. "127.0.0.1:9480"; empty: off.
    listen: ListenAddress = ""

    def __post_init__(self) -> None:
        if self.listen and split_address(self.listen)[1] == 0:  # also checks the form
            raise ValueError("listen needs a port from 1 to 65535")


def split_address(address: str) -> tuple[str, int]:
    """``"127.0.0.1:9480"`` -> ``("127.0.0.1", 9480)``; ``"[::1]:80"`` -> ``("::1", 80)``.

    Port 0 (any free port) passes here, for tests; the configuration refuses it.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    if int(port) > 65535:
        raise ValueError(f"port {port} is above 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)
