"""Tuning inside the agent: the I/O shell around :class:`TuningLoop`.

Each pass it reads the plugin's per-rank records of every declared job,
steps the loop with the link observations, and carries out what the loop
decided: policy files written through :class:`PolicyFile`, then, when a
change was armed, the ranks' records read again so the loop can confirm or
cancel it (one host) or acknowledge it to the controller (several hosts);
messages published to the controller; files of finished jobs removed. It
also keeps the HTB classes for declared bulk traffic in line with the
declarations and link speeds, and writes each job's next-launch NCCL
configuration.

Each job has its own directory, readable only by root and the job's Unix
group (from the provider's placement), so another tenant's processes can
neither list, read nor follow it. Policy files outlive the agent on purpose:
a restarted agent adopts them (or, if one is unreadable, rebuilds it from
what the ranks report they follow), so nothing switches mid-stream, and
while no agent runs every rank keeps what it follows. Files of jobs no
declaration claims within ``orphan_grace`` seconds of a start are removed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.conditions import Finding
from agent.kernel import sysfs
from agent.links.interface import LinkJudgement, LinkSample, LinksSection
from agent.plugin.layout import U32_MAX, Policy, StatsSlots
from agent.plugin.shm import (
    PolicyFile,
    StatsLimits,
    StatsReader,
    job_names,
    launch_path,
    policy_path,
    prepare_dirs,
    prepare_job_dir,
    read_policy,
    remove_job_dir,
    write_launch,
)
from agent.tuning import nextlaunch, views
from agent.tuning.htb import BulkJob, HtbShaper, assign_minors, plan
from agent.tuning.htbplan import bulk_jobs
from agent.tuning.loop import (
    Action,
    LoopSettings,
    Publish,
    Retire,
    TuningLoop,
    WritePolicy,
    build_policy,
    resolved_policy,
)
from agent.tuning.owners import GroupUsers, resolve_group
from agent.tuning.settings import TuningSection
from harmonaize.messages import (
    AckPhase,
    JobDeclaration,
    Message,
    TuningAck,
    TuningArm,
    TuningResolve,
)

log = logging.getLogger(__name__)

#: Next-launch files are recomputed this often (seconds).
LAUNCH_PERIOD = 10.0

__all__ = ["TuningService", "launch_path", "resolve_group"]


class TuningService:
    def __init__(self, cfg: TuningSection, links: LinksSection, *,
                 publish: Callable[[Message], None], htb: HtbShaper | None = None) -> None:
        self.cfg = cfg
        self.links_cfg = links
        self.publish = publish
        self.dir = Path(cfg.policy_dir)
        self.loop = TuningLoop(LoopSettings.of(cfg))
        #: The ranks' stats files, read with bounded work per look (they are a tenant's).
        self.reader = StatsReader(self.dir, StatsLimits(
            per_job=cfg.stats_files_per_job, per_uid=cfg.stats_files_per_uid,
            per_read=cfg.stats_files_per_pass, seqlock_tries=cfg.stats_seqlock_tries))
        self.shaper = htb if htb is not None else (HtbShaper() if cfg.htb else None)
        self._owners = GroupUsers()
        self.files: dict[str, PolicyFile] = {}
        self.policy_ids: dict[str, int] = {}
        self.groups: dict[str, int | None] = {}
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
        self.rejected = 0

    # --- lifecycle ------------------------------------------------------------------

    def start(self, now: float) -> None:
        try:
            prepare_dirs(self.dir)
            entries = job_names(self.dir)
        except (OSError, ValueError) as exc:  # the agent serves on; each write says why
            self._fail(f"policy directory {self.dir}: {getattr(exc, 'strerror', None) or exc}")
            entries = []
        for entry in entries:
            self._orphans[entry] = now + self.cfg.orphan_grace
        if self.shaper is not None:
            try:
                self.shaper.remove_stale()
            except Exception as exc:
                self._fail(f"removing stale traffic classes: {exc}")

    def stop(self, now: float | None = None) -> None:
        """Communicators on this host alone go back to NCCL's own choices (at agreed
        indices); then the traffic classes go. Policy files stay for the next agent."""
        now = time.time() if now is None else now
        try:
            fresh = {job: self.reader.read(job) for job in self.loop.jobs}
            self._run(self.loop.shutdown(fresh, now), now)
        except Exception as exc:
            log.warning("tuning: returning to NCCL's choices at stop: %s", exc)
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
        gid = resolve_group(declaration.group)
        if new or self.groups.get(job) != gid:
            self.groups[job] = gid
            try:
                prepare_job_dir(self.dir, job, gid)
            except (OSError, ValueError) as exc:
                self._fail(f"job {job}: its directory: {exc}")
        if new:
            adopted = self._adopt(job, now)
            actions = adopted if adopted is not None else actions
        self._run(actions, now)

    def _adopt(self, job: str, now: float) -> list[Action] | None:
        slots = self.reader.read(job)
        policy = None
        try:
            policy = read_policy(policy_path(self.dir, job))
        except FileNotFoundError:
            if not slots:
                return None
        except (OSError, ValueError) as exc:
            log.warning("job %s: the previous policy is unreadable (%s): rebuilding it from "
                        "what its ranks follow", job, exc)
        if policy is not None:
            self.policy_ids[job] = policy.policy_id
        if (policy is None or not policy.comms) and not any(s.revision for s in slots):
            return None
        try:
            actions = self.loop.adopt(job, policy, slots, now)
        except (ValueError, IndexError) as exc:
            log.warning("job %s: not adopting the previous policy (%s); its ranks keep what "
                        "they follow", job, exc)
            return []
        log.info("job %s: adopted the previous agent's policy (%d communicators)", job,
                 len(self.loop.jobs[job].entries))
        return actions

    def withdraw(self, job: str, now: float) -> None:
        """Raises ValueError for a job with no declaration."""
        self._run(self.loop.withdraw(job, now), now)

    def arm(self, message: TuningArm, now: float) -> None:
        self._refresh(message.job, now)
        self._run(self.loop.arm(message, now), now)

    def resolve(self, message: TuningResolve, now: float) -> None:
        if message.job in self.loop.jobs:
            self._run(self.loop.resolve(message, now), now)
            return
        # No declaration (yet): a restarted agent hears the outcome of what its
        # predecessor armed before the declaration comes again. Its ranks may wait
        # for it; resolve it in the file as it is, then say so.
        reason = "no declaration for the job on this host"
        try:
            path = policy_path(self.dir, message.job)
            try:
                policy: Policy | None = read_policy(path)
            except FileNotFoundError:
                policy = None
            resolved = resolved_policy(policy, message) if policy is not None else None
            if resolved is not None:
                with PolicyFile(path) as handle:
                    handle.write(dataclasses.replace(
                        resolved, policy_id=resolved.policy_id % U32_MAX + 1))
                reason = "resolved in the policy file before the declaration came"
                log.info("job %s: decision %d %s in the policy file (no declaration yet)",
                         message.job, message.decision,
                         "confirmed" if message.commit else "cancelled")
        except (OSError, ValueError) as exc:
            # Not acknowledged: the controller resends it, and the declaration comes.
            self._fail(f"job {message.job}: resolving decision {message.decision}: {exc}")
            return
        self.publish(TuningAck(message.job, message.decision, AckPhase.RESOLVED, reason))

    def _refresh(self, job: str, now: float) -> None:
        """Fresh records of one job's ranks, so the loop judges the present."""
        state = self.loop.jobs.get(job)
        if state is not None:
            self.stats[job] = self.reader.read(job)
            self.loop.refresh(job, self.stats[job], now)

    # --- each pass ------------------------------------------------------------------

    def step(self, sample: LinkSample | None, links: Sequence[LinkJudgement],
             now: float) -> None:
        """``sample``: this pass's link sample (None if it failed), for the traffic
        classes; ``links``: this pass's judgement of each link, from the link step
        health holds its levels from (one judgement, one set of thresholds, for both)."""
        if not (self.loop.jobs or self.files or self._orphans or self._shaped):
            return  # nothing declared, written or shaped: most passes on most hosts
        if self.loop.jobs:  # nothing to read or decide (or pay for) without declarations
            self.stats = {job: self.reader.read(job) for job in self.loop.jobs}
            try:
                self._run(self.loop.step(links, self.stats, now), now)
            except Exception as exc:  # one bad pass must not stop the next
                self._fail(f"tuning step failed: {exc}")
                log.exception("tuning step failed")
        self._shape(sample)
        self._next_launch(now)
        for job, deadline in list(self._orphans.items()):
            if now >= deadline:
                del self._orphans[job]
                if job not in self.loop.jobs:
                    self._remove_files(job)
                    log.info("removed the files of job %s: no declaration claimed them", job)

    def _run(self, actions: list[Action], now: float) -> None:
        """Carry out the loop's actions. Where they wrote armed entries, the ranks'
        fresh records are the loop's next input (:meth:`TuningLoop.confirm`) and its
        answer is carried out in turn: one input after another, not a call back into
        this method. Confirming decides every armed entry, so nothing is left armed."""
        self._carry_out(actions)
        waiting = self.loop.awaiting_confirmation()
        if not waiting:
            return
        fresh = {name: self.reader.read(name) for name in waiting}
        self.stats.update(fresh)
        self._carry_out(self.loop.confirm(fresh, now))
        if self.loop.awaiting_confirmation():  # only if the phase table refused a move
            self._fail("armed entries left undecided after confirmation")

    def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, WritePolicy):
                self._write(action)
            elif isinstance(action, Publish):
                self.publish(action.message)
            elif isinstance(action, Retire):
                self._remove_files(action.job)
                self.policy_ids.pop(action.job, None)
                self.stats.pop(action.job, None)
                self.groups.pop(action.job, None)
                log.info("job %s: declaration withdrawn and communicators settled: "
                         "policy removed", action.job)

    def _write(self, action: WritePolicy) -> bool:
        job = action.job
        policy_id = self.policy_ids.get(job, 0) % U32_MAX + 1
        try:
            policy = build_policy(action.entries, policy_id)
            handle = self.files.get(job)
            if handle is None:
                prepare_job_dir(self.dir, job, self.groups.get(job))
                handle = self.files[job] = PolicyFile(policy_path(self.dir, job))
                self.loop.file(job, handle.identity)
            handle.write(policy)
        except (OSError, ValueError) as exc:
            self._fail(f"job {job}: writing the policy: {exc}")
            return False
        self.policy_ids[job] = policy_id
        return True

    def _remove_files(self, job: str) -> None:
        handle = self.files.pop(job, None)
        if handle is not None:
            handle.remove()
        self.reader.forget(job)
        try:
            remove_job_dir(self.dir, job)
        except (OSError, ValueError) as exc:
            self._fail(f"job {job}: removing its directory: {exc}")
        self.launch.pop(job, None)
        self._launch_at.pop(job, None)

    # --- operator conditions --------------------------------------------------------

    def findings(self) -> list[Finding]:
        """Conditions for operators: ranks that disagree, ranks that wait."""
        return views.findings(self.loop)

    # --- traffic classes ------------------------------------------------------------

    def bulk_jobs(self) -> list[BulkJob]:
        """In the order the jobs were declared: a port or DSCP value two jobs claim is the
        first one's (htb.plan); only the job's own users' sockets (its group's)."""
        return bulk_jobs(((name, job.declaration) for name, job in self.loop.jobs.items()
                          if not job.retiring), self._owners.uids)

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
                                   collective_share=self.cfg.collective_share,
                                   max_floor_share=self.cfg.bulk_floor_max_share,
                                   previous=self.shaper.planned), self._l2)
        except Exception as exc:
            self._fail(f"traffic classes: {exc}")
            return
        self._shaped = bool(links)

    # --- next-launch recommendations ------------------------------------------------

    def experience(self, job: str) -> nextlaunch.Experience:
        state = self.loop.jobs[job]
        return nextlaunch.experience(state.congested, state.observed, state.retransmitting)

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
            try:
                write_launch(self.dir, job, text)
            except (OSError, ValueError) as exc:
                self._fail(f"job {job}: writing {launch_path(self.dir, job).name}: {exc}")
                continue
            self.launch[job] = text

    # --- operator views -------------------------------------------------------------

    def configure(self, links: LinksSection) -> None:
        """A reload's new link settings, shown by ``jobs``. The judging itself is link
        health's (its engine was configured alike); the rest of the tuning section
        needs a restart."""
        self.links_cfg = links

    def jobs_view(self, now: float) -> dict[str, Any]:
        return views.jobs_view(self, now)

    def policy_view(self, args: Mapping[str, Any], now: float) -> dict[str, Any]:
        return views.policy_view(self, args, now)
