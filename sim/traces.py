"""Loaders for the public traces the simulator replays, with validation and subsetting.

Two formats:

* a **job trace** CSV, the format ``docs/privacy-utility.md`` documents ("The job trace
  format"): a header row naming at least ``timestamp, duration, num_gpus, gpu_time,
  cluster`` in any order (other columns are ignored), then one job per row.
  ``timestamp`` is the submission time, an ISO 8601 date-time (one with a UTC offset is
  taken in UTC) or seconds on any origin; ``duration`` the seconds the job ran (> 0);
  ``num_gpus`` a whole number >= 1; ``gpu_time`` must equal ``duration * num_gpus`` (a
  check that the columns were not shifted); ``cluster`` names the job's pool (a virtual
  cluster). Philly as the Sia artifact ships it is in this format; ``sim.convert`` writes
  other public traces in it.
* a node fault trace in InfiniteHBD's JSON shape: a list of records ``{node_id,
  event_time (days), event_type: fault_start|fault_end, fault_type: {Level, Class, Desc}}``.

Both loaders treat the file as untrusted: the first bad line or record raises
:class:`TraceError` naming the file, the line (CSV) or record index (JSON) and the field.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

#: The public traces, kept in ``shared/data/traces`` beside the repository.
TRACE_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
PHILLY_JOBS = TRACE_DIR / "philly_sia_jobs.csv"
INFINITEHBD_FAULTS = TRACE_DIR / "infinitehbd_fault_trace.json"

JOB_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]*\Z")
_EPOCH = datetime(1970, 1, 1)
DAY = 86400.0


class TraceError(ValueError):
    """A trace file is malformed; the message names the file, line or record, and field."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job as the trace gives it, on the simulation clock (seconds from the trace start)."""

    index: int
    arrival: float
    #: Wall seconds the job ran in the trace, at its requested size: its work.
    duration: float
    gpus: int
    pool: str
    #: Owner; None lets the scenario assign one (the Philly trace names no users).
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """One node fault from the trace, start to end, in days from the trace start."""

    node: str
    start_day: float
    end_day: float
    level: str
    fault_class: str
    desc: str
    #: True when the trace has no fault_end for it (it ends with the trace).
    open_ended: bool = False


@dataclass(frozen=True)
class FaultTrace:
    records: tuple[FaultRecord, ...]
    #: The trace's last event time, in days: its span.
    span_days: float

    @property
    def nodes(self) -> list[str]:
        return sorted({r.node for r in self.records})


# --- job traces -------------------------------------------------------------------------


def _number(raw: str, where: str, field: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{where}: field {field!r}: expected a number, got {raw!r:.40}") from None
    if not math.isfinite(value):
        raise TraceError(f"{where}: field {field!r}: expected a finite number, got {raw!r:.40}")
    return value


def timestamp(raw: str, where: str) -> float:
    """Seconds since the epoch from an ISO 8601 date-time or a number of seconds."""
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        pass
    else:
        if when.tzinfo is not None:  # an offset: the same instant in UTC, naive
            when = when.astimezone(UTC).replace(tzinfo=None)
        return (when - _EPOCH).total_seconds()
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{where}: field 'timestamp': expected an ISO date-time or seconds, "
                         f"got {raw!r:.40}") from None
    if not math.isfinite(value):
        raise TraceError(f"{where}: field 'timestamp': expected a finite time, got {raw!r:.40}")
    return value


RawJob = tuple[float, float, int, str]


