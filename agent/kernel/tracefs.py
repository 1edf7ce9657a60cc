"""Tracepoint formats from tracefs: field offsets and symbolic value names.

The eBPF programs read tracepoint arguments at offsets taken from here and
passed as cflags, so they compile against UAPI headers only and follow
whatever layout the running kernel has.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TRACEFS_ROOTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")

_FIELD = re.compile(
    r"field:(?P<decl>[^;]+);\s*offset:(?P<offset>\d+);\s*size:(?P<size>\d+);"
)
_SYMBOL = re.compile(r"\{\s*(-?\d+)\s*,\s*\"([A-Za-z0-9_]+)\"\s*\}")


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class Format:
    fields: dict[str, Field]
    print_fmt: str

    def offset(self, name: str) -> int | None:
        field = self.fields.get(name)
        return field.offset if field else None

    def symbols(self, field: str) -> dict[int, str]:
        """Names of a field's values from ``__print_symbolic(REC->field, {v, "NAME"}, ...)``."""
        marker = f"__print_symbolic(REC->{field},"
        start = self.print_fmt.find(marker)
        if start < 0:
            return {}
        depth, end = 0, len(self.print_fmt)
        for i in range(start, len(self.print_fmt)):
            ch = self.print_fmt[i]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    end = i
                    break
        return {int(v): name for v, name in _SYMBOL.findall(self.print_fmt[start:end])}


def parse_format(text: str) -> Format:
    fields = {}
    for match in _FIELD.finditer(text):
        decl = match["decl"].strip()
        name = re.sub(r"\[.*\]$", "", decl.split()[-1]).lstrip("*")
        fields[name] = Field(name, int(match["offset"]), int(match["size"]))
    _, _, print_fmt = text.partition("print fmt:")
    return Format(fields, print_fmt.strip())


def tracefs_root(roots: tuple[str, ...] = TRACEFS_ROOTS) -> Path | None:
    for root in roots:
        if (Path(root) / "events").is_dir():
            return Path(root)
    return None


def mount_tracefs(target: str = TRACEFS_ROOTS[0]) -> Path | None:
    """Mount tracefs where it is missing (a fresh /sys, e.g. under ``ip netns exec``)."""
    if os.geteuid() != 0 or not Path(target).is_dir():
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.mount(b"tracefs", target.encode(), b"tracefs", 0, None) != 0:
        log.debug("mounting tracefs on %s failed: %s", target, os.strerror(ctypes.get_errno()))
        return None
    log.info("mounted tracefs on %s", target)
    return tracefs_root()


def read_format(system: str, event: str, root: Path | None = None) -> Format | None:
    root = root or tracefs_root()
    if root is None:
        return None
    try:
        return parse_format((root / "events" / system / event / "format").read_text())
    except OSError:
        return None
