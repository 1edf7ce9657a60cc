"""Helpers shared by the benchmarks: temporary daemons and percentiles."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from harmonaize.opsocket import CommandError, request


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark set-up timed out")
        time.sleep(0.02)
    return value


def answers(path: Path) -> bool:
    try:
        request(path, "status", timeout=1.0)
    except (OSError, CommandError, ValueError):
        return False
    return True


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hz-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def daemon(module: str, config: Path, log: Path, ready: Path) -> Iterator[subprocess.Popen[Any]]:
    """Run ``python -m module -c config`` until the block ends; wait for ``ready`` to answer."""
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, "-c", str(config)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: (proc.poll() is None and answers(ready)) or proc.poll() is not None)
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited:\n{log.read_text()}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
