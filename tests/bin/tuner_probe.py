"""One process, one NCCL release: what the plugin does to the channel count.

    tuner_probe.py DIR ABI VERSION FIND CASES

Makes a stand-in NCCL answering ``ncclGetVersion`` with VERSION ("none": no
NCCL found) visible the way FIND says ("global": in the global scope, as
when the program links NCCL; "logger": only through the address of NCCL's
logger, as when PyTorch loads NCCL privately), publishes a policy whose only
rule caps channels at each case's cap, and prints, as JSON, the channel
count the plugin leaves for each case ``[given, cap]`` of CASES (JSON).
The plugin asks its process's NCCL once, so each release needs a process.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from agent.plugin.layout import CommEntry, Policy, Pref, Rule, pseudo_comm_id
from agent.plugin.shm import PolicyFile, policy_path, prepare_dirs, prepare_job_dir
from testbed.plugin import FAKE_NCCL, VERSION_ENV, Rank

JOB = "probe"
COMM = 0x51DE0000000000C5


def main() -> int:
    directory, abi, version, find, cases = sys.argv[1:6]
    abi_n = int(abi)
    if version != "none":
        os.environ[VERSION_ENV] = version
    logger = None
    if find == "global" and version != "none":
        ctypes.CDLL(str(FAKE_NCCL), mode=ctypes.RTLD_GLOBAL)
    elif find == "logger" and version != "none":
        private = ctypes.CDLL(str(FAKE_NCCL), mode=ctypes.RTLD_LOCAL)
        logger = ctypes.cast(private.hz_fake_nccl_log, ctypes.c_void_p).value
    prepare_dirs(directory)
    prepare_job_dir(directory, JOB, None)
    key = COMM if abi_n >= 5 else pseudo_comm_id(8, 2)
    results = []
    for given, cap in json.loads(cases):
        rules = (Rule(prefs=(Pref(None, None),), max_channels=cap),)
        with PolicyFile(policy_path(directory, JOB)) as handle:
            handle.write(Policy(1, (CommEntry(key, 0, None, 0, revision=len(results) + 1),),
                                (rules,)))
        rank = Rank(COMM, 8, 2, job=JOB, directory=directory, abi=abi_n, logger=logger)
        _, channels = rank.raw(4, 4 << 20, ((1.0, 2.0, 3.0),) * 7, given)
        rank.close()
        results.append(channels)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
