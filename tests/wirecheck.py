"""Checks what the suite's processes sent tenants against the published spec.

Every process of the suite runs with ``HARMONAIZE_WIRE_AUDIT`` set, so each
tenant-facing message it encodes (and each CloudEvent the HTTP gateway makes) is also
written to the audit directory. After every test, :class:`Audit` reads what is new and
validates it against ``docs/feed.asyncapi.yaml`` as published, made strict: a field the
spec does not name fails too, so the spec and the code cannot drift apart unnoticed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SPEC = Path(__file__).resolve().parent.parent / "docs" / "feed.asyncapi.yaml"


@cache
def spec() -> dict[str, Any]:
    return yaml.safe_load(SPEC.read_text())


def _strict(node: Any) -> Any:
    """The schemas with every object closed to fields they do not name."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@cache
def _validator(schema_name: str) -> jsonschema.Draft7Validator:
    components = _strict(copy.deepcopy(spec()["components"]))
    root = {"$ref": f"#/components/schemas/{schema_name}", "components": components}
    return jsonschema.Draft7Validator(root)


def schema_of(kind: str) -> str:
    """The schema name the spec gives a message kind."""
    payload = spec()["components"]["messages"][kind]["payload"]["$ref"]
    return payload.rsplit("/", 1)[1]


def problems(kind: str, body: Any) -> list[str]:
    """What is wrong with one audited message (nothing: it conforms)."""
    if kind == "cloudevent":
        found = [f"cloudevent: {e.message}" for e in _validator("CloudEvent").iter_errors(body)]
        inner = str(body.get("type", "")).removeprefix("io.harmonaize.feed.").rsplit(".v", 1)[0]
        if inner not in spec()["components"]["messages"] and inner != "subscribed":
            return [*found, f"cloudevent: type {body.get('type')!r} is not in the spec"]
        name = "Subscribed" if inner == "subscribed" else schema_of(inner)
        return found + [f"cloudevent {inner}.data: {e.message}"
                        for e in _validator(name).iter_errors(body.get("data"))]
    if kind not in spec()["components"]["messages"]:
        return [f"kind {kind!r} is sent to tenants but not in the spec"]
    return [f"{kind}: {e.message}" for e in _validator(schema_of(kind)).iter_errors(body)]


class Audit:
    """Reads an audit directory incrementally."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._read: dict[Path, int] = {}
        self.checked = 0

    def new(self) -> Iterator[dict[str, Any]]:
        for path in sorted(self.directory.glob("*.jsonl")):
            with path.open() as lines:
                lines.seek(self._read.get(path, 0))
                for line in iter(lines.readline, ""):
                    if line.endswith("\n"):
                        yield json.loads(line)
                        self._read[path] = lines.tell()

    def check(self) -> list[str]:
        """Problems in what was written since the last check (at most a few shown)."""
        found: list[str] = []
        for record in self.new():
            self.checked += 1
            found += problems(record["kind"], record["body"])
        return found
