"""The Slurm hook's replay units (issue 29, item 1): systemd's own tools accept them,
they stay as hardened as measured, and the install guide explains every setting."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from harmonaize.slurm.hookconfig import HookConfig
from tests.conftest import ROOT
from tests.ops.test_units import exposure, service

pytestmark = pytest.mark.scheduler

UNITS = ROOT / "systemd"
SERVICE = UNITS / "harmonaize-slurm-replay.service"
TIMER = UNITS / "harmonaize-slurm-replay.timer"
needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze is not installed (./scripts/setup)")


def with_prefix(tmp: Path) -> Path:
    prefix = tmp / "opt" / "harmonaize"
    (prefix / "bin").mkdir(parents=True)
    script = prefix / "bin" / "harmonaize-slurm"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    out = tmp / "units"
    out.mkdir()
    for unit in (SERVICE, TIMER):
        (out / unit.name).write_text(unit.read_text().replace("/opt/harmonaize", str(prefix)))
    return out


@needs_analyze
def test_slurm_replay_units_pass_systemd_analyze_verify_and_stay_hardened(
        tmp_path: Path) -> None:
    units = with_prefix(tmp_path)
    done = subprocess.run(["systemd-analyze", "verify", "--man=no",
                           *(str(u) for u in sorted(units.iterdir()))],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stderr
    assert exposure(units / SERVICE.name) <= 0.5


def test_slurm_replay_unit_agrees_with_the_hook_and_its_guide() -> None:
    unit = service(SERVICE)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    command, *args = unit["ExecStart"][0].split()
    assert Path(command).name in scripts and args == ["replay"]
    defaults = HookConfig()
    writable = unit["ReadWritePaths"][0].split()
    assert defaults.spool in writable and str(Path(defaults.log).parent) in writable
    tmpfiles = (UNITS / "harmonaize-slurm.tmpfiles").read_text()
    assert f"d {defaults.spool} 0750 slurm slurm" in tmpfiles
    assert f"f {defaults.log} 0640 slurm slurm" in tmpfiles
    guide = (ROOT / "docs" / "install.md").read_text()
    keys = set(unit) | {m.group(1) for m in
                        re.finditer(r"^#([A-Z][A-Za-z]+)=", SERVICE.read_text(), re.M)}
    missing = sorted(k for k in keys if f"`{k}=" not in guide)
    assert not missing, f"docs/install.md does not explain {missing}"
