"""The shared trees' splits (the wire vocabulary by family, harmonctl by part, the
simulator by model step) whole: every name where it was, every kind registered once,
every subcommand offered (sizes and the harness's imports: test_sizes.py, test_imports.py).

Read from the source where the rule is about the source; run as real processes where it
is about what runs (``python -m``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from harmonaize import messages
from harmonaize.harmonctl import (
    AGENT_RENDERERS,
    CONTROLLER_RENDERERS,
    TOKEN_COMMANDS,
    build_parser,
    subcommands,
)
from harmonaize.schedulertables import SCHEDULER_COMMANDS
from sim.engine import Simulation
from tests.conftest import python

pytestmark = pytest.mark.architecture

ROOT = Path(__file__).resolve().parents[2]
#: The trees this layout's rules cover; the first four are installed or imported by the
#: daemons, testbed/ and fuzz/ are the harness around them.
def family_modules() -> list[str]:
    return [f"harmonaize.messages.{info.name}"
            for info in pkgutil.iter_modules(messages.__path__)]


@pytest.mark.foundation
@pytest.mark.parametrize("module", family_modules())
def test_harmonaize_messages_re_exports_every_public_name_of_each_family(module: str) -> None:
    family = importlib.import_module(module)
    tree = ast.parse(inspect.getsource(family))
    defined = {target.id for node in tree.body if isinstance(node, ast.Assign | ast.AnnAssign)
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(target, ast.Name)}
    defined |= {node.name for node in tree.body
                if isinstance(node, ast.ClassDef | ast.FunctionDef)}
    public = {name for name in defined if not name.startswith("_")} - {"T", "audit_hook"}
    missing = sorted(name for name in public if getattr(messages, name, None)
                     is not getattr(family, name))
    assert not missing, f"{module} defines {missing}, not re-exported by harmonaize.messages"
    assert public <= set(messages.__all__)


@pytest.mark.foundation
def test_every_registered_kind_is_importable_from_harmonaize_messages() -> None:
    for kind, cls in messages.kinds().items():
        assert getattr(messages, cls.__name__) is cls, kind


@pytest.mark.foundation
@pytest.mark.parametrize("module", family_modules())
def test_importing_one_family_first_registers_every_kind_once(module: str) -> None:
    """A process that imports one family before anything else (a tool, a fuzz target)
    gets the whole vocabulary, each kind registered once, with no import cycle."""
    script = f"import {module}\nfrom harmonaize import messages\nprint(len(messages.kinds()))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(messages.kinds())


@pytest.mark.ops
def test_harmonctl_runs_as_a_module_with_every_subcommand_in_its_completion() -> None:
    names = set(subcommands(build_parser()))
    done = subprocess.run(python("harmonaize.harmonctl", "completion", "bash"),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    offered = {word.strip("'\"()") for word in done.stdout.split()}
    assert names <= offered, f"missing from the completion: {sorted(names - offered)}"


@pytest.mark.ops
def test_every_harmonctl_table_belongs_to_a_subcommand_the_parser_offers() -> None:
    # What a daemon is asked for: a subcommand, or what a subcommand's action becomes.
    asked = (set(subcommands(build_parser())) | set(SCHEDULER_COMMANDS.values())
             | set(TOKEN_COMMANDS.values()))
    for renderers in (AGENT_RENDERERS, CONTROLLER_RENDERERS):
        assert set(renderers) <= asked, sorted(set(renderers) - asked)


@pytest.mark.sim
def test_no_two_parts_of_the_simulation_define_the_same_step() -> None:
    """The engine is one class made of its model steps' parts: a method defined in two
    parts would silently take one of them (the first in the class's order)."""
    seen: dict[str, str] = {}
    for part in Simulation.__mro__[:-1]:
        for name, value in vars(part).items():
            if inspect.isfunction(value) and name != "__init__":
                assert name not in seen, f"{name} in {seen.get(name)} and {part.__name__}"
                seen[name] = part.__name__
    assert len(Simulation.__mro__) > 2  # the parts are there to check