def parse_job_rows(rows: Iterable[Sequence[str]], source: str) -> list[RawJob]:
    """Validate CSV rows (the header first) into (absolute time, duration, gpus, pool)."""
    it = iter(rows)
    header = next(it, None)
    if header is None:
        raise TraceError(f"{source}: empty file, expected a header {','.join(JOB_COLUMNS)}")
    names = tuple(h.strip() for h in header)
    missing = [c for c in JOB_COLUMNS if c not in names]
    if missing:
        raise TraceError(f"{source}:1: header lacks column(s) {', '.join(missing)}")
    col = {c: names.index(c) for c in JOB_COLUMNS}
    width = len(names)
    out = []
    for line, row in enumerate(it, start=2):
        if not row:
            continue  # blank line
        where = f"{source}:{line}"
        if len(row) != width:
            raise TraceError(f"{where}: expected {width} fields, got {len(row)}")
        stamp = timestamp(row[col["timestamp"]].strip(), where)
        duration = _number(row[col["duration"]], where, "duration")
        if duration <= 0:
            raise TraceError(f"{where}: field 'duration': must be positive, got {duration:g}")
        gpus_f = _number(row[col["num_gpus"]], where, "num_gpus")
        if gpus_f < 1 or gpus_f != int(gpus_f):
            raise TraceError(f"{where}: field 'num_gpus': expected a positive whole number, "
                             f"got {row[col['num_gpus']]!r:.40}")
        gpus = int(gpus_f)
        gpu_time = _number(row[col["gpu_time"]], where, "gpu_time")
        if abs(gpu_time - duration * gpus) > max(1.0, 1e-6 * gpu_time):
            raise TraceError(f"{where}: field 'gpu_time': {gpu_time:g} is not duration * num_gpus "
                             f"= {duration * gpus:g}")
        pool = row[col["cluster"]].strip()
        if not POOL_NAME.match(pool) or len(pool) > 64:
            raise TraceError(f"{where}: field 'cluster': expected a name of letters, digits and "
                             f"._:@+-, got {pool!r:.40}")
        out.append((stamp, duration, gpus, pool))
    return out


@dataclass(frozen=True)
class JobTraceOptions:
    """Which part of a job trace to replay, and how to stretch it in time."""

    #: Keep jobs arriving in [start_day, start_day + days) after the first arrival.
    start_day: float = 0.0
    days: float | None = None
    #: Keep only these pools (virtual clusters); None: all.
    pools: tuple[str, ...] | None = None
    #: Keep each job with this probability (seeded), after the window.
    sample: float = 1.0
    #: Then keep at most this many (the earliest).
    max_jobs: int | None = None
    #: Multiply arrival times (after the window): below 1 packs arrivals closer (more load).
    arrival_scale: float = 1.0
    #: Multiply durations.
    duration_scale: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.sample <= 1.0:
            raise ValueError("sample must be in (0, 1]")
        if self.arrival_scale <= 0 or self.duration_scale <= 0:
            raise ValueError("time scales must be positive")
        if self.days is not None and self.days <= 0:
            raise ValueError("days must be positive")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ValueError("max_jobs must be at least 1")


def select_jobs(raw: list[RawJob],
                opts: JobTraceOptions | None = None) -> list[JobSpec]:
    """Apply the window, pool filter, sampling and scaling; times start at 0, sorted by arrival."""
    opts = opts or JobTraceOptions()
    if not raw:
        return []
    # Stable order: by time, then the file's order, so equal timestamps replay as written.
    order = sorted(range(len(raw)), key=lambda i: raw[i][0])
    origin = raw[order[0]][0] + opts.start_day * DAY
    end = None if opts.days is None else origin + opts.days * DAY
    pools = None if opts.pools is None else set(opts.pools)
    rng = random.Random(f"{opts.seed}:sample")
    kept = []
    for i in order:
        stamp, duration, gpus, pool = raw[i]
        if stamp < origin or (end is not None and stamp >= end):
            continue
        if pools is not None and pool not in pools:
            continue
        if opts.sample < 1.0 and rng.random() >= opts.sample:
            continue
        kept.append((stamp - origin, duration, gpus, pool))
        if opts.max_jobs is not None and len(kept) >= opts.max_jobs:
            break
    return [JobSpec(n, t * opts.arrival_scale, d * opts.duration_scale, g, p)
            for n, (t, d, g, p) in enumerate(kept)]


