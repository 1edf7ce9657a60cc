"""Typed conversion between frozen dataclasses and plain msgpack/JSON values.

Every value that arrives from a socket or a file is untrusted. ``from_plain``
rebuilds a dataclass from plain values (dicts, lists, str, numbers) and checks
each field against its annotation, raising :class:`SchemaError` with the path
of the offending field. ``to_plain`` is the inverse for values we produce.

Supported annotations: ``bool``, ``int``, ``float``, ``str``, ``StrEnum``
subclasses, ``tuple[X, ...]``, ``dict[str, X]``, ``X | None``, nested
dataclasses, each optionally wrapped in ``Annotated[..., Str(...)|Num(...)|Len(...)]``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

T = TypeVar("T")

#: Defaults applied to every string, list and map unless a field says otherwise.
DEFAULT_MAX_STR = 1024
DEFAULT_MAX_LIST = 1024
DEFAULT_MAX_MAP = 256
#: Nesting allowed in values we do not interpret (unknown fields are skipped,
#: but still bounded).
MAX_FREE_DEPTH = 8


class SchemaError(ValueError):
    """A value does not match the schema; the message names the field."""


@dataclass(frozen=True)
class Str:
    max_len: int = DEFAULT_MAX_STR
    min_len: int = 0
    pattern: str | None = None
    #: What a value must look like, in words, for the error when it does not.
    expected: str = ""


@dataclass(frozen=True)
class Num:
    lo: float | None = None
    hi: float | None = None


@dataclass(frozen=True)
class Len:
    max_len: int = DEFAULT_MAX_LIST
    min_len: int = 0


IDENT_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:@+-]*"
Ident = Annotated[str, Str(max_len=128, min_len=1, pattern=IDENT_PATTERN)]
"""A name chosen by an operator or tenant: hosts, pools, jobs, tenants."""
Name = Annotated[str, Str(max_len=128, pattern=IDENT_PATTERN)]
"""Like :data:`Ident` but may be empty (a reason not given)."""
Text = Annotated[str, Str(max_len=1024)]
Count = Annotated[int, Num(0, 2**62)]
Seconds = Annotated[float, Num(0.0, 1e9)]
Timestamp = Annotated[float, Num(0.0, 1e11)]
Fraction = Annotated[float, Num(0.0, 1.0)]

Converter = Callable[[Any, str], Any]


def _type_name(value: Any) -> str:
    return type(value).__name__


def _str_converter(limits: Str) -> Converter:
    regex = re.compile(limits.pattern) if limits.pattern else None

    def convert(value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise SchemaError(f"{path}: expected a string, got {_type_name(value)}")
        if len(value) > limits.max_len:
            raise SchemaError(f"{path}: string too long ({len(value)} > {limits.max_len})")
        if len(value) < limits.min_len:
            raise SchemaError(f"{path}: string too short (minimum {limits.min_len})")
        if regex is not None and value and not regex.fullmatch(value):
            if limits.expected:
                raise SchemaError(f"{path}: {value[:40]!r} is not {limits.expected}")
            raise SchemaError(f"{path}: {value[:40]!r} does not match {limits.pattern}")
        return value

    return convert


def _check_range(value: float, limits: Num, path: str) -> None:
    if limits.lo is not None and value < limits.lo:
        raise SchemaError(f"{path}: {value} is below the minimum {limits.lo}")
    if limits.hi is not None and value > limits.hi:
        raise SchemaError(f"{path}: {value} is above the maximum {limits.hi}")


def _int_converter(limits: Num) -> Converter:
    def convert(value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{path}: expected an integer, got {_type_name(value)}")
        _check_range(value, limits, path)
        return value

    return convert


def _float_converter(limits: Num) -> Converter:
    def convert(value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(f"{path}: expected a number, got {_type_name(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaError(f"{path}: number must be finite")
        value = float(value)
        _check_range(value, limits, path)
        return value

    return convert


def _bool_converter(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise SchemaError(f"{path}: expected true or false, got {_type_name(value)}")
    return value


def _enum_converter(cls: type[enum.Enum]) -> Converter:
    allowed = {member.value: member for member in cls}
    choices = ", ".join(sorted(str(v) for v in allowed))

    def convert(value: Any, path: str) -> enum.Enum:
        if isinstance(value, cls):
            return value
        if not isinstance(value, str) or value not in allowed:
            shown = repr(value)[:40]
            raise SchemaError(f"{path}: {shown} is not one of {choices}")
        return allowed[value]

    return convert


def _tuple_converter(item: Converter, limits: Len) -> Converter:
    def convert(value: Any, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise SchemaError(f"{path}: expected a list, got {_type_name(value)}")
        if len(value) > limits.max_len:
            raise SchemaError(f"{path}: list too long ({len(value)} > {limits.max_len})")
        if len(value) < limits.min_len:
            raise SchemaError(f"{path}: list too short (minimum {limits.min_len})")
        return tuple(item(v, f"{path}[{i}]") for i, v in enumerate(value))

    return convert


def _dict_converter(key: Converter, item: Converter, limits: Len) -> Converter:
    def convert(value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected a map, got {_type_name(value)}")
        if len(value) > limits.max_len:
            raise SchemaError(f"{path}: map too large ({len(value)} > {limits.max_len})")
        return {key(k, f"{path} key"): item(v, f"{path}[{k!s:.40}]") for k, v in value.items()}

    return convert


def _optional_converter(inner: Converter) -> Converter:
    def convert(value: Any, path: str) -> Any:
        return None if value is None else inner(value, path)

    return convert


def _converter_for(annotation: Any) -> Converter:
    meta: tuple[Any, ...] = ()
    if typing.get_origin(annotation) is Annotated:
        annotation, *rest = typing.get_args(annotation)
        meta = tuple(rest)
    str_limits = next((m for m in meta if isinstance(m, Str)), Str())
    num_limits = next((m for m in meta if isinstance(m, Num)), Num())
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"only X | None unions are supported, not {annotation}")
        return _optional_converter(_converter_for(args[0]))
    if origin is tuple:
        args = typing.get_args(annotation)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"only tuple[X, ...] is supported, not {annotation}")
        len_limits = next((m for m in meta if isinstance(m, Len)), Len())
        return _tuple_converter(_converter_for(args[0]), len_limits)
    if origin is dict:
        key_type, value_type = typing.get_args(annotation)
        len_limits = next((m for m in meta if isinstance(m, Len)), Len(DEFAULT_MAX_MAP))
        return _dict_converter(_converter_for(key_type), _converter_for(value_type), len_limits)
    if annotation is bool:
        return _bool_converter
    if annotation is int:
        return _int_converter(num_limits)
    if annotation is float:
        return _float_converter(num_limits)
    if annotation is str:
        return _str_converter(str_limits)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum_converter(annotation)
    if dataclasses.is_dataclass(annotation):
        cls = annotation

        def convert(value: Any, path: str) -> Any:
            return from_plain(cls, value, path)

        return convert
    raise TypeError(f"unsupported annotation {annotation!r}")


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    convert: Converter
    required: bool


_SPECS: dict[type, tuple[_FieldSpec, ...]] = {}


def _specs(cls: type) -> tuple[_FieldSpec, ...]:
    specs = _SPECS.get(cls)
    if specs is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        specs = tuple(
            _FieldSpec(
                f.name,
                _converter_for(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
            if f.init
        )
        _SPECS[cls] = specs
    return specs


def check_depth(value: Any, path: str, limit: int = MAX_FREE_DEPTH) -> None:
    """Reject values nested deeper than ``limit`` (for data we do not interpret)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= limit:
                raise SchemaError(f"{path}: nested deeper than {limit} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


_STRICT: ContextVar[bool] = ContextVar("strict_keys", default=False)


@contextmanager
def strict_keys() -> Iterator[None]:
    """Within it, unknown keys are errors at every level (for requests from people,
    where a typo must be named rather than ignored)."""
    token = _STRICT.set(True)
    try:
        yield
    finally:
        _STRICT.reset(token)


def from_plain(cls: type[T], value: Any, path: str | None = None) -> T:
    """Build ``cls`` from untrusted plain values.

    Unknown keys are skipped (a newer peer may add fields) unless the class sets
    ``STRICT_KEYS = True``, as configuration does, where a typo must be named, or
    the call is made under :func:`strict_keys`.
    """
    path = cls.__name__ if path is None else path
    if not isinstance(value, dict):
        raise SchemaError(f"{path or cls.__name__}: expected a map, got {_type_name(value)}")
    specs = _specs(cls)
    known = {spec.name for spec in specs}
    strict = getattr(cls, "STRICT_KEYS", False) or _STRICT.get()
    for key in value:
        if not isinstance(key, str):
            raise SchemaError(f"{path or cls.__name__}: field names must be strings")
        if key not in known:
            if strict:
                raise SchemaError(f"{_join(path, key[:60])}: unknown key")
            check_depth(value[key], _join(path, key[:40]))
    kwargs: dict[str, Any] = {}
    for spec in specs:
        if spec.name in value:
            kwargs[spec.name] = spec.convert(value[spec.name], _join(path, spec.name))
        elif spec.required:
            raise SchemaError(f"{_join(path, spec.name)}: required field is missing")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # __post_init__ checks across fields
        raise SchemaError(f"{path or cls.__name__}: {exc}") from None


def to_plain(value: Any) -> Any:
    """Turn a dataclass tree into dicts, lists and scalars for msgpack or JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.init
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def validated(value: T) -> T:
    """Round-trip a value we built through the checks applied to untrusted input."""
    return from_plain(type(value), to_plain(value))
