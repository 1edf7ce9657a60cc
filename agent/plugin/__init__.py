"""The NCCL tuner plugin's files, as the agent reads and writes them: the shared-memory
layout (policy, per-communicator stats), its I/O, and the hostile-file rules every
open under a job's directory follows. Used by tuning (policies out, stats in) and
energy (stats in)."""

from agent.plugin.layout import Algo, Coll, CommEntry, Policy, Pref, Proto, Rule, StatsSlot, apply
from agent.plugin.shm import PolicyFile, read_policy, read_stats

__all__ = [
    "Algo",
    "Coll",
    "CommEntry",
    "Policy",
    "PolicyFile",
    "Pref",
    "Proto",
    "Rule",
    "StatsSlot",
    "apply",
    "read_policy",
    "read_stats",
]
