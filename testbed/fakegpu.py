"""Fake GPUs for tests and the demo: the state file of native/fake_nvml and how to load it.

native/fake_nvml builds ``native/build/libnvidia-ml.so.1``, a stand-in for NVIDIA's driver
library that answers the NVML calls pynvml makes from a plain-text state file. The file's path
is read from ``HARMONAIZE_FAKE_NVML_STATE`` at ``nvmlInit``; the library re-reads the file
whenever its inode, size or mtime changes. `FakeNvml` writes it atomically (temporary file in
the same directory, then ``os.replace``), so a reader never sees half a file.

How the real pynvml ends up calling the fake:

* In-process: `preload` dlopens the library by absolute path before pynvml's first
  ``nvmlInit``. pynvml then runs ``CDLL("libnvidia-ml.so.1")``; glibc's dlopen looks among the
  objects already loaded first and matches them by SONAME, so it returns the fake. `preload`
  verifies exactly that (a ``RTLD_NOLOAD`` dlopen of the bare name must give back the same
  handle) and raises when some other libnvidia-ml.so.1 got there first. No pynvml private
  state is touched.
* Subprocess (the agent daemon): start it with ``environment(state_path)`` merged into its
  environment; ``LD_LIBRARY_PATH`` puts native/build ahead of the system's library paths.

Without the file (or the variable) ``nvmlInit`` fails with NVML_ERROR_DRIVER_NOT_LOADED, as on
a host without the driver.

Power limits: ``nvmlDeviceSetPowerManagementLimit`` keeps what it set in ``<state>.power``
(`FakeNvml.set_limits` reads it), shared by every process that loads the same state and kept
across their restarts, as a real GPU keeps its limit; below the state's ``power_mw`` the GPU
slows along the curve documented in native/fake_nvml/power.c (clocks, draw, and the
throughput `throughput` reads). ``power_settable = 0`` refuses the call with
NVML_ERROR_NO_PERMISSION, ``power_ignores = 1`` accepts it and changes nothing.

GPU resets: :mod:`testbed.fakesmi` stands in for ``nvidia-smi --gpu-reset`` with
its preconditions and errors; ``reset_error = N`` (ignored by the library) makes it fail
with exit N. A reset it does is kept in ``<state>.reset``, from which the library counts
the GPU's volatile ECC counters again from zero.

Behaviour worth knowing: a new event set delivers every XID in the file that is for a GPU it
registered (so an XID injected before the agent starts is not lost); ``hang(gpu)`` with ``*``
also blocks handle lookups for that GPU; a hung call gives up with NVML_ERROR_TIMEOUT after
120 s, and returns NVML_ERROR_UNINITIALIZED at once when NVML is shut down.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path

STATE_ENV = "HARMONAIZE_FAKE_NVML_STATE"
SONAME = "libnvidia-ml.so.1"

SYSTEM_KEYS = frozenset({"gpus", "driver_version", "nvml_version", "cuda_driver_version"})
GPU_KEYS = frozenset(
    {
        "name", "uuid", "serial", "pci_bus_id", "temperature", "power_mw", "power_limit_mw",
        "clock_sm_mhz", "clock_mem_mhz", "clock_graphics_mhz", "clock_video_mhz",
        "max_clock_sm_mhz", "max_clock_mem_mhz", "max_clock_graphics_mhz", "max_clock_video_mhz",
        "util_gpu", "util_mem", "mem_total", "mem_used", "mem_free", "mem_reserved",
        "clocks_event_reasons", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate",
        "ecc_dbe_aggregate", "retired_sbe", "retired_dbe", "retired_pending",
        "remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failure",
        "pcie_replay", "pcie_gen", "pcie_max_gen", "pcie_width", "pcie_max_width", "nvlinks",
        "recovery_action", "ecc_mode", "persistence_mode", "compute_mode", "processes", "lost",
        "hang", "power_min_mw", "power_max_mw", "power_default_mw", "power_static_mw",
        "min_clock_sm_mhz", "compute_share", "power_settable", "power_ignores",
        "reset_error",
    }
)  # fmt: skip
LINK_KEYS = frozenset({"state", "replay", "recovery", "crc_flit", "crc_data", "ecc_data"})
MAX_GPUS = 64
MAX_LINKS = 18

# A value of None removes the key, which puts it back to the library's default.
Value = int | str | Mapping[int, int] | None

_ROOT = Path(__file__).resolve().parents[1]


def library_dir() -> Path:
    return _ROOT / "native" / "build"


def library_path() -> Path:
    return library_dir() / SONAME


def _built_library() -> Path:
    path = library_path()
    if not path.is_file():
        raise FileNotFoundError(f"fake NVML library {path} is not built: run `make -C native`")
    return path


@functools.cache
def preload() -> ctypes.CDLL:
    """Load the fake so that pynvml's later dlopen("libnvidia-ml.so.1") resolves to it."""
    lib = ctypes.CDLL(str(_built_library()), mode=ctypes.RTLD_GLOBAL)
    bare = ctypes.CDLL(SONAME, mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD)
    if bare._handle != lib._handle:
        raise RuntimeError(
            f"another {SONAME} is already loaded: call preload() before pynvml.nvmlInit()"
        )
    return lib


