"""The mutation score is taken against test files that exist: a split test file's parts
all listed, none left stale (module sizes, tests' too: test_sizes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.mutation import MODULES

pytestmark = [pytest.mark.redesign, pytest.mark.architecture]

ROOT = Path(__file__).resolve().parents[2]
def test_mutation_scores_each_module_against_test_files_that_exist() -> None:
    listed = {test.split("::")[0] for tests in MODULES.values() for test in tests}
    assert sorted(name for name in listed if not (ROOT / name).is_file()) == []

