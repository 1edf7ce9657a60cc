"""NVML, the driver's management library, loaded once and called with a time limit.

The kernel-facing layer the GPU and energy domains share: loading the library (or a
specific build of it), and calls that cannot stall their caller (a hung driver call
is left to a throwaway thread). No domain logic here.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: How a field value's union member is named, by its NVML value type.
VALUE_ATTRS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


class NvmlUnavailable(Exception):
    """No usable NVML here (no library, no driver, no GPUs)."""


def preload(library: str) -> None:
    """Load a specific libnvidia-ml.so.1 before pynvml does.

    pynvml opens the bare soname; the dynamic loader hands back an object
    already loaded under that soname, so this one is used.
    """
    try:
        ctypes.CDLL(library, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as exc:
        raise NvmlUnavailable(f"cannot load {library}: {exc}") from None


def bounded(fn: Callable[..., T], timeout: float, *args: Any) -> T:
    """Run ``fn`` on a throwaway thread; TimeoutError if it does not return in time."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="nvml-bounded", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        name = getattr(fn, "__name__", "NVML call")
        raise TimeoutError(f"{name} did not return in {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def nvml_module() -> Any:
    """The pynvml module (imported on first use)."""
    import pynvml  # noqa: PLC0415 - optional: a host without it has no GPUs to watch

    return pynvml
