"""Property tests are reproducible: under CI (and ./scripts/test) Hypothesis draws the same
examples on every run and machine, keeps no examples database, and prints a failure's blob."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.hardening

# Loads the suite's profiles as pytest would (importing tests/conftest.py), then draws.
DRAW = """
import json
import tests.conftest  # noqa: F401 - registers and loads the profile
from hypothesis import given, settings, strategies as st
drawn = []
@given(st.integers(), st.text())
def prop(n, s):
    drawn.append([n, s])
prop()
current = settings.default
print(json.dumps({"drawn": drawn, "derandomize": current.derandomize,
                  "database": repr(current.database), "print_blob": current.print_blob}))
"""


def draw(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    out = subprocess.run([sys.executable, "-c", DRAW], cwd=ROOT, env={**clean, **env},
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_under_ci_property_tests_draw_the_same_examples_with_no_database() -> None:
    first, second = draw(CI="true"), draw(CI="true")
    assert first["derandomize"] is True and first["print_blob"] is True
    assert first["database"] == "None"
    assert first["drawn"] == second["drawn"] and len(first["drawn"]) > 10


def test_the_explore_profile_draws_new_examples_even_under_ci(tmp_path: Path) -> None:
    env = {"CI": "true", "HYPOTHESIS_PROFILE": "explore",
           "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path)}  # its database: not the checkout's
    first, second = draw(**env), draw(**env)
    assert first["derandomize"] is False
    assert first["drawn"] != second["drawn"]


def test_scripts_test_runs_the_deterministic_profile_unless_told_otherwise() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    assert 'export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"' in script
    ignored = subprocess.run(["git", "check-ignore", "-q", ".hypothesis/examples"],
                             cwd=ROOT, check=False)
    assert ignored.returncode == 0  # the examples database never enters the repository
