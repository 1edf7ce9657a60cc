"""plugin-getcollinfo: cost of one getCollInfo call of the NCCL tuner plugin.

Runs native/build/tuner_bench, a C program that writes a live policy (a
listed communicator, activation in the past, four rules), dlopens
libnccl-tuner-harmonaize.so, resolves ncclTunerPlugin_v5 and calls
getCollInfo in a tight loop over eight (collective, size) pairs with a 7x3
cost table, after checking that the policy really is applied. Each iteration
first restores the table (an 84-byte memcpy) and *nChannels; the figure
INCLUDES that restore, which is also timed alone and printed. The figure is
the median over the runs of each run's mean ns per call; the target is
<= 100 ns.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "native" / "build" / "libnccl-tuner-harmonaize.so"
BENCH = ROOT / "native" / "build" / "tuner_bench"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--calls", type=int, default=1_000_000, help="calls per run")
    args = parser.parse_args()
    if args.runs < 11 or args.calls < 1_000_000:
        parser.error("the figure needs at least 11 runs of at least 1,000,000 calls")
    # A no-op when the binaries are current; builds them when missing.
    subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "tuner")], check=True)
    done = subprocess.run([str(BENCH), str(PLUGIN), str(args.runs), str(args.calls)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        return 1
    values = dict(line.split(maxsplit=1) for line in done.stdout.splitlines() if line.strip())
    median = float(values["median_ns"])
    print(f"getCollInfo (v5, live policy, 7x3 table): median {median:.1f} ns/call over "
          f"{args.runs} runs x {args.calls} calls (min {values['min_ns']}, max "
          f"{values['max_ns']}); includes the table restore, {values['restore_ns']} ns alone; "
          f"target <= 100 ns")
    print(f"plugin-getcollinfo {median:.1f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
