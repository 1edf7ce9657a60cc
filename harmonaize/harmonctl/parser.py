"""harmonctl's command line: its sockets, every subcommand and its options, and the
shell completion shtab generates from the same parser.
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

import shtab

from harmonaize.schedulertables import SCHEDULER_COMMANDS

AGENT_SOCKET = "/run/harmonaize/agent.sock"


CONTROLLER_SOCKET = "/run/harmonaize/controller.sock"


DEFAULT_KEYS_DIR = "/etc/harmonaize/keys"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON instead of a table")
    parser = argparse.ArgumentParser(
        prog="harmonctl", parents=[common],
        description="Operator CLI for the HarmonAIze agent (local socket) and controller (-C).",
    )
    parser.add_argument("-s", "--socket",
                        default=os.environ.get("HARMONCTL_SOCKET", AGENT_SOCKET),
                        help="agent socket (default %(default)s, or $HARMONCTL_SOCKET)",
                        ).complete = shtab.FILE  # type: ignore[attr-defined]
    parser.add_argument("-C", "--controller", nargs="?", metavar="ADMIN_SOCKET",
                        const=os.environ.get("HARMONCTL_ADMIN_SOCKET", CONTROLLER_SOCKET),
                        help="talk to the controller's admin socket instead "
                        f"(default {CONTROLLER_SOCKET}, or $HARMONCTL_ADMIN_SOCKET)",
                        ).complete = SOCKET_OR_COMMAND  # type: ignore[attr-defined]
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a reply")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("status", parents=[common], help="agent (or controller) status")
    sub.add_parser("links", parents=[common], help="link rates, traffic classes, congestion")
    sub.add_parser("rdma", parents=[common],
                   help="RDMA ports' counters; congestion control's values and why")
    sub.add_parser("gpus", parents=[common], help="GPU telemetry, counters, state and jobs")
    sub.add_parser("health", parents=[common],
                   help="why the host and each GPU are in their state, and what to do")
    sub.add_parser("energy", parents=[common],
                   help="power limits per GPU: set, original, draw, energy saved, and why")
    job_health = sub.add_parser("job-health", parents=[common],
                                help="jobs' communicators here: counts, finding, cause, the "
                                "ranks behind with pid and process state")
    job_health.add_argument("--job", default=None, help="only this job")
    drain = sub.add_parser("drain", parents=[common],
                           help="withdraw this host (or one GPU, --gpu) from capacity")
    drain.add_argument("--reason", default="drained by operator")
    drain.add_argument("--gpu", type=int, help="drain only this GPU (quarantine it)")
    validate = sub.add_parser("validate", parents=[common],
                              help="validate a GPU (--gpu N) or the host (--host)")
    target = validate.add_mutually_exclusive_group(required=True)
    target.add_argument("--gpu", type=int)
    target.add_argument("--host", action="store_true")
    validate.add_argument("--level", type=int, choices=(1, 2, 3))
    validations = sub.add_parser("validations", parents=[common],
                                 help="validation history and what is running or waiting")
    validations.add_argument("--limit", type=int, default=20)
    release = sub.add_parser("release", parents=[common],
                             help="validate a quarantined GPU and release it if it passes")
    release.add_argument("--gpu", type=int, required=True)
    release.add_argument("--force", action="store_true", help="release without validating")
    declare = sub.add_parser("declare", parents=[common],
                             help="set a job's declaration on this host from a JSON file")
    declare.add_argument("file", type=argparse.FileType("r")).complete = (  # type: ignore[attr-defined]
        shtab.FILE)
    declare.add_argument("--group", default=None,
                         help="Unix group (name or number) of the job's processes here: only "
                         "its members may read and follow the job's tuner policy")
    sub.add_parser("undrain", parents=[common], help="return this host to capacity")
    remediation = sub.add_parser("remediation", parents=[common],
                                 help="GPU remediation: phases, holds, steps; cancel, resume, "
                                 "clear (RMA)")
    remediation.add_argument("action", nargs="?", default="status",
                             choices=("status", "cancel", "resume", "clear"))
    remediation.add_argument("--gpu", type=int)
    remediation.add_argument("--limit", type=int, default=20)
    sub.add_parser("reload", parents=[common],
                   help="make the agent (-C: the controller) re-read its configuration")
    sub.add_parser("hosts", parents=[common], help="(controller) every known host")
    sub.add_parser("capacity", parents=[common], help="(controller) tenant-visible capacity")
    events = sub.add_parser("events", parents=[common], help="(controller) recent host events")
    sub.add_parser("jobs", parents=[common],
                   help="declared jobs and their tuning choice (-C: jobs' placements)")
    policy = sub.add_parser("policy", parents=[common],
                            help="a job's declaration, policy, reason and history")
    policy.add_argument("job")
    place = sub.add_parser("place", parents=[common],
                           help="(controller) record a job's placement from a JSON file: "
                           '{"job", "tenant", "members": [{"name", "host"}]}')
    place.add_argument("file", type=argparse.FileType("r")).complete = (  # type: ignore[attr-defined]
        shtab.FILE)
    unplace = sub.add_parser("unplace", parents=[common], help="(controller) forget a job")
    unplace.add_argument("job")
    events.add_argument("--limit", type=int, default=50)
    sub.add_parser("feed", parents=[common],
                   help="(controller) tenant subscribers: topics, sent, dropped")
    sub.add_parser("tenants", parents=[common],
                   help="(controller) tenants: key, jobs, declarations, subscribers")
    sub.add_parser("pools", parents=[common], help="(controller) pools: hosts and GPUs")
    sub.add_parser("privacy", parents=[common],
                   help="(controller) the private feed's ε spent per pool over 24 h")
    sub.add_parser("job-findings", parents=[common],
                   help="(controller) jobs' hangs, stalls, stragglers and application XIDs, "
                   "with hosts, and their recent history")
    token = sub.add_parser("token", parents=[common],
                           help="(controller) tenants' HTTP gateway tokens: issue, list, revoke")
    token_sub = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    issue = token_sub.add_parser("issue", parents=[common],
                                 help="issue a tenant a bearer token (shown once)")
    issue.add_argument("--tenant", required=True)
    issue.add_argument("--days", type=float, default=90.0, help="valid this long (default 90)")
    issue.add_argument("--note", default="", help="what it is for, for the list")
    token_sub.add_parser("list", parents=[common], help="every token, without secrets")
    revoke = token_sub.add_parser("revoke", parents=[common], help="revoke a token by its id")
    revoke.add_argument("id")
    holds = sub.add_parser("holds", parents=[common],
                           help="(controller) tenants' capacity holds: list; cancel ID "
                           "(TENANT/REQUEST, charged to nobody)")
    holds.add_argument("action", nargs="?", default="list", choices=("list", "cancel"))
    holds.add_argument("id", nargs="?", help="the hold, for cancel: TENANT/REQUEST")
    scheduler = sub.add_parser(
        "scheduler", parents=[common],
        help="(controller) drains in the provider's scheduler: view; cancel or release a "
        "node; pause or resume all")
    scheduler.add_argument("action", nargs="?", default="view", choices=tuple(SCHEDULER_COMMANDS),
                           help="view (default); cancel NODE: leave it alone until release "
                           "NODE; pause: leave every node alone until resume")
    scheduler.add_argument("node", nargs="?", help="the node, for cancel and release")
    keygen = sub.add_parser("keygen", parents=[common],
                            help="make a CurveZMQ key pair (local: talks to no daemon)")
    keygen.add_argument("name", help="controller, a host id, or a tenant name")
    keygen.add_argument("--dir", type=Path, default=Path(DEFAULT_KEYS_DIR),
                        help="where to write NAME.key and NAME.key_secret (default %(default)s)",
                        ).complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    sub.add_parser("help", parents=[common], help="commands the server offers")
    watch = sub.add_parser("watch", parents=[common],
                           help="redraw a read-only command every second until Ctrl-C "
                           "(--json: one JSON line per update)")
    watch.add_argument("watched", nargs="?", default="status", choices=WATCHABLE,
                       metavar="COMMAND", help="what to show (default status)")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between updates")
    watch.add_argument("--count", type=int, help="stop after this many updates")
    watch.add_argument("--limit", type=int, help="with events or validations: how many")
    completion = sub.add_parser("completion", parents=[common],
                                help="print a shell completion script (local)")
    completion.add_argument("shell", choices=("bash", "zsh"))
    return parser


#: Commands ``watch`` may repeat: they only read.
WATCHABLE = ("status", "links", "rdma", "gpus", "health", "validations", "remediation",
             "hosts", "capacity", "events", "jobs", "feed", "tenants", "pools", "privacy",
             "energy", "scheduler", "job-health", "job-findings", "holds")


#: Commands answered by harmonctl itself, without a daemon.
LOCAL = ("keygen", "watch", "completion")


def normalize(argv: list[str]) -> list[str]:
    """``-C hosts`` means the default admin socket, not a socket named "hosts"."""
    commands = set(command_names())
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg in ("-C", "--controller") and out[i + 1] in commands:
            out[i] = "--controller=" + os.environ.get("HARMONCTL_ADMIN_SOCKET",
                                                      CONTROLLER_SOCKET)
    return out


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_names() -> list[str]:
    return list(subcommands(build_parser()))


#: ``-C`` takes an optional admin socket: after it, offer the commands and files.
SOCKET_OR_COMMAND = {"bash": "_harmonctl_socket_or_command", "zsh": "_files"}


def completion_script(shell: str) -> str:
    """The shell's completion script, generated by shtab from the parser itself, so it
    never falls behind the CLI (commands, options, choices, files where a path goes)."""
    preamble = {"bash": "_harmonctl_socket_or_command() {\n"
                        f"    compgen -W {shlex.quote(' '.join(command_names()))} -- \"$1\"\n"
                        "    compgen -f -- \"$1\"\n}\n"}.get(shell, "")
    return shtab.complete(build_parser(), shell=shell, preamble=preamble)
