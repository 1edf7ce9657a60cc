"""The DCQCN parameters a RoCE NIC exposes, under both names, with what each one does.

Pure data, shared by the configuration (what an operator may name, what the NIC
takes), the congestion control loop (which way a parameter moves the sender)
and the I/O that reads and writes them. The two layouts hosts have:

* MLNX_OFED: ``/sys/class/net/<if>/ecn/roce_rp/<name>`` (reaction point: the
  sender) and ``.../roce_np/<name>`` (notification point: the receiver), plus
  ``.../roce_{rp,np}/enable/<priority>``;
* upstream mlx5: ``<debugfs>/mlx5/<pci function>/cc_params/<debugfs name>``,
  per PCI function, without per-priority enable files.

Ranges are what the NIC documents it takes; rates in Mb/s are bounded at
400 Gb/s. ``push`` says which way a larger value moves the sender: +1 toward
recovering its rate faster after a cut (higher throughput, longer queues), -1
toward caution, 0: the loop never steers it (it only keeps it within the
declared range), because its effect depends on the rest of the configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

LINE_RATE_MBPS = 400_000
U32_MAX = 2**32 - 1


@dataclass(frozen=True)
class Param:
    name: str
    #: "rp" (reaction point, the sender) or "np" (notification point, the receiver).
    point: str
    debugfs: str
    lo: int
    hi: int
    unit: str
    push: int
    #: Levels spread geometrically (the range spans orders of magnitude).
    geometric: bool
    meaning: str


_TABLE = (
    Param("rpg_ai_rate", "rp", "rp_ai_rate", 1, LINE_RATE_MBPS, "Mb/s", +1, True,
          "rate added at each additive-increase step"),
    Param("rpg_hai_rate", "rp", "rp_hai_rate", 1, LINE_RATE_MBPS, "Mb/s", +1, True,
          "rate added at each hyper-increase step"),
    Param("rpg_time_reset", "rp", "rp_time_reset", 1, 131071, "us", -1, True,
          "time between two rate-increase events"),
    Param("rpg_byte_reset", "rp", "rp_byte_reset", 1, 32767, "bytes", -1, True,
          "bytes sent between two rate-increase events"),
    Param("rpg_threshold", "rp", "rp_threshold", 1, 31, "events", -1, False,
          "rate-increase events before the next, faster phase"),
    Param("rate_reduce_monitor_period", "rp", "rp_rate_reduce_monitor_period", 0, U32_MAX,
          "us", +1, True, "least time between two rate reductions"),
    Param("initial_alpha_value", "rp", "rp_initial_alpha_value", 0, 1023, "1/1024", -1, False,
          "alpha (the share of the rate a cut takes, times two) at a flow's first CNP"),
    Param("rpg_max_rate", "rp", "rp_max_rate", 0, LINE_RATE_MBPS, "Mb/s", 0, False,
          "highest rate a flow is raised to (0: line rate)"),
    Param("rpg_min_rate", "rp", "rp_min_rate", 0, LINE_RATE_MBPS, "Mb/s", 0, False,
          "lowest rate a flow is cut to"),
    Param("rpg_min_dec_fac", "rp", "rp_min_dec_fac", 0, 100, "%", 0, False,
          "bound on the share of the rate one cut may take"),
    Param("rpg_gd", "rp", "rp_gd", 0, 15, "log2", 0, False,
          "gain between alpha and the cut"),
    Param("rate_to_set_on_first_cnp", "rp", "rp_rate_to_set_on_first_cnp", 0, LINE_RATE_MBPS,
          "Mb/s", 0, False, "rate a flow drops to at its first CNP (0: a normal cut)"),
    Param("dce_tcp_g", "rp", "rp_dce_tcp_g", 0, 1023, "1/1024", 0, False,
          "weight of the newest period in alpha's moving average"),
    Param("dce_tcp_rtt", "rp", "rp_dce_tcp_rtt", 1, 131071, "us", 0, False,
          "alpha's update period"),
    Param("clamp_tgt_rate", "rp", "rp_clamp_tgt_rate", 0, 1, "flag", 0, False,
          "every cut also lowers the target rate"),
    Param("clamp_tgt_rate_after_time_inc", "rp", "rp_clamp_tgt_rate_ati", 0, 1, "flag", 0,
          False, "the first cut after a timer increase lowers the target rate"),
    Param("min_time_between_cnps", "np", "np_min_time_between_cnps", 0, 4095, "us", +1, True,
          "least time between two CNPs the receiver sends a flow"),
    Param("cnp_dscp", "np", "np_cnp_dscp", 0, 63, "DSCP", 0, False, "DSCP of the CNPs sent"),
    Param("cnp_802p_prio", "np", "np_cnp_prio", 0, 7, "PCP", 0, False,
          "802.1p priority of the CNPs sent"),
)

CcParam = StrEnum("CcParam", [(p.name.upper(), p.name) for p in _TABLE])  # type: ignore[misc]
"""A parameter's name in the configuration: MLNX_OFED's sysfs file name."""

PARAMS: dict[str, Param] = {p.name: p for p in _TABLE}
STEERED = tuple(p.name for p in _TABLE if p.push)
POINTS = ("rp", "np")


def enable_knob(point: str, priority: int) -> str:
    """The name a per-priority enable flag goes by: ``rp_enable/3``."""
    return f"{point}_enable/{priority}"


def parse_enable_knob(knob: str) -> tuple[str, int] | None:
    point, sep, priority = knob.partition("_enable/")
    if not sep or point not in POINTS or not priority.isdigit() or int(priority) > 7:
        return None
    return point, int(priority)
