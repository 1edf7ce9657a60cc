"""The agent's self-metrics: what ``harmonctl status`` shows, for Prometheus.

Read at scrape time from the daemon's own records, on its event loop; the GPU,
links, RDMA and validation domains give their own families (their ``metrics``
modules). Labels come from fixed sets (observer names, states, event reasons) and,
as node_exporter does, the host's own NICs (``device``) with their direction and
traffic class; never a flow, job, tenant or GPU: per-GPU telemetry stays on the
operator socket.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from agent.energy import metrics as energy_metrics
from agent.gpu import metrics as gpu_metrics
from agent.gpu.states import GPU
from agent.jobhealth import metrics as jobhealth_metrics
from agent.links import metrics as link_metrics
from agent.observers.base import State
from agent.rdma import metrics as rdma_metrics
from agent.remediation.engine import REMEDIATION
from agent.validation import metrics as validation_metrics
from harmonaize import __version__, statemachine
from harmonaize.exhaustion import families as exhaustion_families
from harmonaize.messages import Health, Status
from harmonaize.metrics import Family, counter, gauge

if TYPE_CHECKING:
    from agent.daemon import AgentDaemon

P = "harmonaize_agent"


def collect(daemon: AgentDaemon) -> list[Family]:
    return [
        *_process(daemon),
        *_observers(daemon),
        *link_metrics.families(P, daemon.observers, daemon.observations.links,
                               daemon.last_step.links.links if daemon.last_step else ()),
        *rdma_metrics.families(P, daemon.observations.rdma, daemon.rdma_cc),
        *_health(daemon),
        *_transitions(),
        *gpu_metrics.families(P, daemon.summary, daemon.advisories_sent,
                              daemon.health.gpus.xids_by_class),
        *energy_metrics.families(P, daemon.energy),
        *jobhealth_metrics.families(P, daemon.jobhealth),
        *_uplink(daemon),
        *validation_metrics.families(P, daemon.validation, daemon.events_by_reason),
        *_socket(daemon),
        *exhaustion_families(P, daemon.exhaustion),
        *(daemon.metrics.families() if daemon.metrics is not None else ()),
    ]


def _process(daemon: AgentDaemon) -> list[Family]:
    return [
        gauge(f"{P}_info", "Version and identity of this agent (always 1).").add(
            1, version=__version__, pool=daemon.cfg.agent.pool, gpu_class=daemon.gpu_class),
        gauge(f"{P}_start_time_seconds", "When the agent started, in Unix time.").add(
            daemon.epoch / 1e6),
        gauge(f"{P}_ready", "Whether start-up finished (systemd's READY=1 was sent).").add(
            daemon.ready),
        gauge(f"{P}_sampling_interval_seconds", "Configured sampling interval.").add(
            daemon.cfg.agent.interval),
        counter(f"{P}_sampling_passes_total", "Sampling passes run.").add(daemon.passes),
        counter(f"{P}_sampling_woken_passes_total",
                "Extra passes run because an observer saw an event.").add(daemon.woken_steps),
        counter(f"{P}_sampling_overruns_total",
                "Times the loop fell behind and skipped ticks.").add(daemon.overruns),
        gauge(f"{P}_sampling_last_pass_duration_seconds",
              "Time the last sampling pass took.").add(daemon.last_pass_seconds),
    ]


def _observers(daemon: AgentDaemon) -> list[Family]:
    state = gauge(f"{P}_observer_state", "Each observer's state (1 for the current one).")
    success = gauge(f"{P}_observer_last_success",
                    "Whether an observer's last sample worked (absent before the first).")
    duration = gauge(f"{P}_observer_last_duration_seconds",
                     "Time an observer's last sample took.")
    runs = counter(f"{P}_observer_samples_total", "Samples an observer took.")
    failures = counter(f"{P}_observer_failures_total", "Samples of an observer that failed.")
    for record in daemon.observers.records.values():
        for value in State:
            state.add(record.state is value, observer=record.name, state=value.value)
        success.add(record.last_success, observer=record.name)
        duration.add(record.last_duration, observer=record.name)
        runs.add(record.samples, observer=record.name)
        failures.add(record.failures, observer=record.name)
    return [state, success, duration, runs, failures]


#: The agent's state machines, shown at zero before any illegal move.
MACHINES = (GPU.name, REMEDIATION.name)


def _transitions() -> list[Family]:
    illegal = counter(f"{P}_illegal_transitions_total",
                      "State-machine moves refused because their table has no such move "
                      "(a bug: each kind is logged once), by machine.")
    counts = dict.fromkeys(MACHINES, 0) | statemachine.illegal_counts()
    for machine, count in sorted(counts.items()):
        illegal.add(count, machine=machine)
    return [illegal]


def _health(daemon: AgentDaemon) -> list[Family]:
    summary = daemon.summary
    health = gauge(f"{P}_health", "The host's health (1 for the current one).")
    conditions = gauge(f"{P}_conditions", "Problem conditions holding now, by type.")
    if summary is not None:
        for value in Health:
            health.add(summary.health is value, health=value.value)
        holding = Counter(c.type for c in summary.conditions if c.status is Status.TRUE)
        for kind, count in sorted(holding.items()):
            conditions.add(count, type=kind)
    events = counter(f"{P}_events_total", "Host events raised, by reason.")
    for reason, count in sorted(daemon.events_by_reason.items()):
        events.add(count, reason=reason)
    return [
        health, conditions,
        gauge(f"{P}_schedulable", "Whether the host offers capacity to tenants.").add(
            summary.schedulable if summary is not None else None),
        gauge(f"{P}_drained", "Whether an operator drained the host.").add(
            daemon.drained is not None),
        events,
    ]


def _uplink(daemon: AgentDaemon) -> list[Family]:
    uplink = daemon.uplink
    if uplink is None:
        return []
    status = uplink.status()
    return [
        counter(f"{P}_uplink_messages_sent_total",
                "Numbered messages sent to the controller (sequence number).").add(
            status["last_seq"]),
        counter(f"{P}_uplink_messages_acked_total",
                "Messages the controller acknowledged (acknowledged sequence number).").add(
            status["acked_seq"]),
        counter(f"{P}_uplink_events_dropped_total",
                "Events dropped because the outbox was full while the controller was "
                "away.").add(status["dropped_events"]),
        counter(f"{P}_uplink_messages_resent_total", "Messages sent again.").add(
            status["resent"]),
        counter(f"{P}_uplink_resyncs_total", "Times the controller asked for a resync.").add(
            status["resyncs"]),
        counter(f"{P}_uplink_rejected_frames_total",
                "Frames from the controller that were refused.").add(status["rejected_frames"]),
        gauge(f"{P}_uplink_queued_messages", "Messages waiting to be sent.").add(
            status["queued"]),
        gauge(f"{P}_uplink_last_ack_age_seconds",
              "Seconds since the controller last acknowledged (absent before the first).").add(
            status["last_ack_age_seconds"]),
    ]


def _socket(daemon: AgentDaemon) -> list[Family]:
    stats = daemon.opsocket.stats
    return [
        counter(f"{P}_socket_requests_total", "Requests on the operator socket.").add(
            stats.requests),
        counter(f"{P}_socket_errors_total", "Operator requests that failed.").add(
            stats.errors),
        counter(f"{P}_socket_denied_total",
                "Operator requests refused for lack of permission.").add(stats.denied),
        counter(f"{P}_socket_refused_busy_total",
                "Operator connections refused: the caller's uid, or all non-root callers, "
                "had as many open as allowed.").add(stats.refused_busy),
        counter(f"{P}_socket_idle_closed_total",
                "Operator connections closed for sitting idle.").add(stats.idle_closed),
    ]
