"""A stand-in for ``nvidia-smi --gpu-reset`` that resets the fake NVML's GPUs.

    python -m testbed.fakesmi --gpu-reset -i <index | PCI bus id | UUID>

NVML has no public call that resets a GPU (its "Device Commands" reset clocks and ECC
counts only; its drain-state calls remove and rediscover a GPU), so the agent runs an
operator-configured command, by default ``nvidia-smi --gpu-reset -i <PCI bus id>``. This
program keeps that command's contract on the fake GPUs of
:mod:`testbed.fakegpu` (the state file named by ``HARMONAIZE_FAKE_NVML_STATE``):

* root only: anyone else gets exit 4 (insufficient permissions), as nvidia-smi;
* no state file: exit 9 (driver not loaded); an unknown GPU: exit 6;
* a lost GPU (``lost = 1``): exit 15 (fallen off the bus);
* a GPU with a process on it (``processes``): refused, exit 255, as nvidia-smi refuses
  a GPU in use by any application;
* ``reset_error = N`` in the GPU's state (a test sets it): the reset fails with exit N;
* otherwise the reset succeeds: the GPU's volatile ECC counters start again from zero,
  which NVML then reports (native/fake_nvml keeps the counts at the reset in
  ``<state>.reset`` and counts from there), as after a real reset.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from testbed.fakegpu import STATE_ENV

#: The library's default PCI buses (native/fake_nvml/state.c), by index modulo 8.
DEFAULT_BUS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
VOLATILE = ("ecc_sbe_volatile", "ecc_dbe_volatile")


def _state(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    return values


def _identity(values: dict[str, str], index: int) -> tuple[str, str]:
    bus = values.get(f"gpu.{index}.pci_bus_id",
                     f"{index // 8:08X}:{DEFAULT_BUS[index % 8]:02X}:00.0")
    uuid = values.get(f"gpu.{index}.uuid", f"GPU-fa4e0000-0000-0000-0000-{index:012x}")
    return bus, uuid


def _find(values: dict[str, str], wanted: str) -> int | None:
    gpus = int(values.get("gpus", "8"))
    for index in range(gpus):
        bus, uuid = _identity(values, index)
        if wanted in (str(index), uuid) or wanted.upper() == bus.upper():
            return index
    return None


def _record_reset(path: Path, values: dict[str, str], index: int) -> None:
    """Keep the GPU's volatile counts at this reset in ``<state>.reset`` (atomically)."""
    target = path.with_name(path.name + ".reset")
    try:
        lines = target.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    lines = [ln for ln in lines if not re.match(rf"\s*gpu\.{index}\.", ln)]
    lines += [f"gpu.{index}.{key} = {int(values.get(f'gpu.{index}.{key}', '0'), 0)}"
              for key in VOLATILE]
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as out:
        out.write("# GPU resets (testbed.fakesmi)\n" + "\n".join(lines) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def reset(wanted: str | None) -> int:
    if os.geteuid() != 0:
        print("Insufficient Permissions", file=sys.stderr)
        return 4
    state = os.environ.get(STATE_ENV, "")
    path = Path(state)
    if not state or not path.is_file():
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
              "driver.", file=sys.stderr)
        return 9
    values = _state(path)
    gpus = int(values.get("gpus", "8"))
    targets = list(range(gpus)) if wanted is None else [_find(values, wanted)]
    if None in targets:
        print(f"No devices were found matching {wanted}", file=sys.stderr)
        return 6
    for index in targets:
        assert index is not None
        bus, _ = _identity(values, index)
        if values.get(f"gpu.{index}.lost", "0") not in ("", "0"):
            print(f"GPU {bus}: Unable to determine the device handle: GPU is lost",
                  file=sys.stderr)
            return 15
        if values.get(f"gpu.{index}.processes", ""):
            print(f"GPU {bus} is currently in use by another process. Please first kill all "
                  "processes using this GPU and then try to reset the GPU again.",
                  file=sys.stderr)
            return 255
        error = int(values.get(f"gpu.{index}.reset_error", "0") or "0", 0)
        if error:
            print(f"GPU {bus}: failed to reset the GPU", file=sys.stderr)
            return error
    for index in targets:
        assert index is not None
        _record_reset(path, values, index)
        print(f"GPU {_identity(values, index)[0]} was successfully reset.")
    print("All done.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi")
    parser.add_argument("-r", "--gpu-reset", action="store_true")
    parser.add_argument("-i", "--id")
    args = parser.parse_args(argv)
    if not args.gpu_reset:
        parser.error("only --gpu-reset is implemented")
    return reset(args.id)


if __name__ == "__main__":
    sys.exit(main())
