"""The tuning loop's settings (``[tuning]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from harmonaize.config import AbsPath
from harmonaize.schema import Fraction, Ident, Len, Num


@dataclass(frozen=True)
class TuningSection:
    """The micro-level loop: NCCL policies for declared jobs, and bulk traffic classes."""

    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    #: Policies for the NCCL tuner plugin (and each job's next-launch NCCL file) go here;
    #: the plugin reads HARMONAIZE_TUNER_DIR, default the same path.
    policy_dir: AbsPath = "/run/harmonaize/tuner"
    #: At most this many choice changes per job and minute.
    max_changes_per_minute: Annotated[int, Num(1, 600)] = 6
    #: Seconds a calmer link level must last before a job's choice steps down.
    hold: Annotated[float, Num(0.0, 3600.0)] = 5.0
    #: A change activates this many seconds of a communicator's collectives ahead ...
    activation_lead: Annotated[float, Num(0.0, 60.0)] = 0.5
    #: ... and at least this many collectives ahead.
    activation_margin: Annotated[int, Num(1, 1_000_000)] = 64
    #: Seconds between reports to the controller for a job spanning hosts (progress
    #: and switch records; a change is reported at once).
    report_interval: Annotated[float, Num(0.1, 3600.0)] = 1.0
    #: A communicator none of whose ranks is seen for this long is forgotten.
    stall: Annotated[float, Num(0.1, 3600.0)] = 10.0
    #: Link classes whose congestion drives the choice.
    link_classes: Annotated[tuple[Ident, ...], Len(16, min_len=1)] = ("data",)
    #: Keep collectives ahead of declared bulk traffic with HTB on these link classes.
    htb: bool = True
    htb_link_classes: Annotated[tuple[Ident, ...], Len(16)] = ("data",)
    #: Share of a shaped link the collectives keep however large the bulk floors.
    collective_share: Annotated[float, Num(0.01, 1.0)] = 0.1
    #: Share of a shaped link one job's bulk floor may keep at most, whatever it declares
    #: (the floors also share what the collectives leave max-min fairly).
    bulk_floor_max_share: Annotated[float, Num(0.001, 1.0)] = 0.5
    #: NCCL_IB_TC recommended for the next launch (the fabric's class for
    #: collectives); -1: none.
    ib_traffic_class: Annotated[int, Num(-1, 255)] = -1
    #: Next-launch recommendations for congestion once a job was congested this share
    #: of the time.
    congested_share: Fraction = 0.2
    #: Seconds after a start before files of jobs nobody declared again are removed.
    orphan_grace: Annotated[float, Num(0.0, 86400.0)] = 60.0
    #: A job's stats files (the plugin writes one per rank process) considered at most;
    #: more are counted (``harmonctl jobs``) and ignored ...
    stats_files_per_job: Annotated[int, Num(1, 4096)] = 256
    #: ... and at most this many of one uid (a file admitted once stays admitted).
    stats_files_per_uid: Annotated[int, Num(1, 4096)] = 64
    #: Stats files of a job read per look at most; the others in turn at the next looks.
    stats_files_per_pass: Annotated[int, Num(1, 4096)] = 32
    #: Reads of a stats file whose slot stays mid-update before the slot counts as stale
    #: (no waiting between them).
    stats_seqlock_tries: Annotated[int, Num(1, 64)] = 4
