"""A subcommand as a request to a daemon: its command name and arguments, and one call
over the operator socket whose every failure becomes a line that says what to do.
"""

from __future__ import annotations

import argparse
import errno
import json
from typing import Any

from harmonaize.opsocket import CommandError, request
from harmonaize.schedulertables import SCHEDULER_COMMANDS


def args_for(ns: argparse.Namespace) -> dict[str, Any]:
    if ns.command == "drain":
        return {"reason": ns.reason, **({"gpu": ns.gpu} if ns.gpu is not None else {})}
    if ns.command == "events":
        return {"limit": ns.limit}
    if ns.command == "validate":
        args: dict[str, Any] = {"host": True} if ns.host else {"gpu": ns.gpu}
        return {**args, **({"level": ns.level} if ns.level else {})}
    if ns.command == "validations":
        return {"limit": ns.limit}
    if ns.command == "release":
        return {"gpu": ns.gpu, "force": ns.force}
    if ns.command == "remediation":
        if ns.action == "status":
            return {"limit": ns.limit}
        if ns.gpu is None:
            raise SystemExit(f"harmonctl: remediation {ns.action} needs --gpu N")
        return {"gpu": ns.gpu}
    if ns.command == "declare":
        declaration = json_file(ns.file)
        if ns.group is not None and isinstance(declaration, dict):
            declaration = {**declaration, "group": ns.group}
        return {"declaration": declaration}
    if ns.command == "place":
        placement = json_file(ns.file)
        if not isinstance(placement, dict):
            raise SystemExit(f"harmonctl: {ns.file.name}: expected a JSON object")
        return placement
    if ns.command == "job-health":
        return {"job": ns.job} if ns.job else {}
    if ns.command in ("unplace", "policy"):
        return {"job": ns.job}
    if ns.command == "token" and ns.action == "issue":
        return {"tenant": ns.tenant, "days": ns.days, "note": ns.note}
    if ns.command == "token" and ns.action == "revoke":
        return {"id": ns.id}
    if ns.command == "holds" and ns.action == "cancel":
        tenant, _, request_id = (ns.id or "").partition("/")
        if not tenant or not request_id:
            raise SystemExit("harmonctl: holds cancel needs an ID: TENANT/REQUEST (see "
                             "harmonctl -C holds)")
        return {"tenant": tenant, "request_id": request_id}
    if ns.command == "scheduler" and ns.action in ("cancel", "release"):
        if not ns.node:
            raise SystemExit(f"harmonctl: scheduler {ns.action} needs a NODE")
        return {"node": ns.node}
    return {}


#: ``token ACTION`` is one of three admin commands.
TOKEN_COMMANDS = {"issue": "token-issue", "list": "tokens", "revoke": "token-revoke"}


def daemon_command(ns: argparse.Namespace) -> str:
    if ns.command == "scheduler":
        return SCHEDULER_COMMANDS[ns.action]
    if ns.command == "holds":
        return "holds-cancel" if ns.action == "cancel" else "holds"
    if ns.command == "remediation" and ns.action != "status":
        return f"remediation-{ns.action}"
    return TOKEN_COMMANDS[ns.action] if ns.command == "token" else ns.command


def json_file(file: Any) -> Any:
    try:
        return json.load(file)
    except ValueError as exc:
        raise SystemExit(f"harmonctl: {file.name}: not JSON: {exc}") from None


class Failure(Exception):
    """Talking to a daemon failed; the message says what to do about it."""


def call(ns: argparse.Namespace, command: str, args: dict[str, Any]) -> Any:
    """One request to the agent (or with -C the controller); raises :class:`Failure`."""
    path = ns.controller or ns.socket
    who = "controller" if ns.controller else "agent"
    try:
        return request(path, command, args, timeout=ns.timeout)
    except FileNotFoundError:
        raise Failure(f"no {who} socket at {path}: is harmonaize-{who} running?") from None
    except PermissionError:
        raise Failure(f"permission denied on {path}: use root, or join the socket's group "
                      "(harmonaize)") from None
    except ConnectionRefusedError:
        raise Failure(f"{path} refuses connections: harmonaize-{who} is not running") from None
    except TimeoutError:
        raise Failure(f"the {who} did not answer within {ns.timeout:g} s") from None
    except CommandError as exc:
        message = str(exc)
        if message == "permission denied":  # the daemon's verdict on our uid and groups
            message += ": use root, or join the socket's group (harmonaize)"
        raise Failure(message) from None
    except OSError as exc:
        reason = errno.errorcode.get(exc.errno or 0, "error")
        raise Failure(f"cannot talk to {path}: {exc.strerror or reason}") from None
    except ValueError as exc:  # not JSON: something else listens there
        raise Failure(f"{path} did not answer in the operator protocol: {exc}") from None
