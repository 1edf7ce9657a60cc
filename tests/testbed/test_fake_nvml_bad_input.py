"""Garbage never crashes it; children find it by LD_LIBRARY_PATH; the helper refuses misuse."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys

import pynvml
import pytest

from testbed import fakegpu
from testbed.fakegpu import FakeNvml
from tests.testbed.test_fake_nvml import (
    XID,
    background,
    event_set,
    fake,
    handle,
    library,
    next_event,
    state_dir,
)

pytestmark = pytest.mark.gpu

# The fake library's fixtures, from the file of its basic tests: pytest finds a
# fixture by the module's names, hence the export.
__all__ = ["background", "fake", "library", "state_dir"]


GARBAGE = b"""\
# a comment = with an equals sign
gpus = 3
no equals sign here
= 5
gpu.0.temperature = hot
gpu.0.power_mw = 123456
gpu.0.power_mw = -5
gpu.0.util_gpu = 99999999999999999999999
gpu.1.temperature = 0x30
gpu.1.name = \xff\xfe broken \xc3 utf-8 \x01
gpu.1.clock_sm_mhz = 1500 MHz
gpu.99.temperature = 1
gpu.x.temperature = 1
gpu.2.nvlink.40.state = 0
gpu.2.nvlink.1.state = 0
gpu.2.processes = 1:2, nonsense, :5, 7:, 3:4
gpu.2.mem_total
xid.abc = 0:79
xid.7 = 0:
xid.9 = 1:43
xid.8 = 0:13
unknown.key = 1
"""


def test_garbage_does_not_crash(fake):
    junk = GARBAGE + b"gpu.0.name = " + b"A" * 50000 + b"\n" + b"\x00" * 100 + b"gpu.2.serial=S\n"
    tmp = fake.path.with_name("garbage")
    tmp.write_bytes(junk)
    os.replace(tmp, fake.path)
    assert pynvml.nvmlDeviceGetCount() == 3
    h0, h1, h2 = handle(0), handle(1), handle(2)
    assert pynvml.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU) == 34
    assert pynvml.nvmlDeviceGetPowerUsage(h0) == 75000
    assert pynvml.nvmlDeviceGetUtilizationRates(h0).gpu == 0
    assert pynvml.nvmlDeviceGetName(h0) == "NVIDIA H200"
    assert pynvml.nvmlDeviceGetTemperature(h1, pynvml.NVML_TEMPERATURE_GPU) == 0x30
    assert pynvml.nvmlDeviceGetName(h1) == "?? broken ? utf-8 ?"
    assert pynvml.nvmlDeviceGetClockInfo(h1, pynvml.NVML_CLOCK_SM) == 345
    assert pynvml.nvmlDeviceGetNvLinkState(h2, 1) == 0
    assert pynvml.nvmlDeviceGetSerial(h2) == "S"
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h2)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(1, 2), (3, 4)]
    # Events are delivered in id order, whatever the order in the file.
    es = event_set(0, 1)
    try:
        assert [next_event(es), next_event(es)] == [(0, XID, 13), (1, XID, 43)]
    finally:
        pynvml.nvmlEventSetFree(es)


def test_random_bytes_never_crash(fake):
    rng = random.Random(20240611)
    alphabet = b"gpu.0123456789xid=:#,\n \t" + bytes(range(256))
    h = handle(0)
    for n in range(200):
        size = rng.randrange(0, 3000)
        data = bytes(rng.choice(alphabet) for _ in range(size))
        tmp = fake.path.with_name(f"fuzz{n}")
        tmp.write_bytes(data)
        os.replace(tmp, fake.path)
        count = pynvml.nvmlDeviceGetCount()
        assert 0 <= count <= 64
        if count:
            # Any outcome but a crash is fine; the handle may point past a shrunken count.
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlDeviceGetName(h)
                pynvml.nvmlDeviceGetComputeRunningProcesses(h)


CHILD = """
import json, pathlib, pynvml
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
maps = pathlib.Path("/proc/self/maps").read_text().splitlines()
print(json.dumps({
    "names": [pynvml.nvmlDeviceGetName(h) for h in handles],
    "temperature": pynvml.nvmlDeviceGetTemperature(handles[1], 0),
    "library": sorted({line.split()[-1] for line in maps if "libnvidia-ml" in line}),
}))
"""


def test_subprocess_loads_the_fake_through_ld_library_path(fake):
    fake.set(1, name="NVIDIA H200 (child)", temperature=66)
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**os.environ, **fakegpu.environment(fake.path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(result.stdout)
    assert seen == {
        "names": ["NVIDIA H200", "NVIDIA H200 (child)", "NVIDIA H200", "NVIDIA H200"],
        "temperature": 66,
        "library": [str(fakegpu.library_path().resolve())],
    }


def test_helper_rejects_mistakes(fake):
    with pytest.raises(KeyError):
        fake.set(0, temprature=50)
    with pytest.raises(ValueError):
        fake.set(0, temperature=-1)
    with pytest.raises(ValueError):
        fake.set(0, name="two\nlines")
    with pytest.raises(ValueError):
        fake.set(64, temperature=1)
    # Numbering continues past the events an earlier writer left in the file.
    last = fake.inject_xid(0, 79)
    assert FakeNvml(fake.path, gpus=4).inject_xid(0, 79) == last + 1
