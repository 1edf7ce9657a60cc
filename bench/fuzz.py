"""fuzz: a coverage-guided fuzz campaign over everything that parses untrusted input.

Targets (each its own process, in turn):

* ``wire``: the wire decoder (atheris), every frame kind agents and tenants send;
* ``tenant``: tenants' requests as the controller takes them (strict decoding,
  the subscription rules);
* ``operator_requests``: lines on the controller's admin socket, through the
  real command table;
* ``configuration``: the agent's and the controller's TOML files;
* ``stats``: the agent's reader of the tuner plugin's stats files (tenants write them);
* ``gateway_requests``: raw bytes on the HTTP gateway's port (the real gateway and
  core over a socket: no 500, no hang, nothing logged as an error);
* ``gateway_cursors``: cursors as ``Last-Event-ID`` and ``?since=`` carry them;
* ``gateway_bodies``: request bodies (bounded JSON, then a declaration or an answer);
* ``policy``: the tuner plugin's policy validation and acceptance rule, in C
  (libFuzzer with AddressSanitizer and UBSan; needs clang, installed if missing).

Each runs ``--runs`` inputs (default 1,000,000) or ``--seconds``, whichever
comes first, starting from its seed corpus in ``fuzz/corpus/<target>/``; what
it finds new goes to a scratch corpus (``--save`` merges it into the tree).
A crash (an exception other than the documented one, a fault, a sanitizer
report, a timeout) is saved under ``build/fuzz/crashes/<target>/`` and counted.
The last line is ``fuzz N crashes``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("wire", "tenant", "operator_requests", "configuration", "stats",
           "gateway_requests", "gateway_cursors", "gateway_bodies", "policy")
CORPUS = ROOT / "fuzz" / "corpus"
CRASHES = ROOT / "build" / "fuzz" / "crashes"
POLICY_FUZZER = ROOT / "native" / "build" / "policy_fuzz"


def ensure_clang() -> None:
    if shutil.which("clang") and list(Path("/usr/lib").glob("llvm-*/lib/clang/*/lib/linux/"
                                                             "libclang_rt.fuzzer-x86_64.a")):
        return
    print("fuzz: installing clang and its fuzzer runtime (apt)", file=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "clang",
                    "libclang-rt-14-dev"], check=True, stdout=subprocess.DEVNULL,
                   env={"DEBIAN_FRONTEND": "noninteractive",
                        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def command(target: str) -> list[str]:
    if target == "policy":
        ensure_clang()
        subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "tuner"), "fuzz"], check=True)
        return [str(POLICY_FUZZER)]
    return [sys.executable, str(ROOT / "fuzz" / "targets" / f"{target}.py")]


def run(target: str, runs: int, seconds: int, scratch: Path) -> tuple[int, int, float]:
    """(inputs run, crashes, seconds) for one target."""
    work = scratch / target
    work.mkdir(parents=True, exist_ok=True)
    crashes = CRASHES / target
    crashes.mkdir(parents=True, exist_ok=True)
    before = set(crashes.iterdir())
    argv = [*command(target), f"-runs={runs}", f"-max_total_time={seconds}", "-timeout=10",
            "-rss_limit_mb=4096", "-print_final_stats=1", f"-artifact_prefix={crashes}/",
            str(work), str(CORPUS / target)]
    state = scratch / f"{target}-state"  # what a target keeps (the admin target's database)
    state.mkdir(exist_ok=True)
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "HZ_FUZZ_STATE": str(state)})
    took = time.monotonic() - began
    output = done.stdout + done.stderr
    found = [p for p in crashes.iterdir() if p not in before]
    executed = re.findall(r"stat::number_of_executed_units:\s*(\d+)", output)
    count = int(executed[-1]) if executed else 0
    if done.returncode != 0 and not found:
        print(output[-3000:], file=sys.stderr)
        found = [Path(f"{target}: the fuzzer failed with status {done.returncode}")]
    for path in found:
        print(f"  {target}: crash saved as {path}", file=sys.stderr)
    return count, len(found), took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000, help="inputs per target")
    parser.add_argument("--seconds", type=int, default=900, help="longest run per target")
    parser.add_argument("--target", action="append", choices=TARGETS,
                        help="only these targets (default: all)")
    parser.add_argument("--save", action="store_true",
                        help="merge what was found into the corpora in the tree")
    args = parser.parse_args()
    total = 0
    with tempfile.TemporaryDirectory(prefix="hz-fuzz-") as tmp:
        scratch = Path(tmp)
        for target in args.target or TARGETS:
            count, crashes, took = run(target, args.runs, args.seconds, scratch)
            total += crashes
            print(f"  {target}: {count} inputs in {took:.0f} s ({count / max(took, 1e-9):.0f}/s), "
                  f"{crashes} crashes", flush=True)
            if args.save and crashes == 0:
                merge = [*command(target), "-merge=1", str(CORPUS / target), str(scratch / target)]
                subprocess.run(merge, capture_output=True, check=False)
    print(f"fuzz {total} crashes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
