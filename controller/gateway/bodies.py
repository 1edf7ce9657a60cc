"""Request bodies as the gateway takes them: strict JSON, bounded in size and depth.

No I/O, so the fuzz target and the handlers share it. The size is bounded before
anything is decoded (aiohttp's ``client_max_size``, and :data:`MAX_BODY` here again);
the depth after, because the standard decoder already refuses what would exhaust its
own stack (a RecursionError, answered like any other bad body) and nothing a tenant
may send nests deeper than :data:`MAX_DEPTH`. JSON's non-standard constants (NaN,
Infinity) are refused too: a NaN compares false with every bound a field has.
"""

from __future__ import annotations

import json
from typing import Any

from harmonaize.messages import MAX_FRAME
from harmonaize.schema import SchemaError, check_depth

#: The largest body read (the same as the largest frame on the ZeroMQ feed).
MAX_BODY = MAX_FRAME
#: Declarations and answers nest a few levels; anything deeper is not one of ours.
MAX_DEPTH = 32


class BodyError(ValueError):
    """A body that is not JSON we take; the message says why, in one line."""


def _no_constant(name: str) -> Any:
    raise BodyError(f"not JSON: {name} is not a JSON number")


def decode_json(raw: bytes) -> Any:
    """The JSON value of a request body, or :class:`BodyError` saying what is wrong."""
    if len(raw) > MAX_BODY:
        raise BodyError(f"a body larger than {MAX_BODY} bytes")
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise BodyError(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, BodyError):
            raise
        raise BodyError(f"not JSON: {_first_line(exc)}") from None
    try:
        check_depth(value, "body", MAX_DEPTH)
    except SchemaError:
        raise BodyError(f"nested deeper than {MAX_DEPTH} levels") from None
    return value


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
