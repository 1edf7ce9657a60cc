"""The real tuner plugin, driven from Python as NCCL drives it.

:class:`Rank` loads ``libnccl-tuner-harmonaize.so``, initialises one context
(a communicator's rank) through the ABI version asked for and calls
``getCollInfo`` with a cost table laid out as NCCL lays it out (a contiguous
``float[numAlgo][numProto]`` cast to ``float**``). The stand-in ranks of the
tests, the demo and the tuning campaign are built on it.

ctypes releases the GIL around each foreign call, so a rank that waits in
the plugin (at a switching point not yet confirmed) blocks only its own
thread.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "native" / "build" / "libnccl-tuner-harmonaize.so"
FAKE_NCCL = ROOT / "native" / "build" / "libnccl-fake.so"
VERSION_ENV = "HZ_FAKE_NCCL_VERSION"

ALGOS = ("tree", "ring", "collnet-direct", "collnet-chain", "nvls", "nvls-tree", "pat")
PROTOS = ("ll", "ll128", "simple")
ALLREDUCE = 4
#: A cost table as NCCL's model fills it for 4 MiB on a few nodes: Tree and Ring with
#: every protocol, the rest disabled (-1); Ring/LL is cheapest, so NCCL's own choice.
TABLE = ((18.5, 22.0, 41.0), (15.0, 19.5, 38.0), *((-1.0, -1.0, -1.0),) * 5)

LOGGER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int,
                          ctypes.c_char_p)
INIT_V3 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_void_p))
INIT_V5 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64,
                           ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p)
COLLINFO_V3 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                               ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                               ctypes.POINTER(ctypes.c_int))
COLLINFO_V4 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                               ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.POINTER(ctypes.c_int))
DESTROY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
CHUNK_SIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                              ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.POINTER(ctypes.c_size_t))


class TunerV3(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT_V3), ("getCollInfo", COLLINFO_V3),
                ("destroy", DESTROY)]


class TunerV4(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT_V3), ("getCollInfo", COLLINFO_V4),
                ("destroy", DESTROY)]


class TunerV5(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT_V5), ("getCollInfo", COLLINFO_V4),
                ("finalize", DESTROY)]


class TunerV6(ctypes.Structure):
    _fields_ = [*TunerV5._fields_, ("getChunkSize", CHUNK_SIZE)]


STRUCTS: dict[int, type[ctypes.Structure]] = {3: TunerV3, 4: TunerV4, 5: TunerV5, 6: TunerV6}

_libraries: dict[str, ctypes.CDLL] = {}


def load(library: str | os.PathLike[str] = LIBRARY) -> ctypes.CDLL:
    path = str(library)
    if path not in _libraries:
        _libraries[path] = ctypes.CDLL(path)
    return _libraries[path]


def load_fake_nccl(version: int | None) -> ctypes.CDLL:
    """Make a stand-in NCCL of ``version`` (e.g. 23203) visible to the plugin, in the
    global scope as NCCL itself is when linked by the program. Once per process:
    the plugin asks its NCCL once."""
    if version is not None:
        os.environ[VERSION_ENV] = str(version)
    return ctypes.CDLL(str(FAKE_NCCL), mode=ctypes.RTLD_GLOBAL)


@dataclass(frozen=True)
class Outcome:
    """What NCCL would run: the cheapest enabled entry after the plugin, and channels."""

    algo: str
    proto: str
    channels: int

    def __str__(self) -> str:
        return f"{self.algo} {self.proto} {self.channels}"


class Rank:
    """One tuner context: a rank of communicator ``comm`` in this process."""

    def __init__(self, comm: int, n_ranks: int, n_nodes: int, *, job: str | None,
                 directory: str | os.PathLike[str] | None, abi: int = 5,
                 library: str | os.PathLike[str] = LIBRARY, logger: int | None = None) -> None:
        # The plugin reads its environment at init, as it would in a launched rank.
        for name, value in (("HARMONAIZE_JOB", job), ("HARMONAIZE_TUNER_DIR", directory)):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = str(value)
        self.abi = abi
        self.tuner = STRUCTS[abi].in_dll(load(library), f"ncclTunerPlugin_v{abi}")
        self.context = ctypes.c_void_p()
        if abi >= 5:
            rc = self.tuner.init(ctypes.byref(self.context), comm, n_ranks, n_nodes, logger,
                                 None, None)
        else:
            rc = self.tuner.init(n_ranks, n_nodes, logger, ctypes.byref(self.context))
        if rc != 0:
            raise RuntimeError(f"plugin init returned {rc}")
        self.n = 0

    @property
    def inert(self) -> bool:
        return not self.context.value

    def raw(self, coll: int, nbytes: int, table: Sequence[Sequence[float]],
            channels: int = 0) -> tuple[list[list[float]], int]:
        """One getCollInfo: the table and channel count as the plugin left them."""
        num_algo, num_proto = len(table), len(table[0])
        array = (ctypes.c_float * (num_algo * num_proto))(*(v for row in table for v in row))
        nch = ctypes.c_int(channels)
        pointer = ctypes.cast(array, ctypes.c_void_p)
        if self.abi == 3:
            rc = self.tuner.getCollInfo(self.context, coll, nbytes, 1, pointer, num_algo,
                                        num_proto, ctypes.byref(nch))
        else:
            rc = self.tuner.getCollInfo(self.context, coll, nbytes, 1, pointer, num_algo,
                                        num_proto, 0, ctypes.byref(nch))
        if rc != 0:
            raise RuntimeError(f"getCollInfo returned {rc}")
        self.n += 1
        values = list(array)
        return [values[a * num_proto:(a + 1) * num_proto] for a in range(num_algo)], nch.value

    def call(self, coll: int = ALLREDUCE, nbytes: int = 4 << 20,
             table: Sequence[Sequence[float]] = TABLE, channels: int = 0) -> Outcome:
        out, nch = self.raw(coll, nbytes, table, channels)
        flat = [v for row in out for v in row]
        best = min((v, i) for i, v in enumerate(flat) if v >= 0)[1]
        num_proto = len(table[0])
        return Outcome(ALGOS[best // num_proto], PROTOS[best % num_proto], nch)

    def stepper(self, coll: int = ALLREDUCE, nbytes: int = 4 << 20,
                table: Sequence[Sequence[float]] = TABLE) -> Stepper:
        """A cheaper way to issue many identical collectives (see :class:`Stepper`)."""
        return Stepper(self, coll, nbytes, table)

    def close(self) -> None:
        if self.context.value:
            fini = self.tuner.destroy if self.abi <= 4 else self.tuner.finalize
            fini(self.context)
            self.context = ctypes.c_void_p()


class Stepper:
    """Issues one kind of collective again and again, with the least Python per call:
    the cost table is restored from a template and the plugin's answer found by
    comparing bytes. ``step()`` returns a key that changes exactly when the answer
    does; :meth:`outcome` turns a key back into an :class:`Outcome`."""

    def __init__(self, rank: Rank, coll: int, nbytes: int,
                 table: Sequence[Sequence[float]]) -> None:
        self.rank = rank
        self.num_algo, self.num_proto = len(table), len(table[0])
        flat = [v for row in table for v in row]
        self.template = (ctypes.c_float * len(flat))(*flat)
        self.size = ctypes.sizeof(self.template)
        self.clean = bytes(self.template)
        self.array = (ctypes.c_float * len(flat))()
        self.pointer = ctypes.cast(self.array, ctypes.c_void_p)
        self.nch = ctypes.c_int(0)
        self.nch_ref = ctypes.byref(self.nch)
        self.coll, self.nbytes = coll, nbytes
        self.flat = flat
        fn = rank.tuner.getCollInfo
        context = rank.context
        if rank.abi == 3:
            self._call = lambda: fn(context, coll, nbytes, 1, self.pointer, self.num_algo,
                                    self.num_proto, self.nch_ref)
        else:
            self._call = lambda: fn(context, coll, nbytes, 1, self.pointer, self.num_algo,
                                    self.num_proto, 0, self.nch_ref)

    def step(self) -> tuple[bytes, int]:
        ctypes.memmove(self.array, self.template, self.size)
        self.nch.value = 0
        if self._call() != 0:
            raise RuntimeError("getCollInfo returned an error")
        self.rank.n += 1
        return bytes(self.array), self.nch.value

    def outcome(self, key: tuple[bytes, int]) -> Outcome:
        raw, channels = key
        values = ctypes.cast(raw, ctypes.POINTER(ctypes.c_float))
        flat = [values[i] for i in range(len(self.flat))]
        best = min((v, i) for i, v in enumerate(flat) if v >= 0)[1]
        return Outcome(ALGOS[best // self.num_proto], PROTOS[best % self.num_proto], channels)
