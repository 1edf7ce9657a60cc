"""A stand-in GEMM burn test for the demo's simulated GPUs.

    python -m testbed.burn GPU

Prints ``metric tflops VALUE`` as a burn test's wrapper would. The value comes
from the fake GPU's state file (``HARMONAIZE_FAKE_NVML_STATE``, which the
agent passes on): a GPU with a burst of single-bit ECC errors runs the burn
far below its class's speed, as a degrading GPU does.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

HEALTHY_TFLOPS = 989.0
DEGRADED_TFLOPS = 702.0


def main() -> int:
    gpu = sys.argv[1] if len(sys.argv) > 1 else "0"
    state = Path(os.environ.get("HARMONAIZE_FAKE_NVML_STATE", "/nonexistent"))
    text = state.read_text() if state.is_file() else ""
    match = re.search(rf"^gpu\.{re.escape(gpu)}\.ecc_sbe_volatile\s*=\s*(\d+)", text, re.M)
    errors = int(match[1]) if match else 0
    time.sleep(0.5)  # a real burn takes minutes; the demo has no time for that
    print(f"metric tflops {DEGRADED_TFLOPS if errors >= 100 else HEALTHY_TFLOPS}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
