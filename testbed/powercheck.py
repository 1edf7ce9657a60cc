"""Read-only check on a GPU machine: our NVML wrapper's power readings against nvidia-smi.

For every GPU: the power-management constraints (min, max), the default limit and the
requested limit as the energy loop reads them (agent/energy/power.py), and the enforced
limit and the draw as the GPU observer samples them (agent/gpu/nvml.py), next to what
``nvidia-smi -q -x -d POWER`` says. Nothing is set: only NVML's getters are called.

    python -m testbed.powercheck [--json FILE]

Exit status 0 when every value agrees (limits to within 1 W, the draw, read at another
moment, to within 10% or 15 W), 1 when one does not, 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from agent.energy.power import Originals, PowerControl
from agent.gpu.nvml import Nvml, NvmlUnavailable
from harmonaize.tables import table

LIMIT_TOLERANCE_W = 1.0
DRAW_TOLERANCE = (15.0, 0.10)  # watts, or this share of the draw, whichever is more

#: nvidia-smi's XML names, newest first (drivers from r535 say gpu_power_readings and
#: split the limit into the requested and the current one).
SMI_FIELDS = {
    "min_w": ("min_power_limit",),
    "max_w": ("max_power_limit",),
    "default_w": ("default_power_limit",),
    "limit_w": ("requested_power_limit", "power_limit"),
    "enforced_w": ("current_power_limit", "enforced_power_limit"),
    "draw_w": ("power_draw", "average_power_draw", "instant_power_draw"),
}


def _watts(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(text.split()[0])
    except ValueError:
        return None  # "N/A"


def parse_smi(xml: str) -> dict[str, dict[str, float | None]]:
    """Per GPU UUID, the power values nvidia-smi reports, in watts."""
    out = {}
    for gpu in ET.fromstring(xml).iter("gpu"):
        uuid = (gpu.findtext("uuid") or "").strip()
        readings = gpu.find("gpu_power_readings")
        if readings is None:
            readings = gpu.find("power_readings")
        values: dict[str, float | None] = {}
        for key, names in SMI_FIELDS.items():
            values[key] = next((w for n in names if readings is not None
                                and (w := _watts(readings.findtext(n))) is not None), None)
        out[uuid] = values
    return out


def read_ours(call_timeout: float = 5.0, wait: float = 10.0) -> dict[str, dict[str, Any]]:
    nvml = Nvml(interval=1.0, slow_interval=0.5, call_timeout=call_timeout)
    nvml.start()
    try:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(
                s.telemetry is None for s in nvml.snapshots()):
            time.sleep(0.1)
        handles = {r.identity.uuid: r.handle for r in nvml.readers}
        with tempfile.TemporaryDirectory(prefix="hz-powercheck-") as scratch:
            control = PowerControl(Originals(Path(scratch) / "unused.json"), lambda: handles,
                                   call_timeout)
            out = {}
            for snap in nvml.snapshots():
                uuid = snap.identity.uuid
                t = snap.telemetry
                row: dict[str, Any] = {"index": snap.identity.index, "error": ""}
                try:
                    info = control.read(uuid)  # getters only
                    row.update(min_w=info.min_mw / 1000, max_w=info.max_mw / 1000,
                               default_w=info.default_mw / 1000,
                               limit_w=info.original_mw / 1000)
                except Exception as exc:
                    row["error"] = str(exc) or type(exc).__name__
                row["enforced_w"] = t.power_limit_w if t else None
                row["draw_w"] = t.power_w if t else None
                out[uuid] = row
            return out
    finally:
        nvml.stop()


def compare(ours: dict[str, dict[str, Any]],
            smi: dict[str, dict[str, float | None]]) -> list[dict[str, Any]]:
    rows = []
    for uuid, mine in sorted(ours.items(), key=lambda kv: kv[1]["index"]):
        theirs = smi.get(uuid, {})
        for key in SMI_FIELDS:
            a, b = mine.get(key), theirs.get(key)
            if a is None or b is None:
                ok = a is None and b is None
            elif key == "draw_w":
                ok = abs(a - b) <= max(DRAW_TOLERANCE[0], DRAW_TOLERANCE[1] * max(a, b))
            else:
                ok = abs(a - b) <= LIMIT_TOLERANCE_W
            rows.append({"gpu": mine["index"], "uuid": uuid, "value": key, "ours": a,
                         "nvidia_smi": b, "agree": ok, "error": mine["error"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write every comparison as JSON here")
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    args = parser.parse_args(argv)
    try:
        xml = subprocess.run([args.nvidia_smi, "-q", "-x", "-d", "POWER"], check=True,
                             capture_output=True, text=True, timeout=60).stdout
        smi = parse_smi(xml)
        ours = read_ours()
    except (OSError, subprocess.SubprocessError, ET.ParseError, NvmlUnavailable,
            RuntimeError) as exc:
        print(f"power-check: cannot run: {str(exc).splitlines()[0] if str(exc) else exc!r}",
              file=sys.stderr)
        return 2
    rows = compare(ours, smi)
    print(table(rows, [("gpu", "GPU"), ("value", "VALUE"), ("ours", "OURS W"),
                       ("nvidia_smi", "NVIDIA-SMI W"), ("agree", "AGREE"),
                       ("error", "ERROR")]))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if not r["agree"]]
    print(f"power-check: {len(ours)} GPU(s), {len(rows) - len(bad)} of {len(rows)} values "
          f"agree" + (": " + ", ".join(f"gpu {r['gpu']} {r['value']}" for r in bad)
                      if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