def read_jobs(path: Path | str = PHILLY_JOBS) -> list[RawJob]:
    """Read and validate a job trace CSV (the whole file), without selecting from it."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            return parse_job_rows(csv.reader(f), path.name)
    except OSError as exc:
        raise TraceError(f"{path.name}: cannot read: {exc.strerror or exc}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise TraceError(f"{path.name}: not a readable CSV file: {exc}") from None


def load_jobs(path: Path | str = PHILLY_JOBS, opts: JobTraceOptions | None = None) -> list[JobSpec]:
    """Read a job trace in the documented CSV format; see :class:`JobTraceOptions`."""
    return select_jobs(read_jobs(path), opts)


def sizing_jobs(raw: list[RawJob], opts: JobTraceOptions | None = None) -> list[JobSpec]:
    """The jobs a cluster is sized for: the same selection at the trace's own arrival
    times. Scaling arrivals then changes the load on the cluster, not the cluster."""
    opts = opts or JobTraceOptions()
    return select_jobs(raw, replace(opts, arrival_scale=1.0))


def with_tenants(jobs: Sequence[JobSpec], tenants: Sequence[str], seed: int) -> list[JobSpec]:
    """Give every job without an owner one of ``tenants``, uniformly and reproducibly."""
    rng = random.Random(f"{seed}:tenants")
    return [j if j.tenant is not None else replace(j, tenant=tenants[rng.randrange(len(tenants))])
            for j in jobs]


# --- fault traces -----------------------------------------------------------------------

FAULT_EVENTS = ("fault_start", "fault_end")
FAULT_TYPE_FIELDS = ("Level", "Class", "Desc")


def parse_fault_records(data: object, source: str) -> FaultTrace:
    """Validate the decoded JSON and pair each fault_end with its node's open fault_start."""
    if not isinstance(data, list):
        raise TraceError(f"{source}: expected a JSON list of fault events")
    open_faults: dict[tuple[str, str, str, str], list[tuple[float, int]]] = {}
    done: list[tuple[int, FaultRecord]] = []
    span = 0.0
    for index, rec in enumerate(data):
        where = f"{source}: record {index}"
        if not isinstance(rec, dict):
            raise TraceError(f"{where}: expected an object")
        for name in ("node_id", "event_time", "event_type", "fault_type"):
            if name not in rec:
                raise TraceError(f"{where}: field {name!r} is missing")
        node = rec["node_id"]
        if not isinstance(node, str) or not node or len(node) > 256:
            raise TraceError(f"{where}: field 'node_id': expected a non-empty string")
        when = rec["event_time"]
        if (isinstance(when, bool) or not isinstance(when, int | float)
                or not math.isfinite(when) or when < 0):
            raise TraceError(f"{where}: field 'event_time': expected days >= 0, got {when!r:.40}")
        kind = rec["event_type"]
        if kind not in FAULT_EVENTS:
            raise TraceError(f"{where}: field 'event_type': expected fault_start or fault_end, "
                             f"got {kind!r:.40}")
        ftype = rec["fault_type"]
        if not isinstance(ftype, dict):
            raise TraceError(f"{where}: field 'fault_type': expected an object with "
                             f"{', '.join(FAULT_TYPE_FIELDS)}")
        for name in FAULT_TYPE_FIELDS:
            value = ftype.get(name)
            if not isinstance(value, str) or not value or len(value) > 256:
                raise TraceError(f"{where}: field 'fault_type.{name}': expected a non-empty string")
        key = (node, ftype["Level"], ftype["Class"], ftype["Desc"])
        span = max(span, float(when))
        if kind == "fault_start":
            open_faults.setdefault(key, []).append((float(when), index))
            continue
        starts = open_faults.get(key)
        if not starts:
            raise TraceError(f"{where}: fault_end without an open fault_start of the same type "
                             f"on node {node!r:.60}")
        start, start_index = starts.pop(0)
        if when < start:
            raise TraceError(f"{where}: field 'event_time': fault ends ({when}) before it "
                             f"started ({start}, record {start_index})")
        done.append((start_index, FaultRecord(node, start, float(when), *key[1:])))
    for key, starts in open_faults.items():
        for start, start_index in starts:
            done.append((start_index, FaultRecord(key[0], start, span, *key[1:],
                                                  open_ended=True)))
    done.sort(key=lambda item: item[0])  # the file's order, whatever the pairing order was
    return FaultTrace(tuple(r for _, r in done), span)


def load_faults(path: Path | str = INFINITEHBD_FAULTS) -> FaultTrace:
    """Read a node fault trace in InfiniteHBD's JSON shape."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path.name}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path.name}: not UTF-8 text: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path.name}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    return parse_fault_records(data, path.name)
