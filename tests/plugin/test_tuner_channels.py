"""Channel caps per NCCL release, and NCCL found through its logger when loaded privately."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin.test_tuner_abi import PROBE

pytestmark = pytest.mark.tuning


# ---- Channel counts per NCCL release. ----


def probe(workdir: Path, abi: int, version: int | None, cases: list[list[int]],
          find: str = "global") -> list[int]:
    done = subprocess.run([sys.executable, str(PROBE), str(workdir / f"p{abi}-{version}-{find}"),
                           str(abi), "none" if version is None else str(version), find,
                           json.dumps(cases)], capture_output=True, text=True, check=False,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# (given by NCCL, rule's cap): releases before 2.31 get NCCL's value back untouched,
# whatever the cap; from 2.31 the cap applies, never above 64 (8-bit field, MAXCHANNELS),
# never above a non-zero count NCCL passed in.
CASES = [[0, 4], [0, 200], [8, 4], [2, 4], [0, 0], [0, 127], [16, 64]]
UNTOUCHED = [0, 0, 8, 2, 0, 0, 16]
CAPPED = [4, 64, 4, 2, 0, 64, 16]


@pytest.mark.parametrize(("abi", "version", "expected"), [
    (3, 22203, UNTOUCHED),   # 2.22: v3 is the newest it loads
    (4, 22403, UNTOUCHED),   # 2.24
    (4, 22705, UNTOUCHED),   # 2.27
    (5, 22803, UNTOUCHED),   # 2.28.3: v5
    (6, 23007, UNTOUCHED),   # 2.30.7: v6, *nChannels still replaces NCCL's count
    (6, 23100, CAPPED),      # 2.31: a cap
    (6, 23203, CAPPED),      # 2.32
    (6, None, UNTOUCHED),    # no ncclGetVersion found: assume the older meaning
])
def test_channels_only_where_nccl_takes_a_cap(workdir, abi, version, expected):
    assert probe(workdir, abi, version, CASES) == expected


def test_nccl_found_through_its_logger_when_loaded_privately(workdir):
    """PyTorch loads NCCL out of the global scope; the logger NCCL passes says where it is."""
    assert probe(workdir, 6, 23203, CASES, find="logger") == CAPPED
    assert probe(workdir, 6, 22803, CASES, find="logger") == UNTOUCHED
