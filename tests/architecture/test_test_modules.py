"""The tests' own layout holds: no test module over 400 lines, and the mutation score is
taken against test files that exist (a split file's parts all listed, none left stale)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.mutation import MODULES

pytestmark = [pytest.mark.redesign, pytest.mark.architecture]

ROOT = Path(__file__).resolve().parents[2]
#: A module longer than this is split along the seams of what its tests show.
MAX_LINES = 400


def long_modules(root: Path) -> list[str]:
    """Every Python module under ``root`` longer than MAX_LINES, with its length."""
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            out.append(f"{path.relative_to(root)}: {lines} lines")
    return out


def test_no_test_module_is_over_400_lines() -> None:
    assert long_modules(ROOT / "tests") == []


def test_the_size_check_sees_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "test_short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "test_long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules(tmp_path) == [f"deep/test_long.py: {MAX_LINES + 1} lines"]


def test_mutation_scores_each_module_against_test_files_that_exist() -> None:
    listed = {test.split("::")[0] for tests in MODULES.values() for test in tests}
    assert sorted(name for name in listed if not (ROOT / name).is_file()) == []