def environment(state_path: str | os.PathLike[str]) -> dict[str, str]:
    """Variables a subprocess needs to load the fake; merge them into os.environ."""
    lib_dir = str(_built_library().parent)
    inherited = os.environ.get("LD_LIBRARY_PATH")
    # The harness is not installed: a subprocess that runs one of its modules (the fake
    # nvidia-smi, the burn check) finds it through PYTHONPATH.
    path = os.environ.get("PYTHONPATH")
    return {
        STATE_ENV: str(Path(state_path).absolute()),
        "LD_LIBRARY_PATH": f"{lib_dir}:{inherited}" if inherited else lib_dir,
        "PYTHONPATH": f"{_ROOT}:{path}" if path else str(_ROOT),
    }


def throughput(handle: object) -> float:
    """The fake GPU's throughput under its power limit, relative to unconstrained (the
    curve in native/fake_nvml/power.c); ``handle`` is pynvml's device handle."""
    value = ctypes.c_uint()
    code = preload().fakeNvmlDeviceGetThroughput(handle, ctypes.byref(value))
    if code != 0:
        raise RuntimeError(f"fakeNvmlDeviceGetThroughput returned {code}")
    return value.value / 1e6


def _render(value: Value) -> str:
    if isinstance(value, Mapping):  # processes: pid -> used bytes
        return ",".join(f"{_render(pid)}:{_render(used)}" for pid, used in value.items())
    if isinstance(value, bool | int):
        if value < 0:
            raise ValueError(f"negative value {value}")
        return str(int(value))
    if isinstance(value, str) and "\n" not in value and "\r" not in value:
        return value.strip()
    raise ValueError(f"unsupported value {value!r}")


def _last_xid_id(path: Path) -> int:
    # Continue an earlier writer's numbering: a live event set only delivers higher ids.
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return 0
    return max((int(n) for n in re.findall(r"^\s*xid\.(\d+)\s*=", text, re.MULTILINE)), default=0)


