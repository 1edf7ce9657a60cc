"""Micro-level tuning: the policy the agent publishes to the NCCL tuner plugin
running inside tenant jobs, and the counters the plugin reports back."""

from agent.tuning.layout import Algo, Coll, CommEntry, Policy, Pref, Proto, Rule, StatsSlot, apply
from agent.tuning.shm import PolicyFile, read_policy, read_stats

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
