"""Cursors as the HTTP gateway reads them (``Last-Event-ID``, ``?since=``): every text
is a cursor in range that reads back as itself, or a one-line CursorError."""

from __future__ import annotations

from common import OURS, atheris, run

with atheris.instrument_imports(include=OURS):
    from controller.gateway.events import MAX_EPOCH, MAX_OFFSET, Cursor, CursorError


def one(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    try:
        cursor = Cursor.parse(text)
    except CursorError as exc:
        if "\n" in str(exc):
            raise AssertionError(f"a refusal of more than one line: {exc!s:.200}") from None
        return
    if not (0 <= cursor.epoch <= MAX_EPOCH and 0 <= cursor.pool <= MAX_OFFSET
            and 0 <= cursor.job <= MAX_OFFSET):
        raise AssertionError(f"{text!r:.100} gave {cursor} out of range")
    if Cursor.parse(str(cursor)) != cursor:
        raise AssertionError(f"{cursor} does not read back as itself")


if __name__ == "__main__":
    run(one)
