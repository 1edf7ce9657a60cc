"""Writing what a process sends tenants, for checks against the published spec.

With ``HARMONAIZE_WIRE_AUDIT=DIR`` in its environment, a daemon (or the tenant CLI)
also writes every tenant-facing message it encodes, and every CloudEvent the HTTP
gateway makes, to ``DIR/<pid>.jsonl``, a JSON line each. The test suite sets it for
every process it starts and validates the lines against docs/feed.asyncapi.yaml; an
operator can set it to see exactly what a tenant was sent. Unset: nothing is written.
"""

from __future__ import annotations

import json
import os

from harmonaize.messages import codec

ENV = "HARMONAIZE_WIRE_AUDIT"


def install(directory: str | None = None) -> bool:
    """Audit into ``directory`` (default: the environment's); whether auditing is on."""
    directory = directory or os.environ.get(ENV) or None
    if directory is None:
        codec.audit_hook = None
        return False
    path = os.path.join(directory, f"{os.getpid()}.jsonl")

    def write(kind: str, sender: str, plain: object) -> None:
        try:
            line = json.dumps({"kind": kind, "sender": sender, "body": plain})
            with open(path, "a") as out:
                out.write(line + "\n")
        except (OSError, TypeError, ValueError):
            pass  # auditing must never break serving

    codec.audit_hook = write
    return True
