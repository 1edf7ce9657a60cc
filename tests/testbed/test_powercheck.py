"""The read-only power check that scripts/gpu-check runs on a GPU machine, here against the
fake NVML and a stand-in nvidia-smi: it agrees where they agree, names what differs, and
sets nothing."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import fakegpu
from testbed.fakegpu import FakeNvml
from testbed.powercheck import parse_smi

pytestmark = pytest.mark.energy

ROOT = Path(__file__).resolve().parents[2]

#: What a driver from r535 on prints (gpu_power_readings, requested and current limit).
NEW = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log><driver_version>550.54.15</driver_version>{gpus}</nvidia_smi_log>"""
NEW_GPU = """<gpu id="0000000{i}:18:00.0"><uuid>{uuid}</uuid><gpu_power_readings>
<power_state>P0</power_state><power_draw>{draw:.2f} W</power_draw>
<current_power_limit>{limit:.2f} W</current_power_limit>
<requested_power_limit>{limit:.2f} W</requested_power_limit>
<default_power_limit>700.00 W</default_power_limit>
<min_power_limit>{min:.2f} W</min_power_limit><max_power_limit>700.00 W</max_power_limit>
</gpu_power_readings></gpu>"""
#: An older driver's names.
OLD_GPU = """<gpu id="0"><uuid>GPU-old</uuid><power_readings><power_draw>N/A</power_draw>
<power_limit>300.00 W</power_limit><default_power_limit>300.00 W</default_power_limit>
<enforced_power_limit>250.00 W</enforced_power_limit><min_power_limit>100.00 W</min_power_limit>
<max_power_limit>300.00 W</max_power_limit></power_readings></gpu>"""


def smi_script(tmp_path: Path, xml: str) -> Path:
    body = tmp_path / "smi.xml"
    body.write_text(xml)
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n[ \"$*\" = \"-q -x -d POWER\" ] || exit 9\ncat {body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def run_check(tmp_path: Path, fake: FakeNvml, xml: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **fakegpu.environment(fake.path)}
    return subprocess.run(
        [sys.executable, "-m", "testbed.powercheck", "--nvidia-smi",
         str(smi_script(tmp_path, xml)), "--json", str(tmp_path / "out.json")],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def fake_gpus(tmp_path: Path) -> FakeNvml:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "fake_nvml")], check=True)
    fake = FakeNvml(tmp_path / "nvml.state", gpus=2)
    for i in range(2):
        fake.set(i, power_mw=(310 + i) * 1000, power_limit_mw=650_000)
    return fake


def uuid(i: int) -> str:
    return f"GPU-fa4e0000-0000-0000-0000-{i:012x}"


def test_it_agrees_with_nvidia_smi_and_sets_nothing(tmp_path) -> None:
    fake = fake_gpus(tmp_path)
    gpus = "".join(NEW_GPU.format(i=i, uuid=uuid(i), draw=300 + 2 * i, limit=650, min=200)
                   for i in range(2))
    done = run_check(tmp_path, fake, NEW.format(gpus=gpus))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 GPU(s), 12 of 12 values agree" in done.stdout
    rows = json.loads((tmp_path / "out.json").read_text())
    assert {(r["value"], r["ours"]) for r in rows if r["gpu"] == 1} == {
        ("min_w", 200.0), ("max_w", 700.0), ("default_w", 700.0), ("limit_w", 650.0),
        ("enforced_w", 650.0), ("draw_w", 311.0)}
    assert fake.set_limits() == {} and not fake.settings_path.exists()


def test_it_names_what_differs(tmp_path) -> None:
    fake = fake_gpus(tmp_path)
    gpus = "".join(NEW_GPU.format(i=i, uuid=uuid(i), draw=400 if i else 310, limit=650,
                                  min=150 if i else 200) for i in range(2))
    done = run_check(tmp_path, fake, NEW.format(gpus=gpus))
    assert done.returncode == 1
    assert "10 of 12 values agree: gpu 1 min_w, gpu 1 draw_w" in done.stdout


def test_without_nvidia_smi_it_says_so_in_one_line(tmp_path) -> None:
    fake = fake_gpus(tmp_path)
    env = {**os.environ, **fakegpu.environment(fake.path)}
    done = subprocess.run([sys.executable, "-m", "testbed.powercheck",
                           "--nvidia-smi", str(tmp_path / "missing")], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("power-check: cannot run:")


def test_older_drivers_names_are_read() -> None:
    values = parse_smi(NEW.format(gpus=OLD_GPU))["GPU-old"]
    assert values == {"min_w": 100.0, "max_w": 300.0, "default_w": 300.0, "limit_w": 300.0,
                      "enforced_w": 250.0, "draw_w": None}
