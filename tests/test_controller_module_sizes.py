"""Issue 30, item "no controller module over 400 lines": each module of controller/ fits
in 400 lines, split along a seam (core's handlers, the gateway's streams, redaction's
kinds, the agreement's phases, rules and state), so a change reads in one screenful of
modules rather than one long file."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.controller, pytest.mark.architecture]

CONTROLLER = Path(__file__).resolve().parent.parent / "controller"
LIMIT = 400


def test_no_controller_module_is_over_400_lines() -> None:
    modules = sorted(CONTROLLER.rglob("*.py"))
    assert len(modules) > 40, "the controller's modules were not found"
    long = {str(path.relative_to(CONTROLLER)): n for path in modules
            if (n := len(path.read_text().splitlines())) > LIMIT}
    assert long == {}, f"over {LIMIT} lines: {long}"
