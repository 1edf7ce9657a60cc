"""Public GPU-cluster job traces written in the simulator's job trace CSV format.

``python -m sim.convert FORMAT SOURCE -o OUT.csv`` reads a trace as its publisher ships
it and writes ``timestamp, duration, num_gpus, gpu_time, cluster`` (sim.traces; the
format is documented in docs/privacy-utility.md). Formats:

* ``itp``: Microsoft's ITP traces (the ElasticFlow artifact's ``raw-traces.tar.gz``, or
  the folder it unpacks to): one CSV per cluster, ``job_id, submission_time (seconds from
  the start of collection), duration (seconds), num_gpu``. Each file is a pool, named by
  its file name (``cluster01`` ...).
* ``helios``: one Helios cluster's ``cluster_log.csv`` (SenseTime, SC '21): ``job_id,
  user, vc, gpu_num, cpu_num, node_num, state, submit_time, start_time, end_time,
  duration, queue``. Each virtual cluster (``vc``) is a pool.

Jobs that used no GPU or ran for no time are not GPU jobs to replay: they are dropped and
counted. Anything else malformed stops the conversion with one line naming the file, the
row and the field (:class:`sim.traces.TraceError`).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sim.traces import JOB_COLUMNS, POOL_NAME, TraceError, parse_job_rows, timestamp

#: One job: (timestamp as written, duration in seconds, GPUs, pool).
Job = tuple[str, float, int, str]


@dataclass
class Converted:
    jobs: list[Job] = field(default_factory=list)
    #: Rows dropped: no GPU, or no running time.
    no_gpu: int = 0
    no_time: int = 0


def _columns(header: list[str] | None, need: tuple[str, ...], where: str) -> dict[str, int]:
    if header is None:
        raise TraceError(f"{where}: empty file, expected a header with {', '.join(need)}")
    names = [h.strip() for h in header]
    missing = [c for c in need if c not in names]
    if missing:
        raise TraceError(f"{where}:1: header lacks column(s) {', '.join(missing)}")
    return {c: names.index(c) for c in need}


def _number(row: list[str], col: dict[str, int], name: str, where: str) -> float:
    raw = row[col[name]].strip()
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{where}: field {name!r}: expected a number, got {raw!r:.40}") from None
    if not math.isfinite(value):
        raise TraceError(f"{where}: field {name!r}: expected a finite number, got {raw!r:.40}")
    return value


def _rows(lines: Iterable[str], source: str, need: tuple[str, ...]) -> Iterator[
        tuple[str, list[str], dict[str, int]]]:
    reader = csv.reader(lines)
    col = _columns(next(reader, None), need, source)
    width = max(col.values()) + 1
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        where = f"{source}:{line}"
        if len(row) < width:
            raise TraceError(f"{where}: expected at least {width} fields, got {len(row)}")
        yield where, row, col


def _add(out: Converted, job: tuple[str, float, float, str], where: str) -> None:
    stamp, duration, gpus, pool = job
    if gpus != int(gpus) or gpus < 0:
        raise TraceError(f"{where}: GPUs: expected a whole number >= 0, got {gpus:g}")
    if duration < 0:
        raise TraceError(f"{where}: field 'duration': must not be negative, got {duration:g}")
    if not POOL_NAME.match(pool) or len(pool) > 64:
        raise TraceError(f"{where}: pool: expected a name of letters, digits and ._:@+-, "
                         f"got {pool!r:.40}")
    timestamp(stamp, where)
    if gpus == 0:
        out.no_gpu += 1
    elif duration == 0:
        out.no_time += 1
    else:
        out.jobs.append((stamp, duration, int(gpus), pool))


ITP_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")


def itp_cluster(lines: Iterable[str], source: str, pool: str, out: Converted) -> None:
    for where, row, col in _rows(lines, source, ITP_COLUMNS):
        submitted = _number(row, col, "submission_time", where)
        duration = _number(row, col, "duration", where)
        gpus = _number(row, col, "num_gpu", where)
        _add(out, (_num(submitted), duration, gpus, pool), where)


def itp(source: Path) -> Converted:
    """The ITP raw traces: a ``.tar.gz`` as published, or the folder it unpacks to."""
    out = Converted()
    if source.is_dir():
        files = sorted(source.glob("*.csv"))
        if not files:
            raise TraceError(f"{source.name}: no .csv files in this folder")
        for path in files:
            with path.open(newline="") as f:
                itp_cluster(f, path.name, path.stem, out)
        return out
    try:
        with tarfile.open(source, "r:*") as tar:
            members = sorted((m for m in tar.getmembers()
                              if m.isfile() and m.name.endswith(".csv")), key=lambda m: m.name)
            if not members:
                raise TraceError(f"{source.name}: no .csv files in this archive")
            for m in members:
                data = tar.extractfile(m)
                assert data is not None  # a regular file
                name = Path(m.name)
                with io.TextIOWrapper(data, newline="") as f:
                    itp_cluster(f, f"{source.name}/{name.name}", name.stem, out)
    except (tarfile.TarError, EOFError) as exc:
        raise TraceError(f"{source.name}: not a readable archive: {exc}") from None
    return out


HELIOS_COLUMNS = ("vc", "gpu_num", "submit_time", "duration")


def helios(source: Path) -> Converted:
    """One Helios cluster's ``cluster_log.csv``: a pool per virtual cluster."""
    out = Converted()
    with source.open(newline="") as f:
        for where, row, col in _rows(f, source.name, HELIOS_COLUMNS):
            duration = _number(row, col, "duration", where)
            gpus = _number(row, col, "gpu_num", where)
            _add(out, (row[col["submit_time"]].strip(), duration, gpus,
                       row[col["vc"]].strip()), where)
    return out


FORMATS = {"itp": itp, "helios": helios}


def _num(v: float) -> str:
    """A number as written back: whole numbers without a point, others exactly."""
    return str(int(v)) if v == int(v) else repr(v)


def write(converted: Converted, dest: Path, source: str) -> int:
    """Write the jobs, then read them back with the simulator's own loader (so a file
    this writes is one the simulator reads, or the conversion fails here)."""
    rows = [list(JOB_COLUMNS)] + [
        [stamp, _num(d), str(g), _num(d * g), pool] for stamp, d, g, pool in converted.jobs]
    parse_job_rows(rows, source)
    with dest.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    return len(rows) - 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("format", choices=sorted(FORMATS))
    p.add_argument("source", type=Path)
    p.add_argument("-o", "--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        converted = FORMATS[args.format](args.source)
        written = write(converted, args.out, args.source.name)
    except TraceError as exc:
        print(f"sim.convert: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sim.convert: {exc.filename or args.source}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except (csv.Error, UnicodeDecodeError) as exc:
        print(f"sim.convert: {args.source.name}: not a readable CSV file: {exc}",
              file=sys.stderr)
        return 2
    pools = len({j[3] for j in converted.jobs})
    print(f"{args.out}: {written} jobs in {pools} pools; dropped {converted.no_gpu} without "
          f"a GPU and {converted.no_time} that ran for no time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
