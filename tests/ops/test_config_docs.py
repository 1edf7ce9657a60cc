"""The configuration reference in docs/operator-guide.md is checked against the code.

Every key of the agent's and the controller's configuration dataclasses must
have a row in one of the guide's key tables, and every row must name a key
that exists: the guide can neither fall behind nor invent keys.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest

from agent.config import AgentConfig
from controller.config import ControllerConfig
from tests.conftest import ROOT

pytestmark = pytest.mark.ops

GUIDE = ROOT / "docs" / "operator-guide.md"


def _dataclass_in(hint: object) -> type | None:
    """The dataclass a field holds, directly or as the items of a tuple (an array of tables)."""
    hint = (typing.get_origin(hint) is typing.Annotated and typing.get_args(hint)[0]) or hint
    if dataclasses.is_dataclass(hint):
        return hint  # type: ignore[return-value]
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        item = (typing.get_origin(item) is typing.Annotated and typing.get_args(item)[0]) or item
        if dataclasses.is_dataclass(item):
            return item  # type: ignore[return-value]
    if isinstance(hint, types.UnionType):
        for arg in typing.get_args(hint):
            if dataclasses.is_dataclass(arg):
                return arg  # type: ignore[return-value]
    return None


def config_keys(cls: type, prefix: str = "") -> tuple[set[str], dict[str, set[str]]]:
    """Dotted keys of ``cls``, and the bare keys of each array of tables (by its key)."""
    keys: set[str] = set()
    arrays: dict[str, set[str]] = {}
    hints = typing.get_type_hints(cls, include_extras=True)
    for field in dataclasses.fields(cls):
        key = prefix + field.name
        inner = _dataclass_in(hints[field.name])
        if inner is None:
            keys.add(key)
        elif typing.get_origin(typing.get_args(hints[field.name])[0]
                               if typing.get_origin(hints[field.name]) is typing.Annotated
                               else hints[field.name]) is tuple:
            keys.add(key)
            arrays[key] = {f.name for f in dataclasses.fields(inner)}
        else:
            sub, subarrays = config_keys(inner, key + ".")
            keys |= sub
            arrays |= subarrays
    return keys, arrays


def documented(text: str) -> set[str]:
    """Keys in the first column of the guide's tables, shorthand expanded.

    ``a.b_low`` / ``_high`` is a.b_low and a.b_high; ``a.port`` / ``seconds``
    is a.port and a.seconds.
    """
    keys: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names = re.findall(r"`([^`]+)`", first)
        if not names:
            continue
        head = names[0]
        keys.add(head)
        for other in names[1:]:
            if other.startswith("_"):
                keys.add(head.rsplit("_", 1)[0] + other)
            else:
                keys.add(head.rsplit(".", 1)[0] + "." + other if "." in head else other)
    return keys


def test_every_configuration_key_is_in_the_operator_guide() -> None:
    text = GUIDE.read_text()
    rows = documented(text)
    missing = []
    for cls in (AgentConfig, ControllerConfig):
        keys, arrays = config_keys(cls)
        missing += sorted(k for k in keys if k not in rows)
        for array, fields in arrays.items():
            missing += sorted(f"{array}[].{f}" for f in fields if f not in rows)
    assert not missing, f"not in docs/operator-guide.md's key tables: {missing}"


def test_the_guide_names_no_key_that_does_not_exist() -> None:
    known: set[str] = set()
    for cls in (AgentConfig, ControllerConfig):
        keys, arrays = config_keys(cls)
        known |= keys
        for fields in arrays.values():
            known |= fields
    # Rows of other tables (commands, conditions) are not configuration keys.
    key_like = {k for k in documented(GUIDE.read_text())
                if re.fullmatch(r"[a-z_0-9]+(\.[a-z_0-9]+)+", k)}
    assert key_like - known == set()


def test_the_checker_sees_a_missing_row(tmp_path: Path) -> None:
    text = GUIDE.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `agent.interval`"))
    assert "agent.interval" not in documented(text.replace(row, ""))
    assert {"observers.links.ce_low", "observers.links.ce_high"} <= documented(text)
