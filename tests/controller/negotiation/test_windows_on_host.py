"""A negotiated maintenance window reaches the host: a real controller, a real agent on
fake GPUs, the tenant's own client. The host names the condition behind a validation;
the tenant counters the provider's window with its checkpoints; an agreed window moves
the host's validation there (it starts then, not at the host's own lead), and a counter
later than an urgent condition may wait is overridden: the host keeps its start.

The host announces every validation ten minutes ahead ([validation] notice_lead), so
nothing starts within a test unless a window moves it; the controller gives each
condition a second of least notice (the tenant's time to checkpoint), so a test's
checkpoints can lie seconds ahead. Under the default settings (a 30 s lead, the built-in
least notice) a job that declared its checkpoint cadence is told early enough to
negotiate, and a job that declared none keeps the short lead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from controller.negotiation.maintenance import checkpoint_starts
from harmonaize import messages as m
from harmonaize.maintenancetables import NOTICE_MARGIN, URGENCY, ValidationCause
from harmonaize.tenant.client import FeedClient
from testbed.fakegpu import FakeNvml
from tests.agent.validation.test_agent import FAKE_CHECK, finished
from tests.conftest import Spawn, needs_root
from tests.daemons import (
    NO_LINKS,
    Agent,
    Controller,
    fake_gpus,
    gpu_section,
    keyring,
    start_agent,
    start_controller,
    tenant_feed,
    wait_until,
)
from tests.tenant.test_notices import next_notice

pytestmark = [pytest.mark.negotiation, pytest.mark.validation, needs_root]

JOB = "job-7"
GPU = 6
NEGOTIATION = ("[negotiation]\nweights = { acme = 1.0 }\n"
               + "least_notice = { " + ", ".join(f'"{c.value}" = 1' for c in ValidationCause)
               + " }\n")


#: Where nothing is set but who negotiates: the default lead and least notice.
DEFAULTS = "[negotiation]\nweights = { acme = 1.0 }\n"


@contextmanager
def host_with_job(spawn: Spawn, workdir: Path, *, negotiation: str = NEGOTIATION,
                  lead: str = "notice_lead = 600\n",
                  declaration: m.JobDeclaration | None = None,
                  ) -> Iterator[tuple[Agent, FakeNvml, FeedClient, Controller]]:
    """A host running acme's job on one GPU, its validations announced ten minutes
    ahead (``lead``); acme's client on the job's topic, its declaration sent."""
    controller = start_controller(spawn, workdir, negotiation)
    control = workdir / "control"
    control.mkdir()
    (control / "behaviour.all").write_text("print metric gflops 100\n")
    fake, env = fake_gpus(workdir)
    validation = ("[validation]\ncooldown = 3600\n" + lead +
                  "[[validation.commands]]\nname = \"burn\"\n"
                  f'command = ["{sys.executable}", "{FAKE_CHECK}", "{control}", "{{gpu}}"]\n'
                  'parser = "metrics"\nlevels = [2, 3]\nbudget = 5\n')
    agent = start_agent(spawn, workdir, "g1", endpoint=controller.listen, env=env,
                        links=NO_LINKS + gpu_section() + validation)
    tenant = spawn([sys.executable, "-c", "import time; time.sleep(600)"],
                   env={**os.environ, "HARMONAIZE_JOB": JOB, "RANK": "3"})
    fake.set(GPU, processes={tenant.pid: 1 << 30})
    wait_until(lambda: any(g["jobs"] for g in agent.request("health")["gpus"]),
               what="the job")
    controller.request("place", {"job": JOB, "tenant": "acme",
                                 "members": [{"name": "3", "host": "g1"}]})
    with tenant_feed(controller, [f"job/acme/{JOB}/"]) as acme:
        acme.declare(declaration or m.JobDeclaration(JOB, max_validation_pause=600,
                                                     revision=1))
        yield agent, fake, acme, controller


def tenant_cli(controller: Controller, *args: str) -> subprocess.CompletedProcess[str]:
    """``harmonaize-tenant negotiate ARGS`` as acme."""
    creds = keyring(controller.workdir).tenant("acme")
    return subprocess.run(
        [sys.executable, "-m", "harmonaize.tenant.cli", "negotiate", *args, "--feed",
         controller.feed, "--key", str(creds.key), "--server-key", str(creds.server_key)],
        capture_output=True, text=True, timeout=60, check=False)


def proposed_window(acme: FeedClient, notice: m.ValidationNotice) -> m.Negotiated:
    """The provider's window for the notice, as acme lists it."""
    return wait_until(lambda: next((n for n in acme.negotiations()
                                    if n.request_id == notice.id), None),
                      what="the provider's window")


