"""scripts/vagrant-box says so, and fails, when what the VMs need is not made."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import needs_root

pytestmark = [pytest.mark.hardening, pytest.mark.ops, needs_root]

ROOT = Path(__file__).resolve().parents[2]


def box_dir(workdir: Path) -> Path:
    out = workdir / "box"
    out.mkdir()
    for name in ("harmonaize-debian12.box", "vmlinuz", "initrd.img", "id_ed25519"):
        (out / name).write_bytes(b"made earlier")
    return out


def run(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "scripts" / "vagrant-box"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_no_wheels_is_a_failure_not_a_report(workdir: Path) -> None:
    # No package index and nothing to find: pip cannot collect a single wheel.
    done = run(box_dir(workdir), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(workdir / "nothing"))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "could not collect the wheels" in last and "cannot be provisioned" in last
    assert " are in " not in done.stderr  # never the report of a success


def test_a_box_without_its_kernel_is_rebuilt_not_reported(workdir: Path) -> None:
    out = box_dir(workdir)
    (out / "vmlinuz").unlink()
    done = run(out)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].endswith(
        "vmlinuz is missing beside the box: rebuild it with --force")
