"""Naming OS threads, so ``top -H`` and /proc show which part of a daemon is busy."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util

_PR_SET_NAME = 15
_libc: ctypes.CDLL | None = None


def set_os_thread_name(name: str) -> None:
    """Name the calling thread (Linux keeps 15 bytes); failure is harmless."""
    global _libc  # noqa: PLW0603 - loaded once, on first use
    with contextlib.suppress(OSError, AttributeError):
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
