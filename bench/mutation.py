"""mutation: how much of the sans-I/O modules' behaviour the tests pin down.

mutmut changes one thing at a time in a module (an operator, a constant, a
comparison, a returned value) and runs the module's own tests against each
change; a change no test notices "survives". Each module is scored as the
share of its mutants killed, in a scratch copy of the tree (mutmut rewrites
what it mutates), against the tests that are about it only. The last line is
the lowest score: ``mutation N %``. Survivors are listed per module with
``--show`` (mutmut's own names; ``mutmut show NAME`` in the scratch copy gives
the diff), so they can be looked at one by one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTMUT = Path(sys.executable).parent / "mutmut"

#: Module -> the tests about it (no network namespaces, no daemons: fast and exact).
MODULES = {
    "agent/outbox.py": ["tests/test_outbox.py", "tests/test_outbox_rules.py"],
    "controller/redaction.py": ["tests/test_redaction.py", "tests/test_hardening_jobmessages.py",
                                "tests/test_redaction_rules.py", "tests/test_energy_feed.py"],
    "controller/agreement.py": ["tests/test_tuning_agreement.py", "tests/test_agreement_rules.py"],
    "harmonaize/messages.py": ["tests/test_wire.py", "tests/test_wire_rules.py"],
    "agent/conditions.py": ["tests/test_health.py", "tests/test_conditions_rules.py"],
    "agent/tuning/loop.py": ["tests/test_tuning_loop.py", "tests/test_tuning_loop_edges.py"],
    "agent/energy/engine.py": ["tests/test_energy_loop.py"],
    "agent/energy/jobs.py": ["tests/test_energy_loop.py"],
    "agent/energy/types.py": ["tests/test_energy_loop.py"],
    # The GPU engine, which applies the GPU's state table (agent/gpu/states.py holds only
    # names, which mutmut leaves alone: its hand-written twin in tests/test_gpu_states.py
    # pins it); its rules are agent/gpu/rules.py.
    "agent/gpu/health.py": [
        "tests/test_gpu_health.py", "tests/test_redesign_deadlines.py",
        "tests/test_gpu_states.py::test_each_hook_sends_one_event_and_reports_the_move_exactly",
        "tests/test_gpu_states.py::test_the_gpu_step_counts_states_and_lists_failed_and_suspect"
        "_gpus_for_the_host",
        "tests/test_gpu_states.py::test_each_xid_is_an_event_by_its_effect_and_a_reload_judges"
        "_every_gpu_again"],
    "controller/scheduler/engine.py": ["tests/test_scheduler_engine.py"],
    "controller/scheduler/table.py": ["tests/test_scheduler_engine.py"],
    "controller/scheduler/reasons.py": ["tests/test_scheduler_engine.py"],
    # The engine's own tests and the fake-reset file's property over it; not that file's
    # others (they build the fake library, run nvidia-smi as a subprocess and need root).
    "agent/remediation/engine.py": [
        "tests/test_scheduler_remediation_engine.py",
        "tests/test_scheduler_fake_reset.py::test_no_reset_outside_the_rate_limits_or_of_a_gpu_in_use"],
    # Not sans-I/O: the one module that touches tenant-writable directories (real files).
    "agent/plugin/hostilefs.py": ["tests/test_hardening_files.py"],
}
#: What a scratch copy needs besides the tracked files.
BUILT = ["native/build"]


def scratch_copy(into: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            target = into / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for built in BUILT:
        if (ROOT / built).exists():
            shutil.copytree(ROOT / built, into / built, dirs_exist_ok=True)


def score(module: str, tests: list[str], show: bool) -> tuple[int, int]:
    """(killed, total) for one module."""
    with tempfile.TemporaryDirectory(prefix="hz-mutation-") as tmp:
        work = Path(tmp)
        scratch_copy(work)
        package = module.split("/", maxsplit=1)[0]
        others = sorted({m.split("/")[0] for m in MODULES} | {"sim"} - {package})
        with (work / "pyproject.toml").open("a") as out:
            out.write(
                "\n[tool.mutmut]\n"
                f'source_paths = ["{package}/"]\n'
                f'only_mutate = ["{module}"]\n'
                f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
                f"also_copy = {json.dumps([f'{p}/' for p in others] + ['native/', 'bench/'])}\n")
        run = subprocess.run([str(MUTMUT), "run"], cwd=work, capture_output=True, text=True,
                             check=False)
        subprocess.run([str(MUTMUT), "export-cicd-stats"], cwd=work, capture_output=True,
                       check=False)
        stats_file = work / "mutants" / "mutmut-cicd-stats.json"
        if not stats_file.exists():
            print(run.stdout[-2000:] + run.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"mutation: mutmut gave no result for {module}")
        stats = json.loads(stats_file.read_text())
        if show:
            listing = subprocess.run([str(MUTMUT), "results"], cwd=work, capture_output=True,
                                     text=True, check=False).stdout
            for line in listing.splitlines():
                if "survived" in line or "no tests" in line:
                    print(f"    {line.strip()}", file=sys.stderr)
    killed = stats["killed"] + stats.get("timeout", 0) + stats.get("segfault", 0)
    return killed, stats["total"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", action="append", choices=sorted(MODULES),
                        help="only these modules (default: all)")
    parser.add_argument("--show", action="store_true", help="list the surviving mutants")
    args = parser.parse_args()
    lowest = 100.0
    for module in args.module or MODULES:
        killed, total = score(module, MODULES[module], args.show)
        share = 100.0 * killed / total if total else 100.0
        lowest = min(lowest, share)
        print(f"  {module}: {killed} of {total} mutants killed, {share:.1f} %", flush=True)
    print(f"mutation {lowest:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
