"""The NIC values congestion control changed, as they were before, kept on disk.

Each value is recorded before its first change and the file is made durable
(written to a temporary file, fsynced, renamed over, the directory fsynced), so
an agent killed at any moment leaves the originals of everything it changed.
The file goes once every value is back: at a clean stop, or at the next start
after a crash. A value that cannot be put back (the device is gone) stays in
the file for the next start to try again.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT = 1
MAX_BYTES = 1 << 20


class OriginalsError(ValueError):
    """The file is unreadable or not ours; the message says so in one line."""


@dataclass(frozen=True)
class Original:
    device: str
    knob: str
    #: The file the value was read from and is written back to.
    path: str
    value: int


class Originals:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[str, Original] = {}

    def load(self) -> list[Original]:
        """What a previous run left (empty if it left nothing); raises OriginalsError."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise OriginalsError(f"{self.path}: {exc.strerror or exc}") from None
        if len(raw) > MAX_BYTES:
            raise OriginalsError(f"{self.path}: larger than {MAX_BYTES} bytes: not ours")
        try:
            data = json.loads(raw)
            if data.get("format") != FORMAT:
                raise OriginalsError(f"{self.path}: format {data.get('format')!r}, "
                                     f"not {FORMAT}")
            found = [Original(str(v["device"]), str(v["knob"]), str(v["path"]), v["value"])
                     for v in data["values"]]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if isinstance(exc, OriginalsError):
                raise
            raise OriginalsError(f"{self.path}: not a file of original values ({exc})") \
                from None
        for original in found:
            if isinstance(original.value, bool) or not isinstance(original.value, int):
                raise OriginalsError(f"{self.path}: {original.knob}: value "
                                     f"{original.value!r} is not an integer")
        self.values = {o.path: o for o in found}
        return found

    def remember(self, original: Original) -> bool:
        """Record a value before its first change (a later one is not an original);
        durable when this returns. True if it was new."""
        if original.path in self.values:
            return False
        self.values[original.path] = original
        self._save()
        return True

    def forget(self, paths: list[str]) -> None:
        """These values are back: drop them (and the file once it is empty)."""
        for path in paths:
            self.values.pop(path, None)
        if self.values:
            self._save()
        else:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            _sync_dir(self.path.parent)

    def _save(self) -> None:
        payload = json.dumps({"format": FORMAT, "values": [asdict(v) for v in
                                                           self.values.values()]}, indent=1)
        temporary = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(payload.encode())
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        _sync_dir(self.path.parent)


def _sync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
