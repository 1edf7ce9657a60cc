"""``harmonaize-slurm``: Slurm's PrologSlurmctld and EpilogSlurmctld, and the replay.

slurmctld runs the program it is named by, without arguments, as SlurmUser, with the
job in its environment (``SLURM_SCRIPT_CONTEXT`` says which of the two it is). At a
job's start it records the job's placement with the controller, at its end it removes
it: spooled first, then delivered (see :mod:`harmonaize.slurm.spool`). It always exits
0: a prolog that fails makes Slurm requeue or hold the job, and no job may suffer for
the controller. What goes wrong is one line in the log file.

Subcommands: ``prolog``, ``epilog`` (default: from ``SLURM_SCRIPT_CONTEXT``) and
``replay`` (deliver what is spooled: the timer's). ``--config PATH`` (default
``/etc/harmonaize/slurm.toml``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

import hostlist

from harmonaize.slurm.hookconfig import IDENT, ConfigError, HookConfig, load
from harmonaize.slurm.spool import DELIVERED, LATER, REJECTED, Round, Sent, Spool

#: A job's nodes (the controller's placements take 4096 members at most).
MAX_NODES = 4096
#: The log is renamed to ``.1`` past this many bytes (one earlier file is kept).
MAX_LOG = 8 * 1024 * 1024
MAX_REPLY = 64 * 1024
#: Controller errors that say "not now" rather than "never": the request stays spooled.
TRANSIENT = ("try again", "disk is full", "too many clients", "permission denied",
             "closed the connection", "leader")
CONTEXTS = {"prolog_slurmctld": "prolog", "epilog_slurmctld": "epilog"}
USAGE = "usage: harmonaize-slurm [--config PATH] [prolog | epilog | replay]"


class Log:
    """Lines to the operator's log file (stderr where it cannot be written)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        line = f"{stamp} harmonaize-slurm[{os.getpid()}]: {text}\n"
        try:
            with open(self.path, "a") as out:
                if out.tell() > MAX_LOG:
                    os.replace(self.path, self.path + ".1")
                out.write(line)
        except OSError:
            sys.stderr.write(line)


