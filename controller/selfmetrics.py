"""The controller's self-metrics, for Prometheus.

Read at scrape time on the controller's event loop. Counts only: no host
names, tenants, jobs or topics as labels (the cluster's size must not turn
into the metrics' cardinality, and host identities stay out of tenants'
reach however the endpoint is exposed).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

from controller.agreementphases import PHASES
from controller.limits import descriptors
from harmonaize import __version__, statemachine
from harmonaize.exhaustion import families as exhaustion_families
from harmonaize.messages import TuningStatus
from harmonaize.messages.jobhealth import Cause, Fault, Finding
from harmonaize.metrics import Family, counter, gauge

if TYPE_CHECKING:
    from controller.gateway.http import Gateway
    from controller.server import ControllerServer

P = "harmonaize_controller"
#: The controller's state machines, shown at 0 before any illegal move.
MACHINES = (PHASES.name,)
#: Feed counters (``ControllerCore.feed.stats`` keys) and what they are.
FEED_COUNTERS = {
    "published": ("feed_messages_published_total", "Messages published on the tenant feed."),
    "dropped": ("feed_messages_dropped_total",
                "Feed messages not sent because a subscriber's queue was full."),
    "gone": ("feed_subscribers_gone_total", "Subscribers found disconnected."),
    "requests": ("feed_requests_total", "Requests from tenants (subscriptions, declarations)."),
    "bad_request": ("feed_bad_requests_total", "Tenant requests refused as malformed."),
    "subscriptions": ("feed_subscriptions_total", "New subscribers."),
    "refused_subscriptions": ("feed_subscriptions_refused_total",
                              "Topic subscriptions refused (not the tenant's)."),
    "replays": ("feed_replays_total", "Topics replayed to a resuming subscriber."),
    "replayed_messages": ("feed_replayed_messages_total",
                          "Retained messages sent again to resuming subscribers."),
    "replays_throttled": ("feed_replays_throttled_total",
                          "Replays cut short by the tenant's replay budget (the client asks "
                          "again)."),
    "throttled_requests": ("feed_requests_throttled_total",
                           "Tenant requests dropped over the tenant's request budget."),
}


def collect(server: ControllerServer) -> list[Family]:
    core = server.core
    hosts = core.cluster.hosts.values()
    alive = sum(1 for host in hosts if host.alive)
    rejected = counter(f"{P}_frames_rejected_total", "Agent frames rejected, by reason.")
    for reason, count in sorted(core.rejected.items()):
        rejected.add(count, reason=reason)
    protocol = counter(f"{P}_protocol_messages_total",
                       "Agent protocol outcomes (accepted, duplicate, hello, ...).")
    for outcome, count in sorted(core.cluster.counters.items()):
        protocol.add(count, outcome=outcome)
    now = time.monotonic()
    states = Counter(core.agreement.health(job, now)[1].value
                     for job in core.redactor.placements)
    tuning = gauge(f"{P}_tuning_jobs",
                   "Placed jobs by how their ranks' retuning stands: steady, paused (ranks wait "
                   "at a switching point), diverged (ranks answered differently).")
    for state in TuningStatus:
        tuning.add(states.get(state.value, 0), state=state.value)
    changes = counter(f"{P}_tuning_changes_total",
                      "Multi-host tuning changes, by outcome (armed, confirmed, cancelled).")
    for outcome in ("armed", "confirmed", "cancelled"):
        changes.add(core.agreement.counters.get(outcome, 0), outcome=outcome)
    illegal = counter(f"{P}_illegal_transitions_total",
                      "State-machine moves the machine's table does not hold, refused and "
                      "counted (a bug: the state stayed as it was), by machine.")
    refused_moves = statemachine.illegal_counts()
    for machine in sorted(set(MACHINES) | set(refused_moves)):
        illegal.add(refused_moves.get(machine, 0), machine=machine)
    handshakes = counter(f"{P}_handshakes_failed_total",
                         "Connections whose ZeroMQ handshake failed, by port and reason (auth: "
                         "a key not on file; protocol: no CurveZMQ; no_detail: a wrong server "
                         "key, a timeout, a drop).")
    connections = gauge(f"{P}_connections", "TCP connections open now, by port.")
    for name, port in sorted(server.ports.items()):
        for reason in ("auth", "protocol", "no_detail"):
            handshakes.add(port.failed.get(reason, 0), port=name, reason=reason)
        connections.add(len(port.open_fds), port=name)
    fds = descriptors()
    families = [
        handshakes,
        connections,
        gauge(f"{P}_descriptors", "File descriptors open now, and the soft limit.").add(
            fds["open"], state="open").add(fds["limit"], state="limit"),
        gauge(f"{P}_info", "Version of this controller (always 1).").add(1, version=__version__),
        gauge(f"{P}_start_time_seconds", "When the controller started, in Unix time.").add(
            server.started_wall),
        gauge(f"{P}_hosts", "Known hosts, alive or down.").add(alive, state="alive").add(
            len(core.cluster.hosts) - alive, state="down"),
        counter(f"{P}_frames_received_total", "Frames received from agents.").add(
            core.frames),
        rejected,
        protocol,
        gauge(f"{P}_feed_subscribers", "Tenant connections subscribed now.").add(
            len(core.feed.hub.subscribers)),
        gauge(f"{P}_feed_topics", "Feed topics that have carried a message.").add(
            len(core.feed.seqs)),
        gauge(f"{P}_jobs_placed", "Jobs with a placement from the scheduler.").add(
            len(core.redactor.placements)),
        tuning,
        changes,
        illegal,
        gauge(f"{P}_storage_paused", "1 while the database's disk is full: writing and "
              "acknowledgements pause, reads go on.").add(int(server.writer.paused)),
        counter(f"{P}_storage_full_total", "Times writing paused for a full disk.").add(
            server.writer.stats.episodes),
        counter(f"{P}_storage_failed_writes_total",
                "Batches that found no room on disk (first tries and retries).").add(
            server.writer.stats.failed_writes),
    ]
    for key, (name, help_text) in FEED_COUNTERS.items():
        families.append(counter(f"{P}_{name}", help_text).add(core.feed.stats.get(key, 0)))
    stats = server.admin.stats
    families += [
        counter(f"{P}_admin_requests_total", "Requests on the admin socket.").add(
            stats.requests),
        counter(f"{P}_admin_denied_total",
                "Admin requests refused for lack of permission.").add(stats.denied),
        counter(f"{P}_admin_refused_busy_total",
                "Admin connections refused: the caller's uid, or all non-root callers, "
                "had as many open as allowed.").add(stats.refused_busy),
        counter(f"{P}_admin_idle_closed_total",
                "Admin connections closed for sitting idle.").add(stats.idle_closed),
    ]
    families += job_health_families(server)
    families += exhaustion_families(P, server.exhaustion)
    families += server.scheduler.families()
    if server.gateway is not None:
        families += gateway_families(server.gateway)
    if server.metrics is not None:
        families += server.metrics.families()
    return families


def job_health_families(server: ControllerServer) -> list[Family]:
    """Jobs' findings in force and application XIDs: counts by class only (no job)."""
    board = server.core.jobhealth
    held = Counter((v.finding, v.cause) for v, _, _ in board.current.values())
    findings = gauge(f"{P}_job_findings",
                     "Hangs, stalls and stragglers in force across jobs' hosts, by finding and "
                     "cause (stalls caused paused are told to operators only).")
    for finding in (Finding.HANG, Finding.STALL, Finding.STRAGGLER):
        for cause in Cause:
            findings.add(held.get((finding, cause), 0), finding=finding.value,
                         cause=cause.value)
    xids = counter(f"{P}_application_xids_total",
                   "XIDs a job's own process caused, passed on to its owner, by fault class.")
    for fault in Fault:
        xids.add(board.xids.get(fault.value, 0), fault=fault.value)
    dropped = counter(f"{P}_job_health_dropped_total",
                      "Hosts' job-health reports or parts of them dropped, by reason (a host "
                      "the job is not placed on, ranks placed elsewhere, caps).")
    for reason in ("unplaced", "not_placed_here", "rank_not_placed_here", "too_many_comms",
                   "too_many_hosts", "not_an_application_xid"):
        dropped.add(board.counters.get(reason, 0), reason=reason)
    return [findings, xids, dropped]


def gateway_families(gateway: Gateway) -> list[Family]:
    guard = gateway.connections
    return [
        gauge(f"{P}_gateway_connections", "HTTP gateway connections open now.").add(
            guard.open),
        counter(f"{P}_gateway_connections_refused_total",
                "HTTP gateway connections closed as accepted, by the cap they met.").add(
            guard.stats.refused_total, cap="all").add(
            guard.stats.refused_address, cap="address"),
        counter(f"{P}_gateway_timeouts_total",
                "HTTP gateway connections closed for a request's headers or body not "
                "arriving in time.").add(guard.stats.header_timeouts, part="headers").add(
            gateway.stats.body_timeouts, part="body"),
        counter(f"{P}_gateway_malformed_requests_total",
                "HTTP gateway requests that were not HTTP it could parse (answered "
                "400).").add(guard.stats.malformed),
    ]
