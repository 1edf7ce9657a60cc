"""A stand-in for one NCCL rank: the real tuner plugin, driven as NCCL drives it.

    nccl_rank.py LIBRARY COMM_ID N_RANKS N_NODES RATE OUT

Loads the plugin, initialises a v5 context for communicator COMM_ID (NCCL's
commId, the same on every rank) and issues RATE allreduces of 4 MiB per
second until SIGTERM, each through getCollInfo with a cost table as NCCL
builds it (Tree and Ring enabled with LL, LL128 and Simple; Ring/LL cheapest,
so that is NCCL's own choice). Each time the outcome changes it appends
"INDEX ALGO PROTO CHANNELS" to OUT: the collective index from which the
plugin's answer (the cheapest enabled entry after it ran, and nChannels)
was different. The environment names the job (HARMONAIZE_JOB) and the policy
directory (HARMONAIZE_TUNER_DIR), as a launcher would.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import time

INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64,
                        ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                        ctypes.c_void_p)
COLLINFO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                            ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                            ctypes.c_int, ctypes.POINTER(ctypes.c_int))
FINALIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class TunerV5(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT), ("getCollInfo", COLLINFO),
                ("finalize", FINALIZE)]


ALLREDUCE = 4
NBYTES = 4 << 20
ALGOS = ("tree", "ring", "collnet-direct", "collnet-chain", "nvls", "nvls-tree", "pat")
PROTOS = ("ll", "ll128", "simple")
TABLE = [[18.5, 22.0, 41.0], [15.0, 19.5, 38.0], *([[-1.0] * 3] * 5)]


def main() -> int:
    library, comm, ranks, nodes, rate, out = sys.argv[1:7]
    tuner = TunerV5.in_dll(ctypes.CDLL(library), "ncclTunerPlugin_v5")
    context = ctypes.c_void_p()
    if tuner.init(ctypes.byref(context), int(comm, 0), int(ranks), int(nodes), None, None,
                  None) != 0:
        return 1
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    period = 1.0 / float(rate)
    flat = [v for row in TABLE for v in row]
    last = None
    n = 0
    deadline = time.monotonic()
    with open(out, "a", buffering=1) as log:
        while not stop:
            array = (ctypes.c_float * len(flat))(*flat)
            channels = ctypes.c_int(0)
            rc = tuner.getCollInfo(context, ALLREDUCE, NBYTES, 1, ctypes.cast(array,
                                   ctypes.c_void_p), 7, 3, 0, ctypes.byref(channels))
            if rc != 0:
                log.write(f"{n} error {rc}\n")
                return 1
            best = min((v, i) for i, v in enumerate(array) if v >= 0)[1]
            outcome = (ALGOS[best // 3], PROTOS[best % 3], channels.value)
            if outcome != last:
                log.write(f"{n} {outcome[0]} {outcome[1]} {outcome[2]}\n")
                last = outcome
            n += 1
            deadline += period
            time.sleep(max(0.0, deadline - time.monotonic()))
    tuner.finalize(context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