def ask(path: str, cmd: str, args: dict[str, Any], timeout: float) -> Sent:
    """One request on the controller's operator socket (line-delimited JSON)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(json.dumps({"cmd": cmd, "args": args}).encode() + b"\n")
            reply = bytearray()
            while not reply.endswith(b"\n") and len(reply) < MAX_REPLY:
                chunk = sock.recv(MAX_REPLY)
                if not chunk:
                    break
                reply += chunk
    except TimeoutError:
        return Sent(LATER, f"the controller did not answer within {timeout:g} s")
    except (FileNotFoundError, ConnectionRefusedError):
        return Sent(LATER, f"the controller is not running ({path})")
    except PermissionError:
        return Sent(LATER, f"no permission to use {path}: is SlurmUser in "
                    "controller.admin_group and controller.scheduler_users?")
    except OSError as exc:
        return Sent(LATER, f"{path}: {exc.strerror or exc}")
    try:
        answer = json.loads(reply)
    except (ValueError, UnicodeDecodeError):
        return Sent(LATER, "the controller closed the connection without a reply")
    if not isinstance(answer, dict):
        return Sent(LATER, "the controller's reply is not an object")
    if answer.get("ok"):
        result = answer.get("result")
        return Sent(DELIVERED, json.dumps(result) if result is not None else "")
    error = str(answer.get("error", "unknown error"))[:300]
    if any(word in error.lower() for word in TRANSIENT):
        return Sent(LATER, f"the controller said: {error}")
    return Sent(REJECTED, error)


def placement(env: Mapping[str, str], cfg: HookConfig) -> tuple[dict[str, Any] | None, str]:
    """The ``place`` request for the job in ``env``, or None and why there is none."""
    job = env.get("SLURM_JOB_ID", "")
    account = env.get("SLURM_JOB_ACCOUNT", "")
    account = "" if account == "(null)" else account
    user = env.get("SLURM_JOB_USER", "")
    tenant = cfg.tenant_of(account, user)
    if tenant == "":
        return None, ""  # the operator's word: not a tenant's job, nothing to say
    if tenant is None:
        return None, (f"account {account or '(none)'!r} and user {user or '(none)'!r} map "
                      "to no tenant in [accounts] or [users]: not placed")
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return None, "no SLURM_JOB_NODELIST: not placed"
    try:
        nodes = hostlist.expand_hostlist(nodelist[:65536])
    except hostlist.BadHostlist as exc:
        return None, f"SLURM_JOB_NODELIST {nodelist[:80]!r} is not a host list ({exc}): " \
                     "not placed"
    if len(nodes) > MAX_NODES:
        return None, f"{len(nodes)} nodes, more than {MAX_NODES}: not placed"
    members = []
    for index, node in enumerate(dict.fromkeys(nodes)):
        host = cfg.host_of(node)
        if not IDENT.fullmatch(host):
            return None, f"node {node[:80]!r} is not a host name the controller takes " \
                         "(map it in [hosts]): not placed"
        # Named in the tenant's terms: the job's node index, its SLURM_NODEID.
        members.append({"name": f"node{index}", "host": host})
    request: dict[str, Any] = {"job": job, "tenant": tenant, "members": members}
    gid = env.get("SLURM_JOB_GID", "")
    if gid.isdigit():
        request["group"] = gid  # the job's processes' group: the agent's check of them
    return request, ""


def deliver(cfg: HookConfig, spool: Spool, log: Log, *, limit: int,
            budget: float) -> Round:
    def send(request: dict[str, Any]) -> Sent:
        remaining = max(0.01, min(cfg.timeout, deadline - time.monotonic()))
        sent = ask(cfg.socket, request["cmd"], request["args"], remaining)
        if sent.outcome is DELIVERED and request["cmd"] == "place":
            unknown = _unknown_hosts(sent.detail)
            if unknown:
                log(f"placed job {request['args'].get('job')}: hosts {', '.join(unknown[:8])} are "
                    "unknown to the controller (no agent there yet, or a node missing "
                    "from [hosts]): placed all the same")
        return sent

    deadline = time.monotonic() + budget
    return spool.deliver(send, limit=limit, deadline=deadline, note=log)


def _unknown_hosts(detail: str) -> list[str]:
    try:
        result = json.loads(detail)
    except ValueError:
        return []
    unknown = result.get("unknown_hosts") if isinstance(result, dict) else None
    return [str(h) for h in unknown] if isinstance(unknown, list) else []


def job_event(kind: str, env: Mapping[str, str], cfg: HookConfig, log: Log) -> None:
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit() or len(job) > 20:
        log(f"{kind}: SLURM_JOB_ID is {job[:40]!r}, not a job id: nothing recorded")
        return
    if kind == "prolog":
        request, why = placement(env, cfg)
        if request is None:
            if why:
                log(f"prolog job {job}: {why}")
            return
        spooled = {"cmd": "place", "args": request}
    else:
        # Always: the map may have changed since the job started, and an unplace of a
        # job the controller does not know counts as done.
        spooled = {"cmd": "unplace", "args": {"job": job, "missing_ok": True}}
    spool = Spool(cfg.spool)
    try:
        spool.put(spooled)
    except OSError as exc:
        log(f"{kind} job {job}: cannot spool to {cfg.spool} ({exc.strerror or exc}): sending "
            "directly, not kept if the controller cannot take it")
        sent = ask(cfg.socket, spooled["cmd"], spooled["args"], cfg.timeout)
        if sent.outcome is not DELIVERED:
            log(f"{kind} job {job}: LOST: {sent.detail}")
        return
    result = deliver(cfg, spool, log, limit=cfg.replay_limit, budget=cfg.budget)
    if result.stopped and result.left:
        log(f"{kind} job {job}: {result.left} request(s) spooled for later: "
            f"{result.stopped}")


def replay(cfg: HookConfig, log: Log) -> int:
    try:
        owner = os.stat(cfg.spool).st_uid
    except OSError as exc:
        log(f"replay: {cfg.spool}: {exc.strerror or exc}")
        return 1
    if owner != os.geteuid():
        # Files it would make (refused requests kept aside) would be another user's, and
        # the prolog, as SlurmUser, could not move them any more.
        log(f"replay: {cfg.spool} is uid {owner}'s: run it as that user "
            "(SlurmUser, as the timer does)")
        return 1
    spool = Spool(cfg.spool)
    result = deliver(cfg, spool, log, limit=1_000_000, budget=max(cfg.budget, 30.0))
    if result.delivered or result.rejected or result.left:
        log(f"replay: {result.delivered} delivered, {result.rejected} refused, "
            f"{result.left} left" + (f" ({result.stopped})" if result.stopped else ""))
    return 0


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    config_path: str | None = None
    if len(args) >= 2 and args[0] == "--config":
        config_path, args = args[1], args[2:]
    kind = args[0] if args else CONTEXTS.get(env.get("SLURM_SCRIPT_CONTEXT", ""), "")
    if args and (len(args) > 1 or kind not in ("prolog", "epilog", "replay")):
        sys.stderr.write(USAGE + "\n")
        return 2
    try:
        cfg = load(config_path)
    except ConfigError as exc:
        Log(HookConfig().log)(f"{kind or 'called'}: {exc}: nothing recorded")
        return 1 if kind == "replay" else 0
    if not kind:
        context = env.get("SLURM_SCRIPT_CONTEXT", "")[:40]
        Log(cfg.log)(f"called with no subcommand and SLURM_SCRIPT_CONTEXT {context!r}: "
                     "name it as PrologSlurmctld or EpilogSlurmctld; nothing recorded")
        return 0
    log = Log(cfg.log)
    try:
        if kind == "replay":
            return replay(cfg, log)
        job_event(kind, env, cfg, log)
    except Exception as exc:  # never fail a job: whatever happened is one line
        log(f"{kind}: unexpected {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
