"""What the GPU observer reads for XID attribution (whether a process is ending, from
/proc as the kernel writes it, with real processes; a kernel log it cannot open), and
what the operator sees of attributed XIDs (harmonctl, metrics)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.gpu.metrics import families
from agent.gpu.observer import GpuObserver, process_ending
from agent.gpu.settings import GpuObserverSection
from harmonaize.harmonctl.agent import render_gpus

pytestmark = pytest.mark.jobhealth
PROC = Path("/proc")


def test_a_running_process_is_not_ending_a_zombie_and_a_gone_one_are() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not process_ending(PROC, proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        stat = PROC / str(proc.pid) / "stat"
        deadline = time.monotonic() + 10
        while stat.read_text().rpartition(")")[2].split()[0] != "Z":  # until reaped
            assert time.monotonic() < deadline, "never a zombie"
            time.sleep(0.01)
        assert process_ending(PROC, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert process_ending(PROC, proc.pid)  # reaped: gone


def test_a_command_name_with_parentheses_and_spaces_cannot_fake_a_state(
        tmp_path: Path) -> None:
    """The name is the process's own: ``) Z 1 1 1 0 -1 4`` in it changes nothing."""
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text("77 (evil) Z 1 1 1 0 -1 4 ) S 1 77 77 0 -1 "
                                          "4194560 0 0\n")
    assert not process_ending(tmp_path, 77)
    (tmp_path / "78").mkdir()
    (tmp_path / "78" / "stat").write_text("78 (ok) R 1 78 78 0 -1 4194564 0 0\n")
    assert process_ending(tmp_path, 78)  # PF_EXITING (0x4) set
    (tmp_path / "79").mkdir()
    (tmp_path / "79" / "stat").write_text("79 (short) R")
    assert not process_ending(tmp_path, 79)


def test_a_kernel_log_that_cannot_be_opened_leaves_attribution_without_it(
        tmp_path: Path) -> None:
    observer = GpuObserver(GpuObserverSection(kmsg_path=str(tmp_path / "missing")))
    observer._open_kmsg()
    assert observer.kmsg is None and "missing" in observer.kmsg_error


def test_harmonctl_shows_each_recent_xid_with_its_class_and_why() -> None:
    row = {"index": 2, "name": "NVIDIA H200", "state": "healthy", "temperature_c": 40,
           "power_w": 300.0, "mem_used": 0, "mem_total": 1 << 30, "pcie_gen": 5,
           "pcie_max_gen": 5, "pcie_width": 16, "pcie_max_width": 16, "nvlinks": 0,
           "nvlinks_up": 0, "util_gpu": 0, "xids": 1, "action": "none", "counters": {},
           "recent_xids": [{"at": time.time(), "xid": 31, "verdict": "application",
                            "why": "the kernel names pid 7 (python) of job job-b",
                            "job": "job-b"}]}
    text = render_gpus({"state": "running", "detail": "1 GPU(s)", "gpus": [row]})
    line = next(x for x in text.splitlines() if " 31 " in x)
    assert "application" in line and "job-b" in line and "pid 7" in line


def test_xids_are_counted_by_class_in_the_agents_metrics() -> None:
    (family,) = [f for f in families("harmonaize_agent", None, 0,
                                     {"hardware": 2, "application": 5})
                 if f.name == "harmonaize_agent_xids_total"]
    assert sorted(family.samples) == [((("class", "application"),), 5.0),
                                      ((("class", "hardware"),), 2.0)]
