"""JSON Schema read off the wire's types: the same annotations (``Annotated`` limits,
``#:`` comments, defaults) that :func:`harmonaize.schema.from_plain` enforces become the
schema a client generates from. :mod:`harmonaize.spec` assembles the published document
from these schemas."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import types
import typing
from typing import Annotated, Any

from harmonaize.schema import DEFAULT_MAX_LIST, DEFAULT_MAX_MAP, DEFAULT_MAX_STR, Len, Num, Str

SCHEMAS = "#/components/schemas/"


def _pattern(regex: str, min_len: int) -> str:
    # Python's from_plain applies the pattern to non-empty strings only.
    return f"^(?:{regex})$" if min_len > 0 else f"^(?:{regex})?$"


class Builder:
    def __init__(self) -> None:
        self.schemas: dict[str, dict[str, Any]] = {}

    def of(self, annotation: Any) -> dict[str, Any]:
        meta: tuple[Any, ...] = ()
        if typing.get_origin(annotation) is Annotated:
            annotation, *rest = typing.get_args(annotation)
            meta = tuple(rest)
        strs = next((x for x in meta if isinstance(x, Str)), Str())
        nums = next((x for x in meta if isinstance(x, Num)), Num())
        origin = typing.get_origin(annotation)
        if origin in (typing.Union, types.UnionType):
            (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
            return {"anyOf": [self.of(inner), {"type": "null"}]}
        if origin is tuple:
            lens = next((x for x in meta if isinstance(x, Len)), Len())
            out = {"type": "array", "items": self.of(typing.get_args(annotation)[0]),
                   "maxItems": lens.max_len or DEFAULT_MAX_LIST}
            if lens.min_len:
                out["minItems"] = lens.min_len
            return out
        if origin is dict:
            lens = next((x for x in meta if isinstance(x, Len)), Len(DEFAULT_MAX_MAP))
            return {"type": "object", "additionalProperties": self.of(
                typing.get_args(annotation)[1]), "maxProperties": lens.max_len}
        if annotation is bool:
            return {"type": "boolean"}
        if annotation in (int, float):
            out = {"type": "integer" if annotation is int else "number"}
            if nums.lo is not None:
                out["minimum"] = nums.lo
            if nums.hi is not None:
                out["maximum"] = nums.hi
            return out
        if annotation is str:
            out = {"type": "string", "maxLength": strs.max_len or DEFAULT_MAX_STR}
            if strs.min_len:
                out["minLength"] = strs.min_len
            if strs.pattern:
                out["pattern"] = _pattern(strs.pattern, strs.min_len)
            return out
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            return {"$ref": SCHEMAS + self.enum(annotation)}
        if dataclasses.is_dataclass(annotation):
            return {"$ref": SCHEMAS + self.object(annotation)}
        raise TypeError(f"no JSON Schema for {annotation!r}")

    def enum(self, cls: type[enum.Enum]) -> str:
        if cls.__name__ not in self.schemas:
            self.schemas[cls.__name__] = {"type": "string", "enum": [e.value for e in cls]}
            if first_paragraph(cls):
                self.schemas[cls.__name__]["description"] = first_paragraph(cls)
        return cls.__name__

    def object(self, cls: type) -> str:
        name = cls.__name__
        if name in self.schemas:
            return name
        self.schemas[name] = {}  # a placeholder while its fields are built
        hints = typing.get_type_hints(cls, include_extras=True)
        props: dict[str, Any] = {}
        required = []
        docs = _field_docs(cls)
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            schema = self.of(hints[field.name])
            if "$ref" in schema:  # a $ref's siblings are ignored: wrap it to add to it
                schema = {"allOf": [schema]}
            if field.name in docs:
                schema = {"description": docs[field.name], **schema}
            if field.default is dataclasses.MISSING and (
                    field.default_factory is dataclasses.MISSING):
                required.append(field.name)
            elif field.default is not dataclasses.MISSING:
                schema = {**schema, "default": _plain_default(field.default)}
            if schema.keys() == {"allOf"}:
                schema = schema["allOf"][0]
            props[field.name] = schema
        out: dict[str, Any] = {"type": "object"}
        if first_paragraph(cls):
            out["description"] = first_paragraph(cls)
        out["properties"] = props
        if required:
            out["required"] = required
        kind = getattr(cls, "KIND", None)
        if kind is not None:
            out["x-kind"] = kind
            out["x-category"] = cls.CATEGORY.value
        self.schemas[name] = out
        return name


def reachable(build: Builder, roots: list[str]) -> set[str]:
    """The object schemas reachable from ``roots`` through $refs."""
    seen: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(SCHEMAS):
                visit(ref.removeprefix(SCHEMAS))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    def visit(name: str) -> None:
        schema = build.schemas.get(name, {})
        if name not in seen and schema.get("type") == "object":
            seen.add(name)
            walk(schema)

    for root in roots:
        visit(root)
    return seen


def first_paragraph(obj: type) -> str:
    text = (obj.__doc__ or "").strip()
    if text.startswith(f"{obj.__name__}("):
        return ""  # the signature dataclasses write when a class has no docstring
    return " ".join(line.strip() for line in text.split("\n\n")[0].splitlines())


def _field_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comments above each field in the class's source (what its reader sees)."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"([a-z_][a-z0-9_]*)\s*:", stripped)
        if match and pending:
            docs[match.group(1)] = " ".join(pending)
        pending = []
    return docs


def _plain_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {f.name: _plain_default(getattr(value, f.name))
                for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain_default(v) for v in value]
    return value


def ref(name: str) -> dict[str, str]:
    return {"$ref": SCHEMAS + name}
