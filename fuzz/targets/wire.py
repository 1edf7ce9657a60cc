"""The wire decoder: any frame either decodes, to a message that survives a
round trip unchanged, or raises WireError, and nothing else."""

from __future__ import annotations

import math

from common import OURS, atheris, run

with atheris.instrument_imports(include=OURS):
    from harmonaize.messages import WireError, decode, encode
    from harmonaize.schema import to_plain


def finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(finite(v) for v in value)
    return True


def one(data: bytes) -> None:
    try:
        envelope = decode(data)
    except WireError:
        return
    if not finite(to_plain(envelope.body)):
        raise AssertionError("a decoded message holds a non-finite number")
    again = decode(encode(envelope.body, sender=envelope.sender, seq=envelope.seq,
                          now=envelope.time))
    if again != envelope:
        raise AssertionError("a decoded message changed in a round trip")


if __name__ == "__main__":
    run(one)
