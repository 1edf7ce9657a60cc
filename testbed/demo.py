"""The scripted demo behind ``./scripts/demo``.

A controller, two GPU hosts and a tenant, each in its own network namespace on
one bridge. The tenant watches its feed while hosts join, an operator looks at
a host, one host's agent stops and comes back; a job's rank hits an XID of its own
making, which quarantines nothing; a rank stops and the job's owner is told which
(:mod:`testbed.demojobhealth`); a reservation negotiated in rounds and a maintenance
window moved to a checkpoint (:mod:`testbed.demonegotiation`). Then a Slurm act
(:mod:`testbed.demoslurm`): a job placed by Slurm alone, its GPU failing,
the node drained in Slurm, the reset, the validation, the resume. Everything is torn
down at the end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed import demojobhealth, demonegotiation, demoslurm
from testbed.cluster import SMALL_CLUSTER, TenantWatcher, TestCluster, Timeout, wait_until
from testbed.narrate import capacity_is, indent, say, show_tenant
from testbed.netns import Lab
from testbed.ranks import RankKit, RankProcess, disagreement, issued, stop

HOSTS = ["controller", "h1", "h2", "tenant"]
#: The hosts' data links, watched by the links observer (eBPF where it works). The
#: agents are told they carry 20 Mb/s; h1's is shaped to that rate for the story.
SPEED = 20
LINKS = ('[observers.links]\ninclude = ["eth0"]\n'
         f"speeds = {{ eth0 = {SPEED} }}\n")
TUNING = "hold = 2.0\n"
JOB = "train-7"
GROUP = 61700  # the job's Unix group on its hosts; its ranks run as uids 61701, 61702


def scenario(cluster: TestCluster) -> None:
    say("starting the controller in its namespace "
        f"({cluster.lab.addr('controller')}, agents on :7400, feed on :7401)")
    cluster.start_controller()
    say("a tenant subscribes to the pool feed (it only ever sees aggregates; with two "
        "hosts the demo lets aggregates of one host through: the default is 5)")
    tenant: TenantWatcher = cluster.tenant_watch()
    time.sleep(0.5)
    say("starting host agents h1 and h2, each with eight simulated H200 GPUs "
        "(100 ms sampling, heartbeats every second)")
    cluster.start_agent("h1", extra=LINKS, tuning=TUNING)
    cluster.start_agent("h2", extra=LINKS, tuning=TUNING)
    tenant.wait_for(capacity_is(2, 0), 20, "two hosts up", on_message=show_tenant)

    say("every daemon and tenant authenticates with CurveZMQ; tenant acme tries to watch "
        "another tenant's jobs and is refused by the controller")
    refused = cluster.tenant_cli("watch", "--topic", "job/globex/", "--timeout", "1")
    print(indent(refused.stderr or "(nothing said)"), flush=True)

    say("an operator on h1 asks its agent: harmonctl status, then harmonctl gpus")
    print(indent(cluster.harmonctl("h1", "status")), flush=True)
    print(indent(cluster.harmonctl("h1", "gpus")), flush=True)
    say("the operator asks the controller: harmonctl -C hosts")
    argv = [sys.executable, "-m", "harmonaize.harmonctl", "-C", str(cluster.admin_socket),
            "hosts"]
    print(indent(subprocess.run(argv, check=False, capture_output=True, text=True).stdout),
          flush=True)

    say("stopping h2's agent (SIGTERM): it says goodbye, capacity falls (host counts come "
        "in buckets 0-1, 2-3, 4-7, ...: one host down reads like none, the GPUs show it)")
    began = time.monotonic()
    code = cluster.stop_agent("h2", signal.SIGTERM)
    print(f"   h2's agent exited with status {code}", flush=True)
    tenant.wait_for(capacity_is(1, 1), 20, "one host down", on_message=show_tenant)
    print(f"   the tenant saw it {time.monotonic() - began:.2f} s after the stop", flush=True)

    say("h2's agent comes back: capacity rises again")
    cluster.start_agent("h2", extra=LINKS, tuning=TUNING)
    tenant.wait_for(capacity_is(2, 0), 20, "h2 back", on_message=show_tenant)

    retune(cluster)

    say("gpu 2 on h1 starts throwing single-bit ECC errors: suspect -> validating -> ...")
    cluster.gpus["h1"].set(2, ecc_sbe_volatile=400)
    began = time.monotonic()
    while time.monotonic() - began < 20:
        rows = cluster.agent_request("h1", "validations")["history"]
        if rows and rows[0]["finished"]:
            break
        time.sleep(0.2)
    print(indent(cluster.harmonctl("h1", "validations")), flush=True)
    print(indent(cluster.harmonctl("h1", "health")), flush=True)
    say("the tenant sees only the capacity change: no host, GPU, check or value")
    tenant.wait_for(lambda m: m.get("kind") == "pool-capacity"
                    and m["body"]["gpus_available"]["lo"] == 8, 20, "capacity to fall",
                    on_message=show_tenant)

    say("killing h1's agent with SIGKILL: no goodbye, the controller notices missed heartbeats")
    began = time.monotonic()
    cluster.stop_agent("h1", signal.SIGKILL)
    tenant.wait_for(capacity_is(1, 1), 20, "h1 counted down", on_message=show_tenant)
    print(f"   counted down after {time.monotonic() - began:.1f} s "
          "(3 missed heartbeats of 1 s)", flush=True)

    demonegotiation.act(cluster)


def switches(rank: RankProcess) -> str:
    rows = rank.outcomes()
    return ", ".join(f"{algo}/{proto}" + (f" {ch} channels" if ch else "") + f" from {index}"
                     for index, algo, proto, ch in rows)


def application_xid(cluster: TestCluster, rank: RankProcess) -> None:
    """A rank's own fault on its GPU: judged the job's, it quarantines nothing."""
    say("h1's rank hits an illegal address on gpu 0 (XID 31), and the driver's line in "
        "the kernel log names its process: the job's own fault; the GPU stays healthy, "
        "nothing is drained, the job's owner is told")
    fake = cluster.gpus["h1"]
    fake.set(0, processes={rank.proc.pid: 1 << 30})
    gpu = lambda: cluster.agent_request("h1", "gpus")["gpus"][0]  # noqa: E731
    wait_until(lambda: gpu()["jobs"], 20, "the rank on gpu 0")
    cluster.kmsg["h1"].xid(0, 31, pid=rank.proc.pid, name="python3")
    fake.inject_xid(0, 31)
    wait_until(lambda: gpu()["recent_xids"], 20, "the XID to be judged")
    print(indent(cluster.harmonctl("h1", "gpus").split("\n\n")[-1]), flush=True)
    print(f"   gpu 0 is {gpu()['state']}", flush=True)
    fake.set(0, processes=None)


def retune(cluster: TestCluster) -> None:
    """A job across h1 and h2 retuned live, every rank switching at the same collective,
    also with one host's agent SIGKILLed mid-job."""
    say(f"a job across h1 and h2: the scheduler places {JOB} (Unix group {GROUP}); the "
        "tenant declares that the provider may pick ring or tree, LL or Simple, 2-16 "
        "channels for its allreduces")
    cluster.admin_request("place", {"job": JOB, "tenant": "acme", "group": str(GROUP),
                                    "members": [{"name": "0", "host": "h1"},
                                                {"name": "1", "host": "h2"}]})
    declaration = cluster.workdir / f"{JOB}.json"
    declaration.write_text(json.dumps({
        "job": JOB, "revision": 1,
        "tuning": [{"collectives": ["allreduce"], "algorithms": ["ring", "tree"],
                    "protocols": ["ll", "simple"], "min_channels": 2, "max_channels": 16}]}))
    done = cluster.tenant_cli("declare", str(declaration))
    if done.returncode != 0:
        raise RuntimeError(f"declaration refused: {done.stderr.strip()}")
    health = cluster.tenant_watch(topics=(f"job/acme/{JOB}/",))
    comm = 0x7E1A0000C0FFEE07
    with RankKit() as kit:
        say("two stand-in ranks of one communicator (the real tuner plugin inside, a stand-in "
            "NCCL 2.32), as unprivileged users, 200 allreduces a second")
        ranks = [kit.start(job=JOB, directory=cluster.policy_dir(host), comm=comm, n_ranks=2,
                           n_nodes=2, rate=200, uid=GROUP + 1 + i, gid=GROUP, lab=cluster.lab,
                           host=host, env={"RANK": str(i)})  # the launcher's rank: a member
                 for i, host in enumerate(("h1", "h2"))]
        traffic: list[Any] = []
        try:
            wait_until(lambda: all(cluster.agent_request(h, "policy", {"job": JOB})[
                "communicators"] for h in ("h1", "h2")), 30, "both agents to see the ranks")
            time.sleep(1.5)
            for rank in ranks:
                print(f"   rank on {rank.host}: {switches(rank)} (NCCL's own choice)", flush=True)
            say(f"bulk traffic fills h1's data link (shaped to {SPEED} Mb/s): h1's agent sees "
                "it congested and proposes; the controller arms the change on both hosts, "
                "both confirm, and it switches on every rank at the same collective")
            cluster.lab.run("h1", ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                                   "rate", f"{SPEED}mbit", "burst", "32kb", "latency", "50ms"])
            traffic.append(cluster.lab.popen("tenant", ["iperf3", "-s", "-p", "5299"],
                                             stdout=subprocess.DEVNULL))
            time.sleep(0.3)
            traffic.append(cluster.lab.popen("h1", [
                "iperf3", "-c", cluster.lab.addr("tenant"), "-p", "5299", "-t", "18"],
                stdout=subprocess.DEVNULL))
            wait_until(lambda: all(len(r.outcomes()) >= 2 for r in ranks), 40,
                       "the ranks to switch")
            for rank in ranks:
                print(f"   rank on {rank.host}: {switches(rank)}", flush=True)
            health.wait_for(lambda m: m.get("kind") == "job-health"
                            and m["body"].get("tuning_choice") != "default", 20,
                            "job-health with the new choice", on_message=show_tenant)
            application_xid(cluster, ranks[0])
            demojobhealth.hung_rank(cluster, JOB, ranks, health)
            say("SIGKILL h1's agent mid-job: its ranks keep what they follow (nothing reverts "
                "on a timer); it restarts and adopts its policy file")
            cluster.stop_agent("h1", signal.SIGKILL)
            time.sleep(2.0)
            for rank in ranks:
                print(f"   rank on {rank.host} with h1's agent dead: {switches(rank)}",
                      flush=True)
            cluster.start_agent("h1", extra=LINKS, tuning=TUNING)
            wait_until(lambda: cluster.agent_request("h1", "jobs")["jobs"], 20,
                       "the restarted agent to get the declaration again")
            history = cluster.agent_request("h1", "policy", {"job": JOB})["history"]
            print(f"   h1's agent restarted: {history[-1]['kind']}: {history[-1]['reason']}",
                  flush=True)
            say("the bulk transfer ends; after the hold the hosts agree the way back, "
                "again at one collective on every rank")
            traffic[-1].wait(timeout=60)
            wait_until(lambda: all(r.outcomes()[-1][1:3] == ("ring", "ll") for r in ranks),
                       60, "the ranks to return to NCCL's choice")
            time.sleep(0.5)
        finally:
            for proc in traffic:
                proc.kill()
                proc.wait()
            cluster.lab.run("h1", ["tc", "qdisc", "del", "dev", "eth0", "root"])
            counts = {}
            for host in ("h1", "h2"):
                for slot in cluster.agent_request(host, "policy", {"job": JOB})["plugin"]:
                    counts[slot["pid"]] = slot["collectives"]
            ended = stop(ranks)
            health.proc.kill()
            health.proc.wait()
        totals = [max(issued(r.log) or 0, counts.get(r.proc.pid, 0)) for r in ranks]
        for rank in ranks:
            print(f"   rank on {rank.host}: {switches(rank)}", flush=True)
        verdict = disagreement([r.outcomes() for r in ranks], totals)
        if verdict or not all(ended):
            raise RuntimeError(f"the ranks disagreed: {verdict or 'a rank was stuck'}")
        print(f"   every rank answered alike at each of {min(totals)} collectives", flush=True)
    cluster.admin_request("unplace", {"job": JOB})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the logs directory")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="harmonaize-demo-"))
    workdir.chmod(0o755)
    ok = False
    began = time.monotonic()
    try:
        say("creating hosts as network namespaces: " + ", ".join(HOSTS))
        with Lab(HOSTS, tag="demo") as lab:
            scenario(TestCluster(
                lab, workdir, controller_overrides=SMALL_CLUSTER + demonegotiation.CONTROLLER,
                notice_lead=demonegotiation.NOTICE_LEAD))
            say("tearing down: stopping every process, deleting the namespaces")
        demoslurm.act(workdir)
        say("tearing down: stopping every process and Slurm's daemons")
        ok = True
    except KeyboardInterrupt:
        print("\ninterrupted: everything has been torn down", file=sys.stderr)
        return 130
    except (Timeout, RuntimeError, OSError) as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
        for log in sorted(workdir.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}", file=sys.stderr)
        return 1
    finally:
        if args.keep or not ok:
            print(f"logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    say(f"done in {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
