"""Real NCCL under PyTorch with the HarmonAIze tuner plugin: a check for GPU machines.

    torchrun --nproc_per_node=N tests/bin/nccl_torch.py DIR JOB SECONDS

Every rank issues 4 MiB allreduces for SECONDS. Rank 0, as root, plays the
agent: once the ranks' stats files name the communicator, it writes a policy
that switches it (Simple protocol, 4 channels) at a collective a couple of
seconds ahead, armed and then confirmed, as the agent does; at the end it
prints what the stats files say (collectives counted by getCollInfo, the
switch index of every rank, the NCCL release the plugin found). With one GPU
NCCL runs a one-rank communicator without consulting any tuner: the plugin
is loaded and initialised but counts no collectives.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import torch
import torch.distributed as dist

from agent.plugin.layout import Pref, Proto, Rule
from agent.plugin.shm import PolicyFile, policy_path, read_stats
from agent.tuning.loop import Entry, build_policy


def main() -> int:
    directory, job, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    data = torch.ones(1 << 20, device="cuda")  # 4 MiB of float32
    rules = (Rule(prefs=(Pref(None, Proto.SIMPLE),), max_channels=4),)
    began, written, count = time.monotonic(), 0, 0
    while time.monotonic() - began < seconds:
        dist.all_reduce(data)
        count += 1
        if rank == 0 and count % 200 == 0:
            torch.cuda.synchronize()
            slots = read_stats(directory, job)
            if slots and written < 2:
                comm = slots[0].comm_id
                at = max(s.collectives for s in slots) + 4000
                for step, pending in ((1, True), (2, False)):
                    with PolicyFile(policy_path(directory, job)) as handle:
                        handle.write(build_policy([Entry(comm, at, "default", "probe", (), rules,
                                                         step, pending)], step))
                written = 2
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        slots = read_stats(directory, job)
        print(json.dumps({"world": world, "allreduces": count, "slots": [
            {"pid": s.pid, "comm": f"{s.comm_id:#x}", "collectives": s.collectives,
             "revision": s.revision, "switches": s.switches, "last_switch": s.last_switch,
             "nccl": s.nccl_version} for s in slots]}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