class FakeNvml:
    """The fake host's GPUs. Every change is written to the state file at once."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        gpus: int = 8,
        name: str = "NVIDIA H200",
        **system: Value,
    ) -> None:
        self.path = Path(path)
        self._name = name
        self._system: dict[str, str] = {}
        self._gpus: dict[int, dict[str, str]] = {}
        self._xids: list[tuple[int, int, int]] = []  # (id, gpu, xid)
        self._last_xid = _last_xid_id(self.path)
        self.set_system(gpus=gpus, **system)

    @property
    def gpus(self) -> int:
        return int(self._system["gpus"])

    def set_system(self, **values: Value) -> None:
        """gpus, driver_version, nvml_version, cuda_driver_version."""
        _update(self._system, values, SYSTEM_KEYS)
        if "gpus" in values and not 0 <= self.gpus <= MAX_GPUS:
            raise ValueError(f"gpus must be 0..{MAX_GPUS}")
        self.save()

    def set(self, gpu: int, **values: Value) -> None:
        """Per-GPU keys (see GPU_KEYS), e.g. set(0, temperature=80, processes={1234: 1 << 30})."""
        _update(self._gpu(gpu), values, GPU_KEYS)
        self.save()

    def set_link(self, gpu: int, link: int, **values: Value) -> None:
        """NVLink keys (see LINK_KEYS), e.g. set_link(0, 3, state=0, crc_flit=12)."""
        if not 0 <= link < MAX_LINKS:
            raise ValueError(f"NVLink index {link} out of range")
        keys = {f"nvlink.{link}.{key}": value for key, value in values.items()}
        _update(self._gpu(gpu), keys, {f"nvlink.{link}.{key}" for key in LINK_KEYS})
        self.save()

    def inject_xid(self, gpu: int, xid: int) -> int:
        """Append an XID event for gpu; returns its id (strictly increasing)."""
        self._gpu(gpu)
        self._last_xid += 1
        self._xids.append((self._last_xid, gpu, xid))
        self.save()
        return self._last_xid

    def lose(self, gpu: int, lost: bool = True) -> None:
        """Every call on the GPU (and an event wait registered on it) gives GPU_IS_LOST."""
        self.set(gpu, lost=int(lost))

    def hang(self, gpu: int, function: str = "*") -> None:
        """Block calls of function (an NVML symbol, its _vN variants, or * for all) on gpu."""
        self.set(gpu, hang=function)

    def release(self, gpu: int) -> None:
        self.set(gpu, hang=None)

    @property
    def settings_path(self) -> Path:
        """Where the library keeps power limits set through NVML."""
        return self.path.with_name(self.path.name + ".power")

    def set_limits(self) -> dict[int, int]:
        """Power limits (mW) set through NVML, per GPU: what the GPUs hold now."""
        try:
            text = self.settings_path.read_text()
        except FileNotFoundError:
            return {}
        found = re.findall(r"^gpu\.(\d+)\.power_limit_mw = (\d+)$", text, re.MULTILINE)
        return {int(gpu): int(mw) for gpu, mw in found}

    def reset_power_limits(self) -> None:
        """Forget every set limit (a driver reload): the state's values hold again."""
        self.settings_path.unlink(missing_ok=True)

    def render(self) -> str:
        lines = ["# Written by testbed.fakegpu for native/fake_nvml."]
        lines += [f"{key} = {value}" for key, value in sorted(self._system.items())]
        for gpu in range(max(self.gpus, max(self._gpus, default=-1) + 1)):
            values = {"name": self._name, **self._gpus.get(gpu, {})}
            lines += [f"gpu.{gpu}.{key} = {value}" for key, value in values.items()]
        lines += [f"xid.{n} = {gpu}:{xid}" for n, gpu, xid in self._xids]
        return "\n".join(lines) + "\n"

    def save(self) -> None:
        """Write the file atomically so the library never parses a partial one."""
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(self.render())
            os.chmod(tmp, 0o644)  # the agent under test may run as another user
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _gpu(self, gpu: int) -> dict[str, str]:
        if not 0 <= gpu < MAX_GPUS:
            raise ValueError(f"GPU index {gpu} out of range")
        return self._gpus.setdefault(gpu, {})


def _update(target: dict[str, str], values: Mapping[str, Value], known: Collection[str]) -> None:
    unknown = set(values) - set(known)
    if unknown:
        raise KeyError(f"unknown state keys: {sorted(unknown)}")
    for key, value in values.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _render(value)
