"""The demo's negotiation scene: a reservation in rounds, then a maintenance window moved
to a checkpoint.

Tenant acme reserves H200s with ``harmonaize-tenant negotiate``: it proposes more than its
share, the controller counters with what its share allows, acme counters back with a later
start, the controller offers, acme accepts: a hold, which the scheduler's placement then
names (the hold starts, used). The job placed runs one stand-in rank on a GPU of h2, and
its declaration gives its checkpoint cadence. That GPU's correctable errors climb: h2 plans
a validation and names the condition behind it; the controller proposes the window at the
job's next checkpoint; acme counters with its own next checkpoints; the agreed one becomes
the validation's start on h2, which tells the job and validates the GPU then.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from controller.negotiation.maintenance import checkpoint_starts
from testbed.cluster import TenantWatcher, TestCluster, wait_until
from testbed.narrate import indent, say

#: The controller's terms for the demo: acme and globex negotiate with equal weights; a
#: tenant gets 5 s of notice at least before a window (the product's: 5 min to an hour).
CONTROLLER = ("[negotiation]\nweights = { acme = 1.0, globex = 1.0 }\nleast_notice = { "
              + ", ".join(f'"{c}" = 5' for c in ("gpu-fault", "uncorrectable-memory",
                                                 "thermal", "link-degraded",
                                                 "correctable-trend", "routine")) + " }\n")
#: Hosts announce validations this long ahead (the product's default is 30 s too); a job
#: that declared its checkpoint cadence gets the condition's least notice instead.
NOTICE_LEAD = 30.0
POOL, CLASS = "default", "H200"
JOB = "ckpt-9"
GPU = 5
#: The job checkpoints every 12 s (a real job: every 10 to 60 minutes).
CADENCE = 12.0


def _utc(stamp: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(stamp))


def negotiate(cluster: TestCluster, *args: str) -> dict[str, Any]:
    """One ``harmonaize-tenant negotiate`` step as acme; its one answer."""
    done = cluster.tenant_cli("negotiate", *args, "--json")
    if done.returncode != 0:
        raise RuntimeError(f"negotiate {args[0]} refused: {done.stderr.strip()}")
    return json.loads(done.stdout.splitlines()[-1])


def _line(answer: dict[str, Any]) -> str:
    outcome = answer["outcome"]
    if outcome in ("offer", "counter"):
        departs = f" (departs in {answer['departs']})" if answer.get("departs") else ""
        return (f"{outcome}{departs} {answer['offer_id']}: {answer['count']} GPUs from "
                f"{_utc(answer['start'])} to {_utc(answer['end'])} UTC, accept by "
                f"{_utc(answer['expires_at'])} (round {answer['round']})")
    if outcome == "hold":
        return (f"hold: {answer['count']} GPUs from {_utc(answer['start'])} to "
                f"{_utc(answer['end'])} UTC (a no-show after {_utc(answer['expires_at'])})")
    if outcome == "window":
        bound = time.strftime("%d %b %H:%M", time.gmtime(answer["expires_at"]))
        return (f"window {answer['state']}: {_utc(answer['start'])} to "
                f"{_utc(answer['end'])} UTC (the condition allows a start until {bound})")
    return f"{outcome} {answer.get('state') or answer.get('reason', '')}".strip()


def tenant_says(step: str, answer: dict[str, Any]) -> None:
    print(f"   acme   | {step}", flush=True)
    print(f"   ctrl   | {_line(answer)}", flush=True)


def reservation(cluster: TestCluster) -> None:
    say("negotiation in rounds: acme reserves 10-12 H200s for an hour, starting two to "
        "three hours from now, flexible in count (its share of the pool is half of the free "
        "GPUs the private feed released)")
    now = time.time()
    window = ["--pool", POOL, "--class", CLASS, "--duration", "3600"]
    first = negotiate(cluster, "propose", "r1", *window, "--min", "10", "--max", "12",
                      "--earliest", f"{now + 7200:.0f}", "--latest", f"{now + 10800:.0f}",
                      "--flexible", "count")
    tenant_says("propose r1: 10-12 GPUs, start 2-3 h from now, flexible in count", first)
    if first["outcome"] != "counter":
        raise RuntimeError(f"expected a counter, got {first}")
    share = first["count"]
    second = negotiate(cluster, "counter", "r1", "--offer", first["offer_id"], *window,
                       "--min", "2", "--max", str(share), "--earliest",
                       f"{now + 9000:.0f}", "--latest", f"{now + 10800:.0f}")
    tenant_says(f"counter r1: 2-{share} GPUs, start half an hour later", second)
    if second["outcome"] != "offer":
        raise RuntimeError(f"expected an offer, got {second}")
    held = negotiate(cluster, "accept", "r1", "--offer", second["offer_id"])
    tenant_says(f"accept r1's offer {second['offer_id']}", held)
    say("the operator lists the holds (harmonctl -C holds): kept out of what others are "
        "offered until acme's job starts, is released, or is a no-show")
    argv = [sys.executable, "-m", "harmonaize.harmonctl", "-C", str(cluster.admin_socket),
            "holds"]
    print(indent(cluster.lab.run("controller", argv).stdout), flush=True)
    say(f"the scheduler places acme's job {JOB} on h2 and names the hold it uses: "
        "the hold starts, counted to acme's record, never a no-show")
    placed = cluster.admin_request("place", {"job": JOB, "tenant": "acme", "hold": "r1",
                                             "members": [{"name": "0", "host": "h2"}]})
    print(f"   place {JOB} with hold r1: hold {placed.get('hold')}", flush=True)
    (listed,) = [n for n in cluster_negotiations(cluster) if n["request_id"] == "r1"]
    print(f"   acme   | negotiate list: r1 {listed['state']}", flush=True)


def cluster_negotiations(cluster: TestCluster) -> list[dict[str, Any]]:
    done = cluster.tenant_cli("negotiate", "list", "--json")
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _notice(message: dict[str, Any]) -> bool:
    return message.get("kind") == "validation-notice"


def show_notice(message: dict[str, Any]) -> None:
    if _notice(message):
        body = message["body"]
        print(f"   acme   | validation-notice {body['id']}: {body['status']}, member(s) "
              f"{', '.join(body['members'])} pause up to {body['pause_seconds']} s from "
              f"{_utc(body['not_before'])} UTC ({body['cause']})", flush=True)


def maintenance(cluster: TestCluster) -> None:
    say(f"{JOB}'s rank runs on h2's gpu {GPU}; acme declares that it may pause for "
        f"validation and that it checkpoints every {CADENCE:g} s")
    fake = cluster.gpus["h2"]
    rank = cluster.lab.popen("h2", [sys.executable, "-c", "import time; time.sleep(300)"],
                             env={**os.environ, "HARMONAIZE_JOB": JOB, "RANK": "0"})
    watcher: TenantWatcher | None = None
    try:
        fake.set(GPU, processes={rank.pid: 1 << 30})
        wait_until(lambda: cluster.agent_request("h2", "gpus")["gpus"][GPU]["jobs"], 20,
                   "h2's agent to see the rank")
        last = time.time()
        declaration = cluster.workdir / f"{JOB}.json"
        declaration.write_text(json.dumps({
            "job": JOB, "revision": 1, "max_validation_pause": 120,
            "checkpoint_every": CADENCE, "last_checkpoint": last}))
        done = cluster.tenant_cli("declare", str(declaration))
        if done.returncode != 0:
            raise RuntimeError(f"declaration refused: {done.stderr.strip()}")
        watcher = cluster.tenant_watch(topics=(f"job/acme/{JOB}/",))
        time.sleep(0.5)
        say(f"gpu {GPU} on h2 throws single-bit ECC errors: h2 plans a validation and "
            "names the condition (correctable-trend: it may wait up to 3 days); the job "
            "declared its cadence, so h2 gives the condition's least notice (an hour), not "
            f"its {NOTICE_LEAD:g} s lead, and the controller tells acme")
        fake.set(GPU, ecc_sbe_volatile=400)
        told = watcher.wait_for(_notice, 30, "the validation notice",
                                on_message=show_notice)["body"]
        window = wait_until(lambda: next((n for n in cluster_negotiations(cluster)
                                          if n["request_id"] == told["id"]), None), 20,
                            "the provider's window")
        print(f"   ctrl   | {_line(window)}: the job's next checkpoint after h2's plan",
              flush=True)
        checkpoints = checkpoint_starts(last, CADENCE, time.time() + 8.0,
                                        window["expires_at"])
        say("acme counters with its own next checkpoints (it would rather pause right after "
            "the one it is about to write); the controller takes the earliest that gives "
            "the least notice and fits the condition's bound")
        at = [arg for t in checkpoints[:3] for arg in ("--at", f"{t:.3f}")]
        agreed = negotiate(cluster, "window", told["id"], *at)
        tenant_says("window " + told["id"] + ": checkpoints at "
                    + ", ".join(_utc(t) for t in checkpoints[:3]) + " UTC", agreed)
        say("the agreed window reaches h2 as a deferral would: h2 moves its validation to "
            "the checkpoint, tells the job, and validates the GPU then")
        watcher.wait_for(lambda m: _notice(m) and m["body"]["status"] == "scheduled"
                         and abs(m["body"]["not_before"] - agreed["start"]) < 0.01, 20,
                         "the moved notice", on_message=show_notice)
        watcher.wait_for(lambda m: _notice(m) and m["body"]["status"] == "started", 60,
                         "the validation to start", on_message=show_notice)
        rows = wait_until(lambda: [r for r in cluster.agent_request("h2", "validations")[
            "history"] if r["finished"]], 60, "the validation to finish")
        print(f"   h2     | validated gpu {GPU} from {_utc(rows[0]['started'])} UTC (the agreed "
              f"window {_utc(agreed['start'])}): {rows[0]['outcome']}", flush=True)
    finally:
        if watcher is not None:
            watcher.proc.kill()
            watcher.proc.wait()
        rank.kill()
        rank.wait()
        fake.set(GPU, processes=None)
    cluster.admin_request("unplace", {"job": JOB})


def act(cluster: TestCluster) -> None:
    reservation(cluster)
    maintenance(cluster)
