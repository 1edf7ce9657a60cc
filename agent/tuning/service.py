"""Tuning inside the agent: the I/O shell around :class:`TuningLoop`.

Each pass it reads the plugin's per-communicator counters of every declared
job, steps the loop with the link observations, and carries out what the loop
decided: policy files written through :class:`PolicyFile` (and heartbeated
every pass, so the plugins know the agent is alive), proposals published to
the controller, files of finished jobs removed. It also keeps the HTB classes
for declared bulk traffic in line with the declarations and link speeds, and
writes each job's next-launch NCCL configuration.

Policy files outlive the agent on purpose: a restarted agent adopts them as
they are, so nothing switches mid-stream; meanwhile their heartbeat ages and
the plugins fall back to NCCL's own choices. Files of jobs no declaration
claims within ``orphan_grace`` seconds of a start are removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.config import LinksSection, TuningSection
from agent.linkhealth import views
from agent.net import sysfs
from agent.observers.links import LinkSample
from agent.observers.rdma import RdmaSample
from agent.tuning import nextlaunch
from agent.tuning.htb import BulkJob, HtbShaper, assign_minors, plan
from agent.tuning.loop import (
    Action,
    LoopSettings,
    Propose,
    Retire,
    TuningLoop,
    WritePolicy,
    build_policy,
)
from agent.tuning.policies import CHOICE_NAMES, describe_rule
from agent.tuning.shm import (
    U32_MAX,
    PolicyFile,
    StatsSlots,
    policy_path,
    read_policy,
    read_stats,
)
from harmonaize.messages import JobDeclaration, Message, TuningDecision
from harmonaize.opsocket import CommandError
from harmonaize.schema import to_plain

log = logging.getLogger(__name__)

#: Next-launch files are recomputed this often (seconds).
LAUNCH_PERIOD = 10.0
_OURS = re.compile(r"([A-Za-z0-9._:@+-]{1,128})\.(policy|nccl\.conf)")


def launch_path(directory: str | os.PathLike[str], job: str) -> Path:
    return policy_path(directory, job).with_suffix(".nccl.conf")


def settings_from(cfg: TuningSection) -> LoopSettings:
    return LoopSettings(
        max_changes_per_minute=cfg.max_changes_per_minute, hold=cfg.hold,
        activation_lead=cfg.activation_lead, activation_margin=cfg.activation_margin,
        proposal_refresh=cfg.proposal_refresh, stall=cfg.stall,
        link_classes=tuple(cfg.link_classes))


class TuningService:
    def __init__(self, cfg: TuningSection, links: LinksSection, *,
                 publish: Callable[[Message], None], htb: HtbShaper | None = None) -> None:
        self.cfg = cfg
        self.links_cfg = links
        self.publish = publish
        self.dir = Path(cfg.policy_dir)
        self.loop = TuningLoop(settings_from(cfg), links)
        self.shaper = htb if htb is not None else (HtbShaper() if cfg.htb else None)
        self.files: dict[str, PolicyFile] = {}
        self.policy_ids: dict[str, int] = {}
        self.stats: dict[str, StatsSlots] = {}
        self.launch: dict[str, str] = {}
        self._launch_at: dict[str, float] = {}
        self._minors: dict[str, int] = {}
        self._l2: dict[str, int] = {}
        #: The shaped link classes' links and speeds, as last observed.
        self._links: list[tuple[str, int | None]] = []
        self._orphans: dict[str, float] = {}
        #: Classes may be in the kernel (or their removal failed): keep reconciling.
        self._shaped = True
        self.errors = 0
        self.last_error = ""
        self.rejected_decisions = 0

    # --- lifecycle ------------------------------------------------------------------

    def start(self, now: float) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                self.dir.chmod(0o755)  # tenants' processes read policies and write stats here
            entries = os.listdir(self.dir)
        except OSError as exc:  # the agent serves on; each write will say why it failed
            self._fail(f"policy directory {self.dir}: {exc.strerror or exc}")
            entries = []
        for entry in entries:
            match = _OURS.fullmatch(entry)
            if match:
                self._orphans[match.group(1)] = now + self.cfg.orphan_grace
        if self.shaper is not None:
            try:
                self.shaper.remove_stale()
            except Exception as exc:
                self._fail(f"removing stale traffic classes: {exc}")

    def stop(self) -> None:
        if self.shaper is not None:
            try:
                self.shaper.close()
            except Exception as exc:
                log.warning("removing traffic classes: %s", exc)
        for handle in self.files.values():
            handle.close()  # left in place: a restarted agent adopts them
        self.files.clear()

    def _fail(self, message: str) -> None:
        self.errors += 1
        self.last_error = message
        log.warning("tuning: %s", message)

    # --- inputs ---------------------------------------------------------------------

    def declare(self, declaration: JobDeclaration, now: float) -> None:
        """Raises ValueError for a declaration older than the one in force."""
        job = declaration.job
        new = job not in self.loop.jobs
        actions = self.loop.declare(declaration, now)
        self._orphans.pop(job, None)
        if new:
            adopted = self._adopt(job, now)
            actions = adopted if adopted is not None else actions
        self._run(actions)

    def _adopt(self, job: str, now: float) -> list[Action] | None:
        path = policy_path(self.dir, job)
        if not path.exists():
            return None
        try:
            policy = read_policy(path)
        except (OSError, ValueError) as exc:
            log.info("job %s: not adopting the existing policy (%s)", job, exc)
            return None
        self.policy_ids[job] = policy.policy_id
        if not policy.comms:
            return None
        try:
            actions = self.loop.adopt(job, policy, now)
        except (ValueError, IndexError) as exc:
            log.info("job %s: not adopting the existing policy (%s)", job, exc)
            return None
        log.info("job %s: adopted the previous agent's policy (%d communicators)", job,
                 len(policy.comms))
        return actions

    def withdraw(self, job: str, now: float) -> None:
        """Raises ValueError for a job with no declaration."""
        self._run(self.loop.withdraw(job, now))

    def decision(self, decision: TuningDecision, now: float) -> None:
        try:
            actions = self.loop.decide(decision, now)
        except ValueError as exc:
            self.rejected_decisions += 1
            self._fail(f"decision rejected: {exc}")
            return
        self._run(actions)

    # --- each pass ------------------------------------------------------------------

    def step(self, observations: Mapping[str, Any], now: float) -> None:
        if not (self.loop.jobs or self.files or self._orphans or self._shaped):
            return  # nothing declared, written or shaped: most passes on most hosts
        links = observations.get("links")
        sample = links if isinstance(links, LinkSample) else None
        if self.loop.jobs:  # nothing to read or decide (or pay for) without declarations
            rdma = observations.get("rdma")
            link_views = views(sample, rdma if isinstance(rdma, RdmaSample) else None)
            self.stats = {job: read_stats(self.dir, job) for job in self.loop.jobs}
            try:
                self._run(self.loop.step(link_views, self.stats, now))
            except Exception as exc:  # one bad pass must not stop the heartbeats below
                self._fail(f"tuning step failed: {exc}")
                log.exception("tuning step failed")
        beat = time.monotonic_ns()
        for job, handle in list(self.files.items()):
            try:
                handle.heartbeat(beat)
            except (OSError, ValueError) as exc:
                self._fail(f"job {job}: heartbeat: {exc}")
        self._shape(sample)
        self._next_launch(now)
        for job, deadline in list(self._orphans.items()):
            if now >= deadline:
                del self._orphans[job]
                if job not in self.loop.jobs:
                    self._remove_files(job)
                    log.info("removed the files of job %s: no declaration claimed them", job)

    def _run(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, WritePolicy):
                self._write(action)
            elif isinstance(action, Propose):
                self.publish(action.proposal)
            elif isinstance(action, Retire):
                self._remove_files(action.job)
                self.policy_ids.pop(action.job, None)
                self.stats.pop(action.job, None)
                log.info("job %s: declaration withdrawn and communicators quiet: policy removed",
                         action.job)

    def _write(self, action: WritePolicy) -> None:
        job = action.job
        policy_id = self.policy_ids.get(job, 0) % U32_MAX + 1
        try:
            policy = build_policy(action.entries, policy_id,
                                  int(self.cfg.stale_after * 1e9))
            handle = self.files.get(job)
            if handle is None:
                handle = self.files[job] = PolicyFile(policy_path(self.dir, job))
            handle.write(policy, time.monotonic_ns())
        except (OSError, ValueError) as exc:
            self._fail(f"job {job}: writing the policy: {exc}")
            return
        self.policy_ids[job] = policy_id

    def _remove_files(self, job: str) -> None:
        handle = self.files.pop(job, None)
        if handle is not None:
            handle.remove()
        for path in (policy_path(self.dir, job), launch_path(self.dir, job)):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        self.launch.pop(job, None)
        self._launch_at.pop(job, None)

    # --- traffic classes ------------------------------------------------------------

    def bulk_jobs(self) -> list[BulkJob]:
        out = []
        for name, job in sorted(self.loop.jobs.items()):
            bulk = job.declaration.bulk
            if bulk is not None and not job.retiring and (bulk.ports or bulk.dscp):
                out.append(BulkJob(name, bulk.floor_mbps, bulk.ports, bulk.dscp))
        return out

    def _shape(self, sample: LinkSample | None) -> None:
        if self.shaper is None:
            self._shaped = False
            return
        jobs = self.bulk_jobs()
        self._minors = assign_minors([j.job for j in jobs], self._minors)
        if sample is not None:  # a pass without a sample (it failed) changes nothing
            self._links = [(link.name, link.speed_mbps) for link in sample.links
                           if link.link_class in self.cfg.htb_link_classes]
        links = self._links if jobs else []
        for name, _ in links:
            if name not in self._l2:
                devices = {d.name: d for d in sysfs.list_devices(self.links_cfg.sysfs_root)}
                self._l2.update({n: d.l2_len for n, d in devices.items()})
        try:
            self.shaper.apply(plan(jobs, links, self._minors,
                                   collective_share=self.cfg.collective_share), self._l2)
        except Exception as exc:
            self._fail(f"traffic classes: {exc}")
            return
        self._shaped = bool(links)

    # --- next-launch recommendations ------------------------------------------------

    def experience(self, job: str) -> nextlaunch.Experience:
        state = self.loop.jobs[job]
        share = state.congested / state.observed if state.observed else 0.0
        return nextlaunch.Experience(share, state.retransmitting, state.observed)

    def recommendations(self, job: str) -> dict[str, tuple[str, str]]:
        return nextlaunch.recommend(
            self.loop.jobs[job].declaration, self.experience(job),
            ib_traffic_class=self.cfg.ib_traffic_class,
            congested_share=self.cfg.congested_share)

    def _next_launch(self, now: float) -> None:
        for job, state in self.loop.jobs.items():
            if state.retiring or now < self._launch_at.get(job, float("-inf")):
                continue
            self._launch_at[job] = now + LAUNCH_PERIOD
            text = nextlaunch.render(job, self.recommendations(job), self.experience(job))
            if text == self.launch.get(job):
                continue
            path = launch_path(self.dir, job)
            tmp = path.with_name(f".{path.name}.tmp")
            try:
                tmp.write_text(text)
                tmp.chmod(0o644)
                os.replace(tmp, path)
            except OSError as exc:
                self._fail(f"job {job}: writing {path.name}: {exc}")
                continue
            self.launch[job] = text

    # --- operator views -------------------------------------------------------------

    def _job(self, job: Any) -> str:
        if not isinstance(job, str) or job not in self.loop.jobs:
            known = ", ".join(sorted(self.loop.jobs)) or "none"
            raise CommandError(f"no declaration for job {job!r:.140} (declared: {known})")
        return job

    def jobs_view(self, now: float) -> dict[str, Any]:
        rows = []
        htb = self.shaper.describe() if self.shaper is not None else {}
        for name, job in sorted(self.loop.jobs.items()):
            rows.append({
                "job": name,
                "revision": job.declaration.revision,
                "ranges": len(job.declaration.tuning),
                "choice": job.choice,
                "wanted": CHOICE_NAMES[job.desired_severity],
                "mode": "multi-host" if job.multi else "one host",
                "communicators": len(job.comms),
                "pending": self.loop.pending_activations(name, now),
                "bulk_floor_mbps": job.declaration.bulk.floor_mbps
                if job.declaration.bulk else None,
                "reason": job.reason,
                "waiting": job.waiting or ("withdrawn" if job.retiring else ""),
            })
        return {"jobs": rows, "link_level": self.loop.raw.value,
                "evidence": self.loop.evidence, "policy_dir": str(self.dir),
                "traffic_classes": htb, "errors": self.errors, "last_error": self.last_error,
                "rejected_decisions": self.rejected_decisions}

    def policy_view(self, args: Mapping[str, Any], now: float) -> dict[str, Any]:
        name = self._job(args.get("job"))
        job = self.loop.jobs[name]
        stats = self.stats.get(name, StatsSlots())
        return {
            "job": name,
            "declaration": to_plain(job.declaration),
            "fingerprint": job.derivation.fingerprint,
            "choices": [{"name": c.name, "severity": c.severity, "summary": c.summary,
                         "rules": [describe_rule(r) for r in c.rules]}
                        for c in job.derivation.choices],
            "notes": list(job.derivation.notes),
            "choice": job.choice,
            "reason": job.reason,
            "waiting": job.waiting,
            "mode": "multi-host" if job.multi else "one host",
            "decision": job.decision if job.decision >= 0 else None,
            "late_activations": job.late_activations,
            "unlisted": [f"{c:#018x}" for c in sorted(job.unlisted)],
            "policy_file": str(policy_path(self.dir, name)),
            "policy_id": self.policy_ids.get(name),
            "communicators": [
                {"comm": f"{c.comm_id:#018x}", "ranks": c.n_ranks, "nodes": c.n_nodes,
                 "collectives": c.collectives, "per_second": round(c.rate, 1),
                 "at": (e := job.entries.get(c.comm_id)) and e.at,
                 "before": e.before if e else None, "after": e.after if e else "unlisted",
                 "passed": e is None or c.passed(e.at, now, self.loop.settings.stall)}
                for c in sorted(job.comms.values(), key=lambda c: c.comm_id)],
            "plugin": [{"pid": s.pid, "comm": f"{s.comm_id:#018x}", "collectives": s.collectives,
                        "policy_id": s.policy_id_applied, "fallbacks": s.fallbacks}
                       for s in stats],
            "malformed_stats_files": stats.malformed,
            "history": [{"time": c.time, "step": c.step, "kind": c.kind, "from": c.before,
                         "to": c.after, "reason": c.reason, "onset_step": c.onset_step,
                         "activations": [[f"{comm:#x}", at] for comm, at in c.activations]}
                        for c in job.history],
            "next_launch": {"file": str(launch_path(self.dir, name)),
                            "values": {k: v for k, (v, _) in
                                       self.recommendations(name).items()}},
            "steps": self.loop.steps,
        }
