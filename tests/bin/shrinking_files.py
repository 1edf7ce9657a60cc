"""One rank whose policy or stats file is truncated in place underneath it.

    shrinking_files.py DIR WHAT SIZE

WHAT is ``policy`` or ``stats``; SIZE the length the file is cut to. WHAT
``elsewhere`` cuts a file this program mapped itself and reads it: that fault
is not the plugin's to absorb, and must still end the process with SIGBUS. Prints, as
JSON, the choice the rank follows before the cut, right after it, after the
index-tied rechecks, and after a new policy is published by rename; and how
many stats files the job directory holds at the end. Runs in its own process
because a fault here (SIGBUS) would kill whoever runs it.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from agent.plugin.shm import job_dir, policy_path, prepare_dirs, prepare_job_dir
from tests.plugin.test_tuner_abi import (
    COMM,
    JOB,
    LIBRARY,
    RING_LL128,
    TREE_SIMPLE,
    choice,
    listed,
    opened,
    publish,
)


def main() -> int:
    directory, what, size = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    prepare_dirs(directory)
    prepare_job_dir(directory, JOB, None)
    lib = ctypes.CDLL(str(LIBRARY))
    publish(directory, listed(COMM, None, 0, 0, TREE_SIMPLE))
    out: dict[str, object] = {}
    if what == "elsewhere":
        with opened(lib, 5, directory) as ctx:
            choice(ctx)  # the plugin's handler is in place
            other = directory / "other"
            other.write_bytes(b"x" * 8192)
            with other.open("r+b") as f:
                view = mmap.mmap(f.fileno(), 8192)
                os.truncate(other, size)
                print(view[4096], flush=True)  # faults: nothing of the plugin's
        return 0
    with opened(lib, 5, directory) as ctx:
        out["before"] = choice(ctx)
        ctx.calls(10)
        target = (policy_path(directory, JOB) if what == "policy"
                  else next(job_dir(directory, JOB).glob("*.stats")))
        os.truncate(target, size)
        out["cut"] = choice(ctx)
        ctx.calls(2 * 1024)  # index-tied rechecks: the torn mapping is dropped
        out["rechecked"] = choice(ctx)
        publish(directory, listed(COMM, 0, 1, ctx.n + 1500, TREE_SIMPLE, RING_LL128,
                                  revision=2))  # past the next replaced-file recheck
        ctx.calls(2 * 1024)
        out["republished"] = choice(ctx)
        out["stats_files"] = len(list(job_dir(directory, JOB).glob("*.stats")))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