def test_an_agreed_window_at_a_checkpoint_moves_the_hosts_validation(
        spawn: Spawn, workdir: Path) -> None:
    with host_with_job(spawn, workdir) as (agent, fake, acme, _):
        fake.set(GPU, ecc_sbe_volatile=900)  # correctable errors climbing: suspect
        told = next_notice(acme)
        assert told.cause is ValidationCause.CORRECTABLE_TREND
        assert told.not_before > time.time() + 500  # the host's own lead
        window = proposed_window(acme, told)
        assert (window.outcome, window.state) == (m.Outcome.WINDOW, "proposed")
        assert window.start == pytest.approx(told.not_before, abs=0.01)
        assert window.end - window.start == told.pause_seconds
        # The job checkpoints every 5 s: it offers its next checkpoints, 5 s ahead at least.
        now = time.time()
        checkpoints = checkpoint_starts(now, 5.0, now + 5.0, window.expires_at)
        assert len(checkpoints) == 4
        settled = acme.counter_window(told.id, checkpoints)
        assert (settled.state, settled.start) == ("agreed", checkpoints[0])
        # The host moved its validation to the checkpoint and tells the job so ...
        moved = next_notice(acme, told)
        assert (moved.id, moved.status) == (told.id, m.NoticeStatus.SCHEDULED)
        assert moved.not_before == pytest.approx(checkpoints[0], abs=0.01)
        # ... and it starts then, not ten minutes after it was announced.
        started = next_notice(acme, moved)
        while started.status is m.NoticeStatus.SCHEDULED:
            started = next_notice(acme, started)
        assert (started.id, started.status) == (told.id, m.NoticeStatus.STARTED)
        (run,) = wait_until(lambda: finished(agent), what="the validation at the window")
        assert run["target"] == f"gpu:{GPU}" and run["started"] >= checkpoints[0]


def test_an_urgent_condition_overrides_a_late_window(spawn: Spawn, workdir: Path) -> None:
    with host_with_job(spawn, workdir) as (agent, fake, acme, controller):
        fake.set(GPU, remap_pending=1)  # after an uncorrectable error: a remap waits
        told = next_notice(acme)
        assert told.cause is ValidationCause.UNCORRECTABLE_MEMORY
        window = proposed_window(acme, told)
        bound = URGENCY[ValidationCause.UNCORRECTABLE_MEMORY].most_wait
        assert window.expires_at <= time.time() + bound
        # The job's next checkpoint is later than the condition may wait: overridden
        # (countered from the command line; --at belongs to the window step only).
        misuse = tenant_cli(controller, "list", "--at", "+60")
        assert misuse.returncode == 2 and misuse.stderr.count("\n") == 1, misuse.stderr
        done = tenant_cli(controller, "window", told.id, "--at",
                          f"{window.expires_at + 3600.0:.3f}", "--json")
        assert done.returncode == 0, done.stderr
        settled = json.loads(done.stdout)
        assert (settled["outcome"], settled["state"]) == ("window", "overridden")
        assert settled["start"] == pytest.approx(told.not_before, abs=0.01)
        # The host heard the window and keeps its own start; nothing ran.
        plan = wait_until(lambda: next((p for p in scheduled(agent).values()
                                        if p["window"]), None), what="the host's window")
        assert plan["cause"] == ValidationCause.UNCORRECTABLE_MEMORY.value
        assert plan["starts_at"] == pytest.approx(told.not_before, abs=0.01)
        assert plan["window"] == plan["starts_at"]
        assert finished(agent) is None


def test_under_the_default_lead_a_job_with_a_checkpoint_cadence_negotiates(
        spawn: Spawn, workdir: Path) -> None:
    last = time.time()
    declared = m.JobDeclaration(JOB, max_validation_pause=600, revision=1,
                                checkpoint_every=600.0, last_checkpoint=last)
    with host_with_job(spawn, workdir, negotiation=DEFAULTS, lead="",
                       declaration=declared) as (agent, fake, acme, _):
        before = time.time()
        fake.set(GPU, ecc_sbe_volatile=900)  # correctable errors climbing: suspect
        told = next_notice(acme)
        assert told.cause is ValidationCause.CORRECTABLE_TREND
        # The host gave the condition's least notice (an hour), not its 30 s lead ...
        urgency = URGENCY[ValidationCause.CORRECTABLE_TREND]
        assert told.not_before >= before + urgency.least_notice + NOTICE_MARGIN - 0.01
        assert told.not_before <= time.time() + urgency.least_notice + NOTICE_MARGIN
        # ... so the controller negotiates: it proposes the job's next checkpoint.
        window = proposed_window(acme, told)
        assert (window.outcome, window.state) == (m.Outcome.WINDOW, "proposed")
        assert window.start >= told.not_before
        assert (window.start - last) % 600.0 == pytest.approx(0.0, abs=0.01)
        # The job counters with the checkpoint after: agreed, and the host moves there.
        later = window.start + 600.0
        settled = acme.counter_window(told.id, [later])
        assert (settled.state, settled.start) == ("agreed", later)
        moved = next_notice(acme, told)
        assert (moved.id, moved.status) == (told.id, m.NoticeStatus.SCHEDULED)
        assert moved.not_before == pytest.approx(later, abs=0.01)
        plan = wait_until(lambda: next((p for p in scheduled(agent).values()
                                        if p["window"]), None), what="the host's window")
        assert plan["starts_at"] == pytest.approx(later, abs=0.01)


def test_under_the_default_lead_a_job_that_declared_no_cadence_is_not_negotiated(
        spawn: Spawn, workdir: Path) -> None:
    with host_with_job(spawn, workdir, negotiation=DEFAULTS, lead="") as (_, fake, acme,
                                                                          _c):
        fake.set(GPU, ecc_sbe_volatile=900)
        told = next_notice(acme)
        # The host's own 30 s lead: less than any condition's least notice, so the
        # controller proposes no window (it decided before the notice was published).
        assert told.not_before <= time.time() + 30.0
        assert told.id not in {n.request_id for n in acme.negotiations()}


def scheduled(agent: Agent) -> dict[str, dict[str, Any]]:
    return agent.request("status")["validation"]["scheduled"]
