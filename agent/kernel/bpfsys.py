"""The few bpf(2) map commands the agent needs, straight through the syscall.

The daemon holds map file descriptors it received from the loader process
(see :mod:`agent.kernel.bpfload`) and reads them here, so neither bcc nor LLVM
is ever mapped into it. ``union bpf_attr`` layouts are those of the kernel's
UAPI ``linux/bpf.h`` for each command.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
from dataclasses import dataclass
from pathlib import Path

_NR_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), 321)
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_MAP_LOOKUP_BATCH = 24
BPF_OBJ_GET_INFO_BY_FD = 15
PERCPU_TYPES = {5, 6, 10}  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _ElemAttr(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("key", ctypes.c_uint64), ("value", ctypes.c_uint64),
                ("flags", ctypes.c_uint64)]


class _BatchAttr(ctypes.Structure):
    _fields_ = [("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64),
                ("keys", ctypes.c_uint64), ("values", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
                ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]


class _MapInfo(ctypes.Structure):
    # The head of struct bpf_map_info: the kernel fills what fits in info_len.
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16)]


class _ProgInfo(ctypes.Structure):
    # The head of struct bpf_prog_info, up to the run statistics the kernel keeps while
    # kernel.bpf_stats_enabled is set.
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("tag", ctypes.c_uint8 * 8), ("jited_prog_len", ctypes.c_uint32),
                ("xlated_prog_len", ctypes.c_uint32), ("jited_prog_insns", ctypes.c_uint64),
                ("xlated_prog_insns", ctypes.c_uint64), ("load_time", ctypes.c_uint64),
                ("created_by_uid", ctypes.c_uint32), ("nr_map_ids", ctypes.c_uint32),
                ("map_ids", ctypes.c_uint64), ("name", ctypes.c_char * 16),
                ("ifindex", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("netns_dev", ctypes.c_uint64), ("netns_ino", ctypes.c_uint64),
                ("nr_jited_ksyms", ctypes.c_uint32), ("nr_jited_func_lens", ctypes.c_uint32),
                ("jited_ksyms", ctypes.c_uint64), ("jited_func_lens", ctypes.c_uint64),
                ("btf_id", ctypes.c_uint32), ("func_info_rec_size", ctypes.c_uint32),
                ("func_info", ctypes.c_uint64), ("nr_func_info", ctypes.c_uint32),
                ("nr_line_info", ctypes.c_uint32), ("line_info", ctypes.c_uint64),
                ("jited_line_info", ctypes.c_uint64), ("nr_jited_line_info", ctypes.c_uint32),
                ("line_info_rec_size", ctypes.c_uint32),
                ("jited_line_info_rec_size", ctypes.c_uint32),
                ("nr_prog_tags", ctypes.c_uint32), ("prog_tags", ctypes.c_uint64),
                ("run_time_ns", ctypes.c_uint64), ("run_cnt", ctypes.c_uint64)]


@dataclass(frozen=True)
class ProgStats:
    name: str
    #: Nanoseconds spent in the program and times it ran, while kernel.bpf_stats_enabled
    #: was set (the kernel counts nothing otherwise).
    run_time_ns: int
    run_cnt: int


def prog_stats(fd: int) -> ProgStats:
    """A loaded program's name and run statistics, from the kernel's record of it."""
    info = _ProgInfo()
    attr = _InfoAttr(fd, ctypes.sizeof(info), ctypes.addressof(info))
    error = _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    if error:
        raise OSError(error, f"BPF program info: {os.strerror(error)}")
    return ProgStats(info.name.decode(errors="replace"), info.run_time_ns, info.run_cnt)


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    result = _libc.syscall(_NR_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    return 0 if result >= 0 else ctypes.get_errno()


def possible_cpus() -> int:
    """Per-CPU map values hold one slot per *possible* CPU."""
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


def open_map(name: str, fd: int) -> BpfMap:
    """Describe a map we hold a descriptor to, from the kernel's own record of it."""
    info = _MapInfo()
    attr = _InfoAttr(fd, ctypes.sizeof(info), ctypes.addressof(info))
    error = _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    if error:
        raise OSError(error, f"BPF map {name}: {os.strerror(error)}")
    return BpfMap(name, fd, info.key_size, info.value_size, info.max_entries,
                  info.type in PERCPU_TYPES)


@dataclass
class BpfMap:
    """A map received as a file descriptor, with the sizes the loader reported."""

    name: str
    fd: int
    key_size: int
    value_size: int
    max_entries: int
    percpu: bool

    def __post_init__(self) -> None:
        self.ncpus = possible_cpus() if self.percpu else 1
        # Per-CPU values are padded to 8 bytes each.
        self.slot_size = (self.value_size + 7) // 8 * 8 if self.percpu else self.value_size
        self.value_buffer_size = self.slot_size * self.ncpus

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def lookup(self, key: bytes) -> bytes | None:
        value = ctypes.create_string_buffer(self.value_buffer_size)
        keybuf = ctypes.create_string_buffer(key, self.key_size)
        attr = _ElemAttr(self.fd, 0, ctypes.addressof(keybuf), ctypes.addressof(value), 0)
        return value.raw if _bpf(BPF_MAP_LOOKUP_ELEM, attr) == 0 else None

    def update(self, key: bytes, value: bytes) -> None:
        keybuf = ctypes.create_string_buffer(key, self.key_size)
        valbuf = ctypes.create_string_buffer(value, self.value_buffer_size)
        attr = _ElemAttr(self.fd, 0, ctypes.addressof(keybuf), ctypes.addressof(valbuf), 0)
        error = _bpf(BPF_MAP_UPDATE_ELEM, attr)
        if error:
            raise OSError(error, f"updating BPF map {self.name}: {os.strerror(error)}")

    def delete(self, key: bytes) -> None:
        """Remove a hash map's key (one that is not there is no error)."""
        keybuf = ctypes.create_string_buffer(key, self.key_size)
        attr = _ElemAttr(self.fd, 0, ctypes.addressof(keybuf), 0, 0)
        error = _bpf(BPF_MAP_DELETE_ELEM, attr)
        if error and error != errno.ENOENT:
            raise OSError(error, f"deleting from BPF map {self.name}: {os.strerror(error)}")

    def keys(self, limit: int = 1 << 16) -> list[bytes]:
        out: list[bytes] = []
        current = None
        following = ctypes.create_string_buffer(self.key_size)
        while len(out) < limit:
            keybuf = ctypes.create_string_buffer(current, self.key_size) if current else None
            attr = _ElemAttr(self.fd, 0, ctypes.addressof(keybuf) if keybuf else 0,
                             ctypes.addressof(following), 0)
            if _bpf(BPF_MAP_GET_NEXT_KEY, attr) != 0:
                break
            current = following.raw
            out.append(current)
        return out

    def lookup_batch(self, count: int) -> bytes | None:
        """Values of keys 0..count-1 of an array map, in one call (kernel 5.6+)."""
        keys = ctypes.create_string_buffer(self.key_size * count)
        values = ctypes.create_string_buffer(self.value_buffer_size * count)
        out_batch = ctypes.c_uint64(0)
        attr = _BatchAttr(0, ctypes.addressof(out_batch), ctypes.addressof(keys),
                          ctypes.addressof(values), count, self.fd, 0, 0)
        error = _bpf(BPF_MAP_LOOKUP_BATCH, attr)
        if error == 0 or attr.count == count:
            return values.raw
        return None

    def sum_percpu_u64(self, raw: bytes) -> int:
        """A per-CPU u64 value, added up over the CPUs."""
        return sum(memoryview(raw).cast("Q")[:: self.slot_size // 8])
