"""The cluster view as `dqoesctl cluster status` prints it: nodes, services, tasks."""

from __future__ import annotations

import time
from collections import Counter

from ..duration import format_duration
from ..table import format_table
from .view import ClusterView


def _cpus(value: float | None, none: str = "-") -> str:
    return none if value is None else f"{value:.2f}"


def format_pipelines(view: ClusterView) -> str:
    """Each pipeline, then each stage's share of its target (a refused one: why)."""
    pipelines = [("PIPELINE", "TARGET", "METRIC", "MEASURED", "MEAN", "P95", "NOTE")]
    stages = [("STAGE", "NEXT", "SHARE", "TARGET", "MEASURED", "REPLICAS", "NODES", "CLASS",
               "WORK", "RATE")]
    for p in view.pipelines:
        note = (f"refused, unmanaged: {p.error}" if p.error else
                "" if p.feasible else "target below what its stages can do at 1 CPU a "
                "replica")
        pipelines.append((p.name, format_duration(p.target_s), p.metric or "-",
                          format_duration(p.measured_s), format_duration(p.mean_s),
                          format_duration(p.p95_s), note))
        for st in p.stages:
            share = "-" if st.target_s is None or not p.target_s else \
                f"{100 * st.target_s / p.target_s:.0f}%"
            stages.append((f"{p.name}/{st.name}", ",".join(st.next) or "-", share,
                           format_duration(st.target_s), format_duration(st.measured_s),
                           str(st.replicas) if st.asked in (None, st.replicas) else
                           f"{st.replicas}/{st.asked}", ",".join(st.nodes) or "-",
                           ",".join(st.classes) or "-", format_duration(st.work_s),
                           "-" if st.rate_hz is None else f"{st.rate_hz:.2f}/s"))
    lines = [format_table(pipelines)]
    if len(stages) > 1:
        lines += ["", format_table(stages)]
    lines.append("(a pipeline's MEASURED, MEAN and P95 are estimates: its stages' summed "
                 "along the path where that is largest)")
    return "\n".join(lines)


def format_cluster(view: ClusterView) -> str:
    nodes = [("NODE", "ROLE", "STATE", "BUDGET", "USED", "SPARE", "G", "S", "B", "IDLE",
              "PENDING", "REFUSED", "WHY")]
    for n in view.nodes:
        state = "up" if n.reachable else "unreachable"
        if n.availability != "active":  # Swarm schedules no new task there
            state += f" ({n.availability}{', placement' if n.paused_by_placement else ''})"
        nodes.append((n.name, n.role, state,
                      _cpus(n.budget_cpus), _cpus(n.used_cpus), _cpus(n.spare_cpus),
                      str(n.G), str(n.S), str(n.B), str(n.idle), str(n.pending),
                      str(n.refused), n.reason or ""))
    services = [("SERVICE", "MODE", "REPLICAS", "RUNNING", "TARGET", "METRIC", "S", "NOTE")]
    satisfied = Counter(t.service_id for t in view.tasks if t.cls == "S")  # one pass
    for s in view.services:
        note = (f"labels refused: {s.error}" if s.error else
                "updating" if s.updating else "")
        if s.avoid:
            note = (note + "; " if note else "") + "kept off " + ", ".join(
                n.name for n in view.nodes if n.id in s.avoid)
        services.append((s.name, s.mode, "-" if s.replicas is None else str(s.replicas),
                         str(s.running), format_duration(s.target_s), s.metric or "-",
                         str(satisfied[s.id]), note))
    tasks = [("TASK", "NODE", "STATE", "CLASS", "TARGET", "MEASURED", "LIMIT", "USAGE",
              "SAMPLES", "WHY")]
    for t in view.tasks:
        name = f"{t.service}.{t.slot}" if t.slot is not None else f"{t.service}.{t.node}"
        tasks.append((name, t.node or "-", t.state, t.cls, format_duration(t.target_s),
                      format_duration(t.measured_s),
                      "-" if t.cls == "unknown" else _cpus(t.cpu_limit_cores, "max"),
                      _cpus(t.cpu_usage_cores),
                      "-" if t.samples is None else str(t.samples), t.reason or ""))
    up = sum(1 for n in view.nodes if n.reachable)
    lines = [format_table(nodes), "", format_table(services), "", format_table(tasks), ""]
    if view.pipelines:
        lines += [format_pipelines(view), ""]
    lines.append(f"|S| {view.satisfied()} of {len(view.tasks)} tasks | nodes {up} of "
                 f"{len(view.nodes)} up")
    if not view.acting:
        lines.append("recommend only: placement makes no update (dqoesctl cluster act to "
                     "make them); it would make:" if view.recommended else
                     "recommend only: placement makes no update, and would make none now")
        lines.extend(f"  {time.strftime('%H:%M:%S', time.localtime(r.time_unix))}  {r.what}"
                     for r in view.recommended)
    if view.swarm_error:
        lines.append(f"! Swarm's API does not answer ({view.swarm_error}): the last view "
                     "of Swarm is shown")
    return "\n".join(lines)
