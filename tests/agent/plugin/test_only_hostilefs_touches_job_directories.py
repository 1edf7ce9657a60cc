"""Only agent/plugin/hostilefs.py touches a tenant-writable directory: the agent's code scanned."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.agent.plugin.test_hostile_files import ROOT
from tests.conftest import needs_root

pytestmark = [pytest.mark.hardening, needs_root]


# ---- The architecture: only agent/plugin/hostilefs.py touches the policy directory. ----

#: Functions of os, os.path and shutil that take a path by name (those on descriptors,
#: os.fstat, os.pread, os.close, are fine: a descriptor is what hostilefs hands out).
OS_PATH_FUNCTIONS = frozenset({
    "open", "unlink", "remove", "rename", "renames", "replace", "chmod", "chown", "lchown",
    "mkdir", "makedirs", "rmdir", "removedirs", "listdir", "scandir", "stat", "lstat",
    "symlink", "link", "mkfifo", "mknod", "readlink", "walk", "access", "utime", "truncate",
    "chdir", "exists", "lexists", "isdir", "isfile", "islink", "getsize", "getmtime",
    "realpath", "samefile"})
#: Methods only pathlib.Path has (and io's open): any call of them is a path's.
PATH_METHODS = frozenset({
    "open", "stat", "lstat", "write_text", "write_bytes", "read_text", "read_bytes",
    "unlink", "chmod", "lchmod", "rmdir", "mkdir", "iterdir", "glob", "rglob", "exists",
    "is_dir", "is_file", "is_symlink", "is_fifo", "is_char_device", "is_block_device",
    "is_socket", "touch", "symlink_to", "hardlink_to", "link_to", "rename", "samefile",
    "readlink"})
#: The one module allowed to, and the receiver through which others use it.
ALLOWED_MODULE = "agent/plugin/hostilefs.py"
ALLOWED_RECEIVERS = frozenset({"HeldDir"})
#: Traffic control: its one path is the BPF source shipped with the agent (checked below
#: to know nothing of the policy directory).
NOT_NEAR = frozenset({"agent/tuning/htb.py"})
#: What a module imports to reach the policy directory's files.
FILE_CODE = frozenset({"agent.plugin.shm", "agent.plugin.statsread", "agent.plugin.hostilefs"})
FILE_NAMES = frozenset({"shm", "hostilefs", "PolicyFile", "read_policy", "read_stats"})


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def raw_path_calls(source: str) -> list[str]:
    """Every call in ``source`` that may touch a path by name: ``open()``, a path
    function of os, os.path or shutil, a pathlib method (``.replace(x)``: Path's has one
    argument, str's two, dataclasses' keywords) -- except through :class:`HeldDir`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        where = f"line {node.lineno}: {ast.unparse(func)}()"
        if isinstance(func, ast.Name):
            if func.id == "open":
                found.append(where)
            continue
        if not isinstance(func, ast.Attribute):
            continue
        receiver = _dotted(func.value)
        if receiver in ALLOWED_RECEIVERS:
            continue
        by_name = receiver == "shutil" or (receiver in ("os", "os.path", "io")
                                           and func.attr in OS_PATH_FUNCTIONS)
        path_method = receiver not in ("os", "os.path", "dataclasses") and (
            func.attr in PATH_METHODS
            or (func.attr == "replace" and len(node.args) == 1 and not node.keywords))
        if by_name or path_method:
            found.append(where)
    return found


def _reaches_file_code(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module in FILE_CODE or (
                node.module == "agent.tuning"
                and {alias.name for alias in node.names} & FILE_NAMES)):
            return True
        if isinstance(node, ast.Import) and {a.name for a in node.names} & FILE_CODE:
            return True
    return False


def modules_near_the_policy_directory() -> list[Path]:
    """agent/tuning/*, and every agent module that imports its file code."""
    near = set((ROOT / "agent" / "tuning").glob("*.py"))
    near |= {path for path in (ROOT / "agent").rglob("*.py")
             if _reaches_file_code(ast.parse(path.read_text()))}
    return sorted(path for path in near
                  if str(path.relative_to(ROOT)) not in NOT_NEAR | {ALLOWED_MODULE})


def test_item1_no_agent_code_but_hostilefs_touches_a_tenant_writable_directory() -> None:
    modules = modules_near_the_policy_directory()
    names = {str(path.relative_to(ROOT)) for path in modules}
    assert {"agent/plugin/shm.py", "agent/tuning/service.py",
            "agent/energy/service.py"} <= names
    offenders = {str(path.relative_to(ROOT)): calls for path in modules
                 if (calls := raw_path_calls(path.read_text()))}
    assert offenders == {}, "only agent/plugin/hostilefs.py may touch these paths"
    for exempt in NOT_NEAR:
        text = (ROOT / exempt).read_text()
        assert not _reaches_file_code(ast.parse(text)) and "policy" not in text


@pytest.mark.parametrize("raw", [
    "Path(p).write_text('x')", "os.open(p, os.O_RDONLY)", "open(p)", "os.chown(p, 0, 0)",
    "tmp.chmod(0o640)", "os.replace(a, b)", "shutil.rmtree(d)", "os.listdir(d)",
    "(d / n).is_dir()", "p.unlink(missing_ok=True)", "tmp.replace(p)", "p.stat()",
    "os.path.exists(p)", "p.open('w')"])
def test_item1_the_architecture_scan_catches_a_raw_call(raw: str) -> None:
    """The scan above can fail: each of these, added to agent/tuning, is reported."""
    assert raw_path_calls(f"def f(p, a, b, d, n, tmp):\n    {raw}\n") != []
    assert raw_path_calls("def f(p, s, x):\n    HeldDir.open(p)\n    os.fstat(3)\n"
                          "    s.replace('a', 'b')\n    dataclasses.replace(x, a=1)\n") == []
