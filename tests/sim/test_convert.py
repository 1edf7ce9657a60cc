"""Other public traces into the job trace CSV (sim.convert), and the bench on any such file:
tiny fixtures in each publisher's own columns, and bad input as one line naming row and
field."""

from __future__ import annotations

import io
import random
import re
import sys
import tarfile

import pytest

from bench import privacy_utility
from sim import convert
from sim.traces import load_jobs

pytestmark = pytest.mark.sim

ITP_01 = ("job_id,submission_time,duration,num_gpu\n"
          "6b2d9ccc-6279-403c-e1a2-cfe7810d5c57,16566,3890,4\n"
          "aa,100,60,1\n"
          "bb,200,0,2\n"          # ran for no time
          "cc,300,50,0\n")        # no GPU
ITP_02 = "job_id,submission_time,duration,num_gpu\ndd,50,7200.5,8\n"
HELIOS = ("job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,"
          "duration,queue\n"
          "1425511,uXBbc,vcJkd,1,1,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,"
          "2020-06-10 04:55:09,36848,0\n"
          "1425512,uVMrF,vchbv,4,16,1,FAILED,2020-06-09 18:41:27,2020-06-09 18:41:27,"
          "2020-06-09 18:45:36,249,0\n"
          "1425514,uVMrF,vchbv,0,16,1,COMPLETED,2020-06-09 18:42:00,2020-06-09 18:42:00,"
          "2020-06-09 18:45:00,180,0\n")


def _tarball(path, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_itp_archive_becomes_one_pool_per_cluster_file(tmp_path, capsys):
    src = tmp_path / "raw-traces.tar.gz"
    _tarball(src, {"cluster01.csv": ITP_01, "cluster02.csv": ITP_02, "LICENSE": "MIT"})
    out = tmp_path / "itp.csv"
    assert convert.main(["itp", str(src), "-o", str(out)]) == 0
    assert "3 jobs in 2 pools; dropped 1 without a GPU and 1 that ran for no time" in \
        capsys.readouterr().out
    jobs = load_jobs(out)
    assert [(j.arrival, j.duration, j.gpus, j.pool) for j in jobs] == [
        (0.0, 7200.5, 8, "cluster02"), (50.0, 60.0, 1, "cluster01"),
        (16516.0, 3890.0, 4, "cluster01")]


def test_itp_folder_reads_the_same(tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "cluster01.csv").write_text(ITP_01)
    converted = convert.itp(folder)
    assert [j[3] for j in converted.jobs] == ["cluster01", "cluster01"]


def test_helios_virtual_clusters_are_pools(tmp_path):
    src = tmp_path / "cluster_log.csv"
    src.write_text(HELIOS)
    out = tmp_path / "venus.csv"
    assert convert.main(["helios", str(src), "-o", str(out)]) == 0
    jobs = load_jobs(out)
    assert [(j.arrival, j.gpus, j.pool) for j in jobs] == [(0.0, 1, "vcJkd"), (26.0, 4, "vchbv")]


ITP_HEADER = "job_id,submission_time,duration,num_gpu\n"


@pytest.mark.parametrize(("fmt", "text", "expect"), [
    ("itp", ITP_HEADER + "a,1,x,1\n", "cluster01.csv:2: field 'duration'"),
    ("itp", ITP_HEADER + "a,1,5,1.5\n", "cluster01.csv:2: GPUs"),
    ("itp", "job_id,submission_time,duration\na,1,5\n", "lacks column(s) num_gpu"),
    ("itp", ITP_HEADER + "a,1,-5,1\n", "cluster01.csv:2: field 'duration'"),
    ("helios", HELIOS.replace("2020-06-09 18:41:27,2020", "soon,2020", 1),
     "cluster01.csv:3: field 'timestamp'"),
    ("helios", HELIOS.replace("vchbv", "vc hbv", 1), "cluster01.csv:3: pool"),
])
def test_bad_input_is_one_line_naming_row_and_field(tmp_path, capsys, fmt, text, expect):
    if fmt == "itp":
        folder = tmp_path / "raw"
        folder.mkdir()
        src = folder / "cluster01.csv"
    else:
        src = folder = tmp_path / "cluster01.csv"
    src.write_text(text)
    assert convert.main([fmt, str(folder), "-o", str(tmp_path / "out.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expect in err and "Traceback" not in err
    assert not (tmp_path / "out.csv").exists()


def test_a_broken_archive_is_one_line(tmp_path, capsys):
    src = tmp_path / "raw-traces.tar.gz"
    src.write_bytes(b"\x1f\x8b not really")
    assert convert.main(["itp", str(src), "-o", str(tmp_path / "o.csv")]) == 2
    assert capsys.readouterr().err.startswith("sim.convert: raw-traces.tar.gz: not a readable")


@pytest.mark.parametrize(("line", "field"), [
    ("2017-10-01 00:00:09,10,x,10,a", "num_gpus"),
    ("2017-10-01 00:00:09,10,2,10,a", "gpu_time"),
    ("2017-10-01 00:00:09,10,1,10,", "cluster"),
])
def test_the_bench_refuses_a_bad_trace_in_one_line(tmp_path, capsys, monkeypatch, line, field):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                    f"2017-10-01 00:00:00,10,1,10,a\n{line}\n")
    monkeypatch.setattr(sys, "argv", ["privacy_utility", "--jobs", str(jobs), "--faults",
                                      "none", "--out", str(tmp_path / "out")])
    assert privacy_utility.main() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "jobs.csv:3:" in err and repr(field) in err


def test_the_bench_refuses_a_missing_fault_file_in_one_line(tmp_path, capsys, monkeypatch):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n0,10,1,10,a\n")
    monkeypatch.setattr(sys, "argv", ["privacy_utility", "--jobs", str(jobs), "--faults",
                                      str(tmp_path / "nope.json"), "--out", str(tmp_path)])
    assert privacy_utility.main() == 2
    assert capsys.readouterr().err == "privacy-utility: nope.json: cannot read: No such file " \
        "or directory\n"


def test_the_bench_refuses_a_trace_without_jobs(tmp_path, capsys, monkeypatch):
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n")
    monkeypatch.setattr(sys, "argv", ["privacy_utility", "--jobs", str(jobs), "--faults",
                                      "none", "--out", str(tmp_path)])
    assert privacy_utility.main() == 2
    assert capsys.readouterr().err == "privacy-utility: jobs.csv: no jobs after the header\n"


def test_the_bench_prints_its_table_and_ends_with_the_median(tmp_path, capsys, monkeypatch):
    jobs = tmp_path / "jobs.csv"
    rng = random.Random(2)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for _ in range(240):
        d = round(rng.expovariate(1 / 8000) + 60)
        g = rng.choice((1, 2, 4, 8, 16))
        lines.append(f"{rng.uniform(0, 4 * 86400):.0f},{d},{g},{d * g},"
                     f"{rng.choice(('east', 'west'))}")
    jobs.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(sys, "argv", [
        "privacy_utility", "--jobs", str(jobs), "--faults", "none", "--seeds", "1",
        "--frontier-seeds", "0", "--repeats", "1", "--workers", "1",
        "--out", str(tmp_path / "out")])
    assert privacy_utility.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("trace jobs.csv: 240 jobs over 4 days, 2 pools")
    assert "0.25 h and >= 5%" in out[1]
    assert any(line.startswith("  private default") for line in out)
    assert any("per pool, private default" in line for line in out)
    assert re.fullmatch(r"privacy-utility (\d+|nan) %", out[-1])
    assert (tmp_path / "out" / "privacy-utility.json").exists()
