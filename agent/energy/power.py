"""GPU power limits through NVML, and the originals kept on disk until they are restored.

The energy loop (agent/energy/engine.py) decides; this module does its I/O. Every NVML
call is bounded (``call_timeout``, as the sampler's are) and runs on a worker thread
of its own, so the agent's loop never waits on the driver: the loop submits requests
and collects their outcomes at its next look.

Before a GPU's limit is first lowered, its original limit is written to
``<state_dir>/energy.json`` (written to a new file, flushed to disk, renamed over
the old one, the directory flushed too). It stays there until the GPU is back at
it; an agent that was killed leaves it, and the next one puts every GPU in it back
at start. A GPU whose restore fails stays in the file, to be tried again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from agent.energy.engine import PowerInfo, ReadPower, SetLimit
from agent.kernel.nvml import bounded
from harmonaize.logs import one_line
from harmonaize.threads import set_os_thread_name

log = logging.getLogger("harmonaize.agent")

FILE_VERSION = 1


def _nvml() -> Any:
    import pynvml  # noqa: PLC0415 - only where there are GPUs

    return pynvml


@dataclass(frozen=True)
class Saved:
    """A GPU's limit before the energy loop changed it."""

    uuid: str
    index: int
    original_mw: int


class Originals:
    """The originals file: what every GPU this agent lowered must go back to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.gpus: dict[str, Saved] = {}
        self.error = ""

    def load(self) -> dict[str, Saved]:
        """What a previous run left (an unreadable file is logged, kept and ignored)."""
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != FILE_VERSION:
                raise ValueError(f"version {data.get('version')!r}")
            self.gpus = {str(uuid): Saved(str(uuid), int(g["index"]), int(g["original_mw"]))
                         for uuid, g in data["gpus"].items()}
        except FileNotFoundError:
            self.gpus = {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self.error = f"{self.path}: unreadable ({one_line(exc)}): nothing restored from it"
            log.error("energy: %s", self.error)
            self.gpus = {}
        return dict(self.gpus)

    def put(self, saved: Saved) -> None:
        self.gpus[saved.uuid] = saved
        self._write()

    def remove(self, uuid: str) -> None:
        if self.gpus.pop(uuid, None) is not None:
            self._write()

    def _write(self) -> None:
        """Durably: a crash right after a limit is set must still find its original."""
        if not self.gpus:
            self.path.unlink(missing_ok=True)
            self._sync_dir()
            return
        data = {"version": FILE_VERSION, "gpus": {
            s.uuid: {"index": s.index, "original_mw": s.original_mw}
            for s in self.gpus.values()}}
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        self._sync_dir()

    def _sync_dir(self) -> None:
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


Request = ReadPower | SetLimit


class Outcome(NamedTuple):
    """What a request came to: PowerInfo for a read, None for a set, or the error's text."""

    request: Request
    info: PowerInfo | None
    error: str = ""
    #: The call did not return in time: it may still land (the driver has it).
    timed_out: bool = False


class PowerControl:
    """NVML power calls for the energy loop, on a worker thread, each bounded."""

    def __init__(self, originals: Originals, handles: Callable[[], Mapping[str, Any]],
                 call_timeout: float, on_done: Callable[[], None] = lambda: None) -> None:
        self.originals = originals
        self.handles = handles
        self.call_timeout = call_timeout
        self.on_done = on_done
        self.calls = 0
        self.errors = 0
        self._requests: queue.Queue[Request | None] = queue.Queue()
        self._outcomes: queue.Queue[Outcome] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvml-power", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> None:
        with self._lock:
            self._pending += 1
        self._requests.put(request)

    def idle(self) -> bool:
        """Nothing submitted is still waiting or running."""
        return self._pending == 0

    def outcomes(self) -> list[Outcome]:
        out = []
        while True:
            try:
                out.append(self._outcomes.get_nowait())
            except queue.Empty:
                return out

    def stop(self) -> None:
        """Finish what was submitted (each call bounded), then end the worker."""
        if self._thread is not None:
            self._requests.put(None)
            self._thread.join(timeout=self.call_timeout * (self._requests.qsize() + 2))
            self._thread = None

    def _run(self) -> None:
        set_os_thread_name("nvml-power")
        while (request := self._requests.get()) is not None:
            self._outcomes.put(self.execute(request))
            with self._lock:
                self._pending -= 1
            self.on_done()

    def execute(self, request: Request) -> Outcome:
        """One request, now, on the calling thread (the worker's, or the agent's at start
        and stop); never raises."""
        try:
            if isinstance(request, ReadPower):
                return Outcome(request, self.read(request.uuid))
            self.set_limit(request)
            return Outcome(request, None)
        except Exception as exc:
            self.errors += 1
            return Outcome(request, None, one_line(exc) or type(exc).__name__,
                           isinstance(exc, TimeoutError))

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.calls += 1
        return bounded(fn, self.call_timeout, *args)

    def _handle(self, uuid: str) -> Any:
        handle = self.handles().get(uuid)
        if handle is None:
            raise LookupError(f"no GPU {uuid} on this host now")
        return handle

    def read(self, uuid: str) -> PowerInfo:
        nvml = _nvml()
        handle = self._handle(uuid)
        low, high = self._call(nvml.nvmlDeviceGetPowerManagementLimitConstraints, handle)
        default = self._call(nvml.nvmlDeviceGetPowerManagementDefaultLimit, handle)
        saved = self.originals.gpus.get(uuid)
        # A limit a killed agent left (its restore failed) is not this GPU's own.
        current = saved.original_mw if saved is not None else self._call(
            nvml.nvmlDeviceGetPowerManagementLimit, handle)
        return PowerInfo(int(low), int(high), int(default), int(current))

    def set_limit(self, action: SetLimit) -> None:
        nvml = _nvml()
        handle = self._handle(action.uuid)
        if not action.restore and action.uuid not in self.originals.gpus:
            try:
                self.originals.put(Saved(action.uuid, action.index, action.original_mw))
            except OSError as exc:
                raise OSError(f"cannot keep the original limit on disk: "
                              f"{one_line(exc)}") from None
        self._call(nvml.nvmlDeviceSetPowerManagementLimit, handle, action.limit_mw)
        if action.restore:
            with contextlib.suppress(OSError):  # left in the file: tried again at start
                self.originals.remove(action.uuid)


def restore_left(control: PowerControl) -> list[tuple[Saved, str]]:
    """Put back every GPU a previous run left lowered; (saved, error) for those that
    could not be, which stay in the file."""
    failed = []
    for saved in sorted(control.originals.load().values(), key=lambda s: s.index):
        action = SetLimit(saved.index, saved.uuid, saved.original_mw, saved.original_mw, True,
                          "left by an agent that did not stop")
        error = control.execute(action).error
        if error:
            log.error("energy: gpu %d (%s): restoring %g W failed: %s", saved.index,
                      saved.uuid, saved.original_mw / 1000, error)
            failed.append((saved, error))
        else:
            log.warning("energy: gpu %d back at its own power limit %g W (the last agent "
                        "did not stop cleanly)", saved.index, saved.original_mw / 1000)
    return failed
