"""Generic eBPF probing: is bcc installed, are kernel headers present, where are the C sources.

Shared by every domain that loads eBPF (the link counters, the traffic shaper); each
failure is one clear sentence in :class:`BpfUnavailable`.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path


class BpfUnavailable(Exception):
    """The eBPF datapath cannot run here; the message says why in one line."""


def default_bpf_dir() -> Path:
    """Where the C sources are: next to the package, or where an install put them."""
    candidates = [
        os.environ.get("HARMONAIZE_BPF_DIR", ""),
        str(Path(__file__).resolve().parents[2] / "bpf"),
        "/usr/share/harmonaize/bpf",
        "/usr/local/share/harmonaize/bpf",
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "link_counters.c").is_file():
            return Path(candidate)
    return Path(candidates[1])


def headers_present() -> bool:
    if os.environ.get("BCC_KERNEL_SOURCE"):
        return True
    release = platform.release()
    return (Path("/lib/modules") / release / "build").exists() or Path(
        "/sys/kernel/kheaders.tar.xz"
    ).exists()


def bcc_present() -> bool:
    """Whether bcc's Python module is importable (Debian package python3-bpfcc)."""
    return importlib.util.find_spec("bcc") is not None
