"""The scripted demo behind ``./scripts/demo``.

A controller, two GPU hosts and a tenant, each in its own network namespace on
one bridge. The tenant watches its feed while hosts join, an operator looks at
a host, one host's agent stops and comes back. Everything is torn down at the
end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harmonaize.testbed.cluster import TenantWatcher, TestCluster, Timeout
from harmonaize.testbed.netns import Lab

HOSTS = ["controller", "h1", "h2", "tenant"]


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def show_tenant(message: dict[str, Any]) -> None:
    body = message["body"]
    if message["kind"] == "pool-capacity":
        def b(v: dict[str, Any]) -> str:
            return f"{v['lo']}+" if v["hi"] is None else (
                str(v["lo"]) if v["lo"] == v["hi"] else f"{v['lo']}-{v['hi']}"
            )
        text = (f"capacity {body['pool']}/{body['gpu_class']}: hosts up {b(body['hosts_up'])}, "
                f"down {b(body['hosts_down'])}, GPUs {b(body['gpus_available'])}, "
                f"trend {body['trend']} (rev {body['revision']})")
    else:
        text = f"{message['kind']} {body}"
    print(f"   tenant | {message['topic']} #{message['seq']}: {text}", flush=True)


def capacity_is(up: int, down: int) -> Any:
    def check(message: dict[str, Any]) -> bool:
        if message.get("kind") != "pool-capacity":
            return False
        body = message["body"]
        return body["hosts_up"]["lo"] <= up <= (body["hosts_up"]["hi"] or up) and (
            body["hosts_down"]["lo"] <= down <= (body["hosts_down"]["hi"] or down)
        )

    return check


def indent(text: str) -> str:
    return "\n".join(f"   {line}" for line in text.rstrip().splitlines())


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
    cluster.start_agent("h1")
    cluster.start_agent("h2")
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
    cluster.start_agent("h2")
    tenant.wait_for(capacity_is(2, 0), 20, "h2 back", on_message=show_tenant)

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
            scenario(TestCluster(lab, workdir))
            say("tearing down: stopping every process, deleting the namespaces")
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
