"""A stand-in for a burn test or dcgmi: does what a control file says.

    fake_check.py CONTROL_DIR GPU

Writes its pid to CONTROL_DIR/pid.GPU (atomically), then follows CONTROL_DIR/behaviour.GPU
(or behaviour.all), one instruction per line: ``sleep SECONDS``,
``print TEXT`` or ``exit CODE``.
"""

import os
import sys
import time
from pathlib import Path

control, gpu = Path(sys.argv[1]), sys.argv[2]
# Written whole or not at all: a test polls for the file and reads it at once.
tmp = control / f".pid.{gpu}.{os.getpid()}"
tmp.write_text(str(os.getpid()))
tmp.replace(control / f"pid.{gpu}")
script = control / f"behaviour.{gpu}"
if not script.exists():
    script = control / "behaviour.all"
for line in script.read_text().splitlines():
    verb, _, rest = line.partition(" ")
    if verb == "sleep":
        time.sleep(float(rest))
    elif verb == "print":
        print(rest, flush=True)
    elif verb == "exit":
        sys.exit(int(rest))
