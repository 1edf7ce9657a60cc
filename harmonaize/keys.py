"""CurveZMQ key files: generating, reading and checking them.

Two small text files per identity, both TOML:

* ``NAME.key`` -- ``public-key = "<40 Z85 characters>"``: safe to copy to
  peers (the controller's allow-lists, the agents' and tenants' copy of the
  controller's key).
* ``NAME.key_secret`` -- the public key and ``secret-key``, mode 0600: never
  leaves the machine that made it.

The controller's layout (``auth.keys_dir``)::

    controller.key_secret       its own pair
    agents/<host id>.key        hosts allowed to connect, named by host id
    tenants/<tenant>.key        tenants allowed to subscribe, named by tenant

A key file's name is the identity: an agent must say hello with the host id
its key is filed under, and a tenant sees only its own jobs.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

Z85_KEY = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
#: A key file is a few lines; anything larger is not one.
MAX_KEY_FILE = 4096


class KeyFileError(ValueError):
    """A key file is missing or malformed; the message names the file."""


@dataclass(frozen=True)
class KeyPair:
    public: bytes  # Z85, 40 bytes
    secret: bytes  # Z85, 40 bytes


def _check_key(text: object, what: str, path: Path) -> bytes:
    if not isinstance(text, str) or not Z85_KEY.fullmatch(text):
        raise KeyFileError(f"{path}: {what} must be 40 Z85 characters")
    try:
        z85.decode(text.encode())
    except ValueError:
        raise KeyFileError(f"{path}: {what} is not valid Z85") from None
    return text.encode()


def _read(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_KEY_FILE + 1)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such key file") from None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_KEY_FILE:
        raise KeyFileError(f"{path}: too large for a key file")
    try:
        return tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise KeyFileError(f"{path}: not a key file: {exc}") from None


def load_public(path: str | os.PathLike[str]) -> bytes:
    """The public key in a ``.key`` or ``.key_secret`` file."""
    path = Path(path)
    return _check_key(_read(path).get("public-key"), "public-key", path)


def load_pair(path: str | os.PathLike[str]) -> KeyPair:
    """A ``.key_secret`` file; its public key must belong to its secret key."""
    path = Path(path)
    data = _read(path)
    public = _check_key(data.get("public-key"), "public-key", path)
    secret = _check_key(data.get("secret-key"), "secret-key", path)
    if zmq.curve_public(secret) != public:
        raise KeyFileError(f"{path}: public-key does not belong to secret-key")
    mode = path.stat().st_mode & 0o077
    if mode:
        raise KeyFileError(f"{path}: readable by others (mode {path.stat().st_mode & 0o777:o}); "
                        "chmod 600 it")
    return KeyPair(public, secret)


def generate(directory: str | os.PathLike[str], name: str, *,
             overwrite: bool = False) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` in ``directory``; return both paths."""
    if not NAME.fullmatch(name):
        raise KeyFileError(f"{name!r}: a key name is letters, digits and ._:@+- (up to 128)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public_path = directory / f"{name}{PUBLIC_SUFFIX}"
    secret_path = directory / f"{name}{SECRET_SUFFIX}"
    if not overwrite and (public_path.exists() or secret_path.exists()):
        raise KeyFileError(f"{secret_path}: exists already (refusing to replace a key)")
    public, secret = zmq.curve_keypair()
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(f'{_comment(name)}public-key = "{public.decode()}"\n'
                 f'secret-key = "{secret.decode()}"\n')
    write_public(directory, name, public)
    return public_path, secret_path


def _comment(name: str) -> str:
    return f"# CurveZMQ key of {name}\n"


def write_public(directory: str | os.PathLike[str], name: str, public: bytes) -> Path:
    """File ``public`` as ``NAME.key`` (e.g. into a controller's allow-list)."""
    if not NAME.fullmatch(name):
        raise KeyFileError(f"{name!r}: a key name is letters, digits and ._:@+- (up to 128)")
    path = Path(directory) / f"{name}{PUBLIC_SUFFIX}"
    path.write_text(f'{_comment(name)}public-key = "{public.decode()}"\n')
    return path


def allowed_keys(directory: str | os.PathLike[str]) -> tuple[dict[bytes, str], list[str]]:
    """Public key -> name for every ``NAME.key`` in ``directory``, and the problems found.

    A malformed file, or a key filed under two names, is left out and reported,
    never fatal: one bad file must not lock every peer out.
    """
    keys: dict[bytes, str] = {}
    problems: list[str] = []
    directory = Path(directory)
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return keys, problems
    except OSError as exc:
        return keys, [f"{directory}: cannot list: {exc.strerror}"]
    for path in entries:
        if path.suffix != PUBLIC_SUFFIX or not path.is_file():
            continue
        name = path.name[: -len(PUBLIC_SUFFIX)]
        if not NAME.fullmatch(name):
            problems.append(f"{path}: not a valid name")
            continue
        try:
            public = load_public(path)
        except KeyFileError as exc:
            problems.append(str(exc))
            continue
        if public in keys:
            problems.append(f"{path}: the same key is also filed as {keys[public]!r}; "
                            "ignoring both")
            keys[public] = ""
            continue
        keys[public] = name
    return {k: v for k, v in keys.items() if v}, problems


def curve_client(sock: zmq.Socket, pair: KeyPair, server_public: bytes) -> None:
    """Make ``sock`` a CurveZMQ client of a server with ``server_public``."""
    sock.curve_secretkey = pair.secret
    sock.curve_publickey = pair.public
    sock.curve_serverkey = server_public
