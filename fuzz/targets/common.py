"""What every fuzz target shares: the import path and atheris's set-up."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import atheris

#: Our own packages are instrumented for coverage; libraries are not.
OURS = ["harmonaize", "controller", "agent"]


def run(one: Callable[[bytes], None]) -> None:
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
