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

#: The scheduler engine's tests, one file per part of it; each of its modules is scored against all.
SCHEDULER_ENGINE_TESTS = ["tests/controller/scheduler/test_engine.py",
                          "tests/controller/scheduler/test_reasons.py",
                          "tests/controller/scheduler/test_table.py",
                          "tests/controller/scheduler/test_engine_arithmetic.py",
                          "tests/controller/scheduler/test_engine_rows_and_notes.py"]
#: The tuning loop's tests, one file per part of what it does.
TUNING_LOOP_TESTS = ["tests/agent/tuning/test_loop.py",
                     "tests/agent/tuning/test_loop_one_host.py",
                     "tests/agent/tuning/test_loop_restart.py",
                     "tests/agent/tuning/test_loop_properties.py",
                     "tests/agent/tuning/test_loop_edges.py",
                     "tests/agent/tuning/test_loop_adoption.py",
                     "tests/agent/tuning/test_loop_multi_host.py",
                     "tests/agent/tuning/test_loop_several_jobs.py",
                     "tests/agent/tuning/test_loop_two_phases.py",
                     "tests/agent/tuning/test_loop_operator_wording.py",
                     "tests/agent/tuning/test_loop_withdrawal.py",
                     "tests/agent/tuning/test_loop_mutation_pins.py"]
REDACTION_TESTS = ["tests/controller/test_redaction.py", "tests/controller/test_job_messages.py",
                   "tests/controller/test_redaction_rules.py",
                   "tests/controller/test_energy_feed.py",
                   "tests/controller/test_redaction_kinds.py",
                   # private releases and the budget; names agents made up (in the core)
                   "tests/sim/test_privacy.py", "tests/controller/test_agent_names.py"]
AGREEMENT_TESTS = ["tests/controller/test_agreement.py",
                   "tests/controller/test_agreement_rules.py",
                   "tests/controller/test_agreement_hosts.py",
                   "tests/controller/test_agreement_switching.py",
                   "tests/controller/test_agreement_paused.py",
                   "tests/controller/test_agreement_phases.py"]
#: Module -> the tests about it (no network namespaces, no daemons: fast and exact).
MODULES = {
    "agent/outbox.py": ["tests/agent/test_outbox.py", "tests/agent/test_outbox_rules.py"],
    **{f"controller/{name}.py": REDACTION_TESTS
       for name in ("redaction", "redactionconfig", "poolredaction", "jobredaction")},
    **{f"controller/{name}.py": AGREEMENT_TESTS
       for name in ("agreement", "agreementrules", "agreementstate")},
    "controller/agreementphases.py": ["tests/controller/test_agreement_phases.py"],
    # The wire vocabulary, split by family: the modules with code mutmut changes (the others
    # declare types alone; host.py's code is properties, which mutmut leaves alone).
    **{f"harmonaize/messages/{name}.py": ["tests/wire/test_codec.py",
                                          "tests/wire/test_codec_rules.py",
                                          "tests/wire/test_codec_frames.py"]
       for name in ("core", "values", "tuning", "codec")},
    "harmonaize/tenant/sequencer.py": ["tests/tenant/test_sequencer.py"],
    "agent/conditions.py": ["tests/agent/test_step.py", "tests/agent/test_conditions.py"],
    # The tuning loop, split along its seams: each part scored by the loop's tests.
    **{f"agent/tuning/{part}.py": TUNING_LOOP_TESTS
       for part in ("loop", "entries", "readiness", "reports", "multihost", "adoption")},
    # ... and the loop's settings read from the tuning section (the shell's part).
    "agent/tuning/jobstate.py": [
        *TUNING_LOOP_TESTS,
        "tests/architecture/test_net_domains.py::"
        "test_item2_the_tuning_loop_reads_its_own_part_of_the_tuning_section"],
    "agent/energy/engine.py": ["tests/agent/energy/test_engine.py"],
    "agent/energy/jobs.py": ["tests/agent/energy/test_engine.py"],
    "agent/energy/types.py": ["tests/agent/energy/test_engine.py"],
    # The GPU engine, which applies the GPU's state table (agent/gpu/states.py holds only
    # names, which mutmut leaves alone: its hand-written twin in tests/agent/gpu/test_states.py
    # pins it); its rules are agent/gpu/rules.py.
    "agent/gpu/health.py": [
        "tests/agent/gpu/test_health.py", "tests/agent/test_deadlines.py",
        "tests/agent/gpu/test_states.py::test_each_hook_sends_one_event_and_reports_the_move"
        "_exactly",
        "tests/agent/gpu/test_states.py::test_the_gpu_step_counts_states_and_lists_failed_and"
        "_suspect_gpus_for_the_host",
        "tests/agent/gpu/test_states.py::test_each_xid_is_an_event_by_its_effect_and_a_reload"
        "_judges_every_gpu_again"],
    # Whose fault an XID is, rule by rule; and the kernel log's record format.
    "agent/gpu/attribution.py": ["tests/agent/gpu/test_xid_attribution.py",
                                 "tests/agent/gpu/test_xid_attribution_edges.py"],
    "agent/kernel/kmsgformat.py": ["tests/agent/kernel/test_kmsg.py",
                                   "tests/agent/kernel/test_kmsg_format.py",
                                   "tests/agent/kernel/test_kmsg_properties.py"],
    "controller/scheduler/engine.py": SCHEDULER_ENGINE_TESTS,
    "controller/scheduler/table.py": SCHEDULER_ENGINE_TESTS,
    "controller/scheduler/reasons.py": SCHEDULER_ENGINE_TESTS,
    # The engine's own tests and the fake-reset file's property over it; not that file's
    # others (they build the fake library, run nvidia-smi as a subprocess and need root).
    "agent/remediation/engine.py": [
        "tests/agent/remediation/test_engine.py",
        "tests/agent/remediation/test_engine_moves.py",
        "tests/agent/remediation/test_engine_limits.py",
        "tests/agent/remediation/test_engine_operator_commands.py",
        "tests/agent/remediation/test_engine_table_and_records.py",
        "tests/agent/remediation/test_reset_contract.py::test_no_reset_outside_the_rate_limits_or_of_a_gpu_in_use"],
    # Not sans-I/O: the one module that touches tenant-writable directories (real files).
    "agent/plugin/hostilefs.py": ["tests/agent/plugin/test_hostile_files.py",
                                  "tests/agent/plugin/test_only_hostilefs_touches_job_directories.py",
                                  "tests/agent/plugin/test_hostilefs_promises.py"],
}
#: What a scratch copy needs besides the tracked files.
BUILT = ["native/build"]
#: What mutmut copies beside the mutated package: the plugin, the benches, and docs/ (the
#: suite's wire audit checks what daemons send against docs/feed.asyncapi.yaml).
ALSO_COPIED = ["native/", "bench/", "docs/", "testbed/"]


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
        # docs/: the tests' wire audit checks what they send against the published spec;
        # testbed/: the tests' conftest imports the harness.
        copied = [f"{p}/" for p in others] + ALSO_COPIED
        with (work / "pyproject.toml").open("a") as out:
            out.write(
                "\n[tool.mutmut]\n"
                f'source_paths = ["{package}/"]\n'
                f'only_mutate = ["{module}"]\n'
                f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
                f"also_copy = {json.dumps(copied)}\n")
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
