"""Request bodies as the HTTP gateway takes them: JSON bounded in size and depth, then
a declaration or a notice's answer, strictly. Only BodyError and SchemaError may come
out (each a 400 in one line), and nothing decoded nests deeper than the bound."""

from __future__ import annotations

from common import OURS, atheris, run

with atheris.instrument_imports(include=OURS):
    from controller.gateway.bodies import MAX_DEPTH, BodyError, decode_json
    from harmonaize.messages import JobDeclaration, ValidationAnswer
    from harmonaize.schema import SchemaError, check_depth, from_plain, strict_keys


def one(data: bytes) -> None:
    try:
        value = decode_json(data)
    except BodyError as exc:
        if "\n" in str(exc):
            raise AssertionError(f"a refusal of more than one line: {exc!s:.200}") from None
        return
    check_depth(value, "body", MAX_DEPTH)  # a SchemaError here is a finding
    for cls in (JobDeclaration, ValidationAnswer):
        candidate = {**value, "notice": "n1"} if cls is ValidationAnswer and \
            isinstance(value, dict) else value
        try:
            with strict_keys():
                from_plain(cls, candidate, cls.KIND)
        except SchemaError:
            pass


if __name__ == "__main__":
    run(one)
