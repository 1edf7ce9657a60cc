"""``harmonctl``: the operator's command line for the agent and the controller.

It talks to the agent's local socket (default ``/run/harmonaize/agent.sock``),
or with ``-C`` to the controller's admin socket. Every command prints a table,
or JSON with ``--json``.

A package: ``parser`` (the subcommands and the shell completion made from them),
``calls`` (a subcommand as a request to a daemon), ``agent`` and ``controller`` (each
daemon's tables) and ``cli`` (main). The names callers use are re-exported here;
``python -m harmonaize.harmonctl`` runs :func:`main`.
"""

from __future__ import annotations

from harmonaize.harmonctl.calls import TOKEN_COMMANDS, Failure, call
from harmonaize.harmonctl.cli import AGENT_RENDERERS, CONTROLLER_RENDERERS, main, render
from harmonaize.harmonctl.parser import (
    AGENT_SOCKET,
    CONTROLLER_SOCKET,
    DEFAULT_KEYS_DIR,
    LOCAL,
    WATCHABLE,
    build_parser,
    completion_script,
    subcommands,
)

__all__ = ["AGENT_RENDERERS", "AGENT_SOCKET", "CONTROLLER_RENDERERS", "CONTROLLER_SOCKET",
           "DEFAULT_KEYS_DIR", "LOCAL", "TOKEN_COMMANDS", "WATCHABLE", "Failure", "build_parser",
           "call", "completion_script", "main", "render", "subcommands"]
