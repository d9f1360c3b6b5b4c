"""The manager: the paper's QoE Analyst on Docker Swarm. It holds no state of its own: what
it knows comes from Swarm (nodes, services and their labels, tasks: swarmapi.py), read
again every tick (the task list only when something may have changed it: SwarmReader), and
from the reports of the nodes' agents (server.py), so a manager started again rebuilds the
same view within a tick and a report interval.

A tick's work follows what changed: what it derives from Swarm's snapshot (who owns each
container, the view's order of the tasks, each node's labels) is worked out again only
when the snapshot changed, and a node's tasks in the view only when its report, its
reachability or the snapshot did. A report's work is in proportion to its containers,
whatever the number of nodes.

Every tick it reads Swarm, works out which service labels each node must have (the
`dqoes.` labels of the services with a task on it, which the connection to that node sends
when they change; a pipeline's stage gets its share of the pipeline's target instead:
pipelines.py declares them, split.py splits the target from the stages' measurements),
builds the cluster view (view.py) and gives it to the placement policy,
if one is chosen, and to the pipelines' scaler (scaling.py), whose actions it then carries
out (actions.py), or, recommending only
(`--recommend`, switched with the `cluster-act` and `cluster-recommend` requests), keeps
in the view as what it would do.

A node may report only about itself. Its identity is its certificate's (identity.py), and
each container it reports on is checked against Swarm's own task list: a container of a
task that Swarm placed on another node is refused at once; one that no task of Swarm's
has is refused when Swarm still does not know it GRACE_S later (a task that has just
started may be reported before Swarm's list shows its container). Refused claims are
counted per node, logged, and named in the reply to the report; they change nothing.

The reply also asks the node for the report interval the manager can sustain (pace.py),
worked out every PACE_WINDOW_S, as reports come, from the CPU time the process took and
what its ticks took of it, and from how late its last tick started; a node's
reports are taken no sooner than MIN_GAP of that interval apart (`report_due`), however
fast it sends them.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..engines.client import Engine, EngineError
from ..logs import RateLimitedLog
from ..membership.labels import METRIC, TARGET
from . import swarmapi
from .actions import SwarmActions, Update
from .pace import Pace
from .pipelines import Pipeline, Refused, declared
from .placement import ALPHA, PlacementParams
from .protocol import Ack, ContainerReport, Report
from .qoe_placement import QoEPlacement
from .split import Split, settle, split
from .stage_measures import StageHistory, critical_sum, stage_measurements
from .swarmapi import Snapshot, SwarmReader, SwarmTask
from .view import (
    ClusterView,
    NodeView,
    PipelineView,
    Placement,
    Recommendation,
    ServiceView,
    StageView,
    TaskView,
)

log = logging.getLogger(__name__)

GRACE_S = 10.0
NODE_TIMEOUT_S = 5.0  # without a report, a node is unreachable
PACE_WINDOW_S = 1.0
MIN_GAP = 0.25  # of the interval asked: a node's reports are taken no closer together
MAX_RECOMMENDED = 20  # updates a recommending manager keeps in its view, the latest
# What a pipeline's split gives out of its target. A node holds a stage at its share, within
# its band: stages at their bands' slow edge add up to SCATTER_ROOM of the target, which leaves
# the rest to the end-to-end window's own scatter (a window's mean of ten to thirty requests,
# a hog raised before a node answers it, a step of the load). Shares that added up to
# T / (1 + alpha) left the testbed's pipeline at 0.98 T in its median window (run 3).
SCATTER_ROOM = 0.75
BUDGET = SCATTER_ROOM / (1.0 + ALPHA)
RESPLIT_S = 5.0  # a pipeline's split is made again at most so often (its stages' windows
#                  move slower; a split of 32 stages and 256 paths takes up to 30 ms)

PLACEMENTS: dict[str, Callable[[PlacementParams], Placement]] = {"qoe": QoEPlacement}
"""Placement policies by name (`dqoes-manager --placement NAME`), built with the manager's
placement parameters; none by default."""


@dataclass
class NodeReports:
    """What the manager has from one node's agent."""

    connected: bool = False
    report: Report | None = None
    received: float | None = None  # monotonic
    accepted: dict[str, ContainerReport] = field(default_factory=dict)  # by container ID
    unverified: dict[str, float] = field(default_factory=dict)  # container ID: first seen
    refused: int = 0
    logged: set[str] = field(default_factory=set)  # refused containers already logged


@dataclass(eq=False)
class SwarmIndex:
    """What the view needs of a Swarm snapshot, worked out once per snapshot."""

    snapshot: Snapshot
    owners: dict[str, str]  # container ID -> the node its task is on
    tasks: list[SwarmTask]  # of the services of ours, desired running, in the view's order
    on_node: dict[str, list[int]]  # node ID ("": none yet) -> its tasks' places in `tasks`
    of_service: dict[str, list[int]]  # service ID -> the same
    running: Counter[str]  # service ID -> its tasks running
    starting: Counter[str]  # service ID -> its tasks starting (swarmapi.starting)

    @classmethod
    def of(cls, snap: Snapshot) -> SwarmIndex:
        def hostname(node_id: str) -> str:
            node = snap.nodes.get(node_id)
            return node.hostname if node else ""

        ours = sorted((t for t in snap.tasks if t.desired_state == "running"
                       and (s := snap.services.get(t.service_id)) and s.concerns_us),
                      key=lambda t: (snap.services[t.service_id].name, t.slot or 0,
                                     hostname(t.node_id)))
        on_node: dict[str, list[int]] = defaultdict(list)
        of_service: dict[str, list[int]] = defaultdict(list)
        for i, t in enumerate(ours):
            on_node[t.node_id].append(i)
            of_service[t.service_id].append(i)
        starting = Counter(t.service_id for t in snap.tasks if swarmapi.starting(t)
                           and (s := snap.services.get(t.service_id)) and s.concerns_us)
        return cls(snap, snap.container_node(), ours, dict(on_node), dict(of_service),
                   Counter(t.service_id for t in ours if t.state == "running"), starting)


@dataclass(eq=False)
class NodeTasks:
    """A node's tasks in the last view, and what they were made of."""

    index: SwarmIndex
    accepted: dict[str, ContainerReport] | None
    why: str | None  # its reachability
    views: list[TaskView]
    classes: Counter[str]


def judge(node_id: str, report: Report, owners: dict[str, str], unverified: dict[str, float],
          now: float, grace: float = GRACE_S
          ) -> tuple[dict[str, ContainerReport], list[tuple[str, str]], dict[str, float]]:
    """Split a node's report by what Swarm says of each container (`owners`: container ID
    -> the node its task is on): the node's own (accepted), the refused (with why), and
    the not yet known (container ID -> since when) that may become known."""
    accepted, refused, waiting = {}, [], {}
    for c in report.containers:
        owner = owners.get(c.id)
        if owner == node_id:
            accepted[c.id] = c
        elif owner is not None:
            refused.append((c.id, "not a container of this node's tasks"))
        elif now - unverified.get(c.id, now) > grace:
            refused.append((c.id, "no task of Swarm's runs this container"))
        else:
            waiting[c.id] = unverified.get(c.id, now)
    return accepted, refused, waiting


class Manager:
    """The manager's state. `tick` runs in the main loop; `connected`, `receive`,
    `disconnected` and `services_for` are called from the connections' threads."""

    def __init__(self, engine: Engine, node_id: str, node_timeout: float = NODE_TIMEOUT_S,
                 placement: Placement | None = None, acting: bool = True,
                 scaling: Placement | None = None) -> None:
        self.engine = engine
        self.node_id = node_id
        self.node_timeout = node_timeout
        self.placement = placement
        self.scaling = scaling  # of the pipelines' stages (scaling.py, darly_scaling.py)
        self.acting = acting  # else placement's and scaling's updates are recommended
        # An update's effect (its Update with no text): when last asked and its latest text
        # (its why carries measured figures that move from tick to tick); oldest first.
        self._recommended: dict[Update, tuple[float, str]] = {}
        self._lock = threading.Lock()
        self._swarm = SwarmReader(engine)
        self._tasks_wanted = False  # a node reported a container Swarm's last list lacks
        self._snapshot = Snapshot()
        self._index = SwarmIndex.of(self._snapshot)
        self._owners: dict[str, str] = {}
        self._node_tasks: dict[str, NodeTasks] = {}  # the tick's own
        self._pushed: tuple[SwarmIndex, dict[str, dict[str, str]]] | None = None
        self._swarm_error: str | None = "not read yet"
        self._nodes: dict[str, NodeReports] = {}
        self._pushes: dict[str, dict[str, dict[str, str]]] = {}  # node ID: its services
        self._pipelines: list[Pipeline] = []
        self._refused: list[Refused] = []
        self._splits: dict[Pipeline, tuple[float, Split]] = {}  # each one's: when made, held
        self._history = StageHistory()  # the stages' rates and works, for splits and scaling
        self._view: ClusterView | None = None
        self._quiet: dict[str, float] = {}  # placement refusals logged, and when
        self._per_node = RateLimitedLog(log)  # a node chooses how many claims it refuses
        self.pace = Pace()
        # The pace's window: since when (monotonic, process CPU), reports taken, the CPU of
        # the ticks ended in it, how late the latest tick started
        self._window = (time.monotonic(), time.process_time())
        self._taken = 0
        self._tick_cpu = 0.0
        self._late = 0.0

    # --- the main loop -------------------------------------------------------------------

    def tick(self, now: float, late_s: float = 0.0) -> ClusterView:
        """Read Swarm, work out each node's labels, build the view, run placement and
        the pipelines' scaler; then the report interval to ask (`late_s`: how much later
        than planned this tick started)."""
        started_cpu = time.thread_time()
        with self._lock:
            self._late = max(self._late, late_s)
            wanted, self._tasks_wanted = self._tasks_wanted, False
        try:
            snapshot, error = self._swarm.read(now, wanted), None
        except EngineError as e:
            snapshot, error = None, str(e)
        # Worked out of the lock (the reports wait for it): a snapshot of 100,000 tasks
        # takes a second to index; only this thread changes self._index.
        index = self._index if snapshot is None or snapshot is self._index.snapshot \
            else SwarmIndex.of(snapshot)
        with self._lock:
            self._tasks_wanted |= wanted and snapshot is None
            if error != self._swarm_error:
                if error:
                    log.warning("Swarm's API: %s; keeping the last view of it", error)
                elif self._swarm_error != "not read yet":
                    log.info("Swarm's API answers again")
            self._swarm_error = error
            if index is not self._index:
                services_changed = index.snapshot.services is not self._snapshot.services
                self._snapshot, self._index, self._owners = index.snapshot, index, index.owners
                if services_changed:
                    self._declared(*declared(self._snapshot.services.values()))
            # The view is built from a copy, outside the lock: the nodes' reports wait for
            # the lock.
            reported = {nid: copy.copy(r) for nid, r in self._nodes.items()}
        view = self._build(index, reported, error, now)
        with self._lock:
            view = self._view = replace(
                view, acting=self.acting,
                recommended=() if self.acting else self._recommendations(),
                pipelines=self._pipeline_views(view.tasks, index, now))
            labels = self._stage_labels()
            if self._pushed is None or self._pushed != (index, labels):
                self._pushes, self._pushed = _pushes(self._snapshot, labels), (index, labels)
        if (self.placement is not None or self.scaling is not None) and snapshot is not None:
            actions = SwarmActions(view, now, self._quiet)
            for name, policy in (("placement", self.placement), ("scaling", self.scaling)):
                try:
                    if policy is not None:
                        policy.tick(view, now, actions)
                except Exception:  # a policy's bug must not take the manager down
                    log.exception("%s failed", name)
            with self._lock:
                acting = self.acting
                if not acting and self._recommend(actions.updates()):
                    view = self._view = replace(view, recommended=self._recommendations())
            if acting:
                actions.carry_out(self.engine)
        with self._lock:
            self._tick_cpu += time.thread_time() - started_cpu
        return view

    def _pace(self, now: float) -> None:
        """(Under the lock.) The interval to ask, once the window is PACE_WINDOW_S long:
        the ticks may take longer than that, the reports' pace must not wait for them."""
        wall0, cpu0 = self._window
        if now - wall0 < PACE_WINDOW_S:
            return
        cpu = time.process_time()
        before = self.pace.interval_s
        nodes = sum(1 for r in self._nodes.values() if r.connected)
        after = self.pace.update(now - wall0, cpu - cpu0, self._tick_cpu, self._taken,
                                 nodes, self._late)
        self._window, self._taken, self._tick_cpu, self._late = (now, cpu), 0, 0.0, 0.0
        if after != before:
            log.info("report interval asked of the nodes: %.1f s (%d nodes, %.2f ms of CPU "
                     "a report, the ticks %.2f of a core)", after, nodes,
                     1e3 * (self.pace.report_cpu_s or 0.0), self.pace.tick_cores or 0.0)

    def set_acting(self, acting: bool) -> bool:
        """Make placement's updates from the next tick on (True), or only recommend them;
        whether that changed anything."""
        with self._lock:
            if acting == self.acting:
                return False
            self.acting = acting
            self._recommended.clear()
            if self._view is not None:
                self._view = replace(self._view, acting=acting, recommended=())
            return True

    def _recommend(self, updates: list[Update]) -> bool:
        """(Under the lock.) Keeps `updates` as recommended now (each new one logged);
        whether there were any."""
        for update in updates:
            effect = replace(update, what="")
            if self._recommended.pop(effect, None) is None:
                log.info("placement (recommend only, not made): %s", update.what)
            self._recommended[effect] = (time.time(), update.what)
        for effect in list(self._recommended)[:-MAX_RECOMMENDED]:
            del self._recommended[effect]
        return bool(updates)

    def _recommendations(self) -> tuple[Recommendation, ...]:
        """(Under the lock.) The updates recommended, the latest first."""
        return tuple(Recommendation(t, what) for t, what in reversed(self._recommended.values()))

    def view(self) -> ClusterView | None:
        """The view of the last tick."""
        with self._lock:
            return self._view

    # --- the nodes' connections ----------------------------------------------------------

    def is_node(self, node_id: str) -> bool:
        """Whether Swarm has this node (a removed node's certificate stays valid until it
        expires: Swarm's list is what says it is still one)."""
        with self._lock:
            return node_id in self._snapshot.nodes

    def connected(self, node_id: str) -> None:
        with self._lock:
            self._nodes.setdefault(node_id, NodeReports()).connected = True

    def disconnected(self, node_id: str) -> None:
        with self._lock:
            reports = self._nodes.get(node_id)
            if reports is not None:
                reports.connected = False

    def services_for(self, node_id: str) -> dict[str, dict[str, str]]:
        """The dqoes. labels of the services with a task on that node."""
        with self._lock:
            return self._pushes.get(node_id, {})

    def report_due(self, node_id: str) -> float:
        """When (monotonic) the next report of that node may be taken."""
        with self._lock:
            reports = self._nodes.get(node_id)
            if reports is None or reports.received is None:
                return -math.inf
            return reports.received + MIN_GAP * self.pace.interval_s

    def receive(self, node_id: str, report: Report, now: float) -> Ack:
        """Judge a report of that node (its certificate's ID) and keep what is its own;
        the acknowledgement asks for the interval the manager can sustain."""
        with self._lock:
            self._taken += 1
            self._pace(time.monotonic())
            reports = self._nodes.setdefault(node_id, NodeReports(connected=True))
            accepted, refused, waiting = judge(node_id, report, self._owners,
                                               reports.unverified, now)
            reports.report, reports.received = report, now
            reports.accepted, reports.unverified = accepted, waiting
            self._tasks_wanted |= bool(waiting)
            reports.refused += len(refused)
            name = self._name(node_id)
            for cid, why in refused:
                if cid not in reports.logged:
                    self._per_node.log(logging.WARNING, node_id,
                                       "node %s reported on container %s: refused, %s",
                                       name, cid[:12], why)
                    reports.logged.add(cid)
            reports.logged &= {cid for cid, _ in refused}
            return Ack(report.seq, tuple(refused), self.pace.asked())

    def _name(self, node_id: str) -> str:
        node = self._snapshot.nodes.get(node_id)
        return node.hostname if node else node_id

    # --- the view ----------------------------------------------------------------------

    def _build(self, index: SwarmIndex, reported: dict[str, NodeReports],
               swarm_error: str | None, now: float) -> ClusterView:
        """The cluster view from Swarm's snapshot and the nodes' reports (its `acting` and
        `recommended` are the caller's to set). A node's tasks are made again only if its
        report, its reachability or the snapshot changed since the last view."""
        snap = index.snapshot
        reachable = {nid: self._reachability(snap.nodes[nid], reported.get(nid), now)
                     for nid in snap.nodes}
        tasks: list[TaskView] = [None] * len(index.tasks)  # type: ignore[list-item]
        node_tasks = {}
        for node_id, places in index.on_node.items():
            reports = reported.get(node_id)
            accepted = reports.accepted if reports else None
            why = reachable.get(node_id, "not placed on a node yet")
            made = self._node_tasks.get(node_id)
            if made is None or made.index is not index or made.accepted is not accepted \
                    or made.why != why:
                views = [_task_view(snap, index.tasks[i], why, accepted) for i in places]
                made = NodeTasks(index, accepted, why, views, Counter(t.cls for t in views))
            node_tasks[node_id] = made
            for i, view in zip(places, made.views, strict=True):
                tasks[i] = view
        self._node_tasks = node_tasks
        nodes = [_node_view(n, reachable[n.id], reported.get(n.id) or NodeReports(),
                            node_tasks[n.id].classes if n.id in node_tasks else Counter(),
                            now)
                 for n in sorted(snap.nodes.values(), key=lambda n: n.hostname)]
        services = [s for s in snap.services.values() if s.concerns_us]
        service_views = [ServiceView(
            s.id, s.name, s.mode, s.replicas, index.running[s.id],
            s.objective.target_s if s.objective else None,
            s.objective.metric if s.objective else None, s.error, s.updating, s.start_first,
            s.avoid, index.starting[s.id]) for s in sorted(services, key=lambda s: s.name)]
        return ClusterView(time.time(), self.node_id, swarm_error, nodes, service_views,
                           tasks, by_node={nid: made.views for nid, made in node_tasks.items()})

    def _declared(self, pipelines: list[Pipeline], refused: list[Refused]) -> None:
        """(Under the lock.) Keeps the pipelines Swarm's labels declare; a refusal that is
        new, or whose reason changed, is logged once."""
        before = {r.name: r.reason for r in self._refused}
        for r in refused:
            if before.get(r.name) != r.reason:
                log.warning("pipeline %s refused, left unmanaged: %s", r.name, r.reason)
        self._pipelines, self._refused = pipelines, refused
        self._splits = {p: made for p, made in self._splits.items() if p in pipelines}

    def _pipeline_views(self, tasks: list[TaskView], index: SwarmIndex, now: float
                        ) -> tuple[PipelineView, ...]:
        """(Under the lock.) Each pipeline's split, made again from its stages' measurements
        every RESPLIT_S (and held while no share moves by more than split.HYSTERESIS), and
        its view."""
        views = []
        of_stages = {p: [[tasks[i] for i in index.of_service.get(st.service_id, ())]
                         for st in p.stages] for p in self._pipelines}
        smoothed = self._history.smoothed(now, {
            st.service_id: stage_measurements(ts)
            for p, of_stage in of_stages.items()
            for st, ts in zip(p.stages, of_stage, strict=True)})
        for p, of_stage in of_stages.items():
            measures = [smoothed[st.service_id] for st in p.stages]
            replicas = [sum(1 for t in ts if t.state == "running") for ts in of_stage]
            made, held = self._splits.get(p, (-math.inf, None))
            if held is None or now - made >= RESPLIT_S:
                proposed = split(p.target_s * BUDGET, p.paths,
                                 [m.work_s for m in measures], [m.rate_hz for m in measures],
                                 replicas)
                made, before, held = now, held, settle(held, proposed)
                if held is not before:
                    log.info("pipeline %s: stage targets %s%s", p.name, ", ".join(
                        f"{st.name} {stage_label(x)}"
                        for st, x in zip(p.stages, held.stage_s, strict=True)),
                        "" if held.feasible else " (the target is below what its stages "
                        "can do at one CPU a replica)")
            self._splits[p] = made, held
            views.append(PipelineView(
                p.name, p.target_s, p.metric,
                critical_sum(p.paths, [m.measured_s for m in measures]),
                critical_sum(p.paths, [m.mean_s for m in measures]),
                critical_sum(p.paths, [m.p95_s for m in measures]),
                held.feasible, tuple(StageView(
                    st.service_id, st.name, tuple(p.stages[j].name for j in st.next), x, r,
                    tuple(sorted({t.node for t in ts if t.node})), tuple(t.cls for t in ts),
                    m.measured_s, m.work_s, m.rate_hz,
                    self._snapshot.services[st.service_id].replicas
                    if st.service_id in self._snapshot.services else None)
                    for st, x, r, ts, m in zip(p.stages, held.stage_s, replicas, of_stage,
                                               measures, strict=True))))
        views.extend(PipelineView(r.name, None, None, None, None, None, False, (), r.reason)
                     for r in self._refused)
        return tuple(sorted(views, key=lambda v: v.name))

    def _stage_labels(self) -> dict[str, dict[str, str]]:
        """(Under the lock.) Service ID -> the labels its share of its pipeline's target
        makes, for every stage of a pipeline that is managed."""
        return {st.service_id: {TARGET: stage_label(x), METRIC: p.metric}
                for p, (_, held) in self._splits.items()
                for st, x in zip(p.stages, held.stage_s, strict=True)}

    def _reachability(self, node: swarmapi.SwarmNode, reports: NodeReports | None,
                      now: float) -> str | None:
        """None if the node is reachable, else why not."""
        if node.state != "ready":
            return f"Swarm has it {node.state}"
        if reports is None or reports.report is None or reports.received is None:
            return "no report from its agent"
        age = now - reports.received
        if age > self.pace.node_timeout(self.node_timeout):
            return f"no report for {age:.0f}s"
        if not reports.report.engine:
            return "its dockerd does not answer"
        if not reports.report.controller:
            return "its dqoesd does not answer"
        return None



def _task_view(snap: Snapshot, t: SwarmTask, why: str | None,
               accepted: dict[str, ContainerReport] | None) -> TaskView:
    """The task as its node reported it (`why`: its node's reachability)."""
    node = snap.nodes.get(t.node_id)
    c = accepted.get(t.container_id) if accepted is not None and why is None else None
    if c is None and why is None:
        why = "no container yet" if not t.container_id else "not reported by its node"
    return TaskView(
        t.id, t.service_id, snap.services[t.service_id].name, t.slot, t.node_id,
        node.hostname if node else "", t.container_id, t.state,
        c.cls if c else "unknown", c.target_s if c else None, c.metric if c else None,
        c.measured_s if c else None, c.cpu_limit_cores if c else None,
        c.cpu_usage_cores if c else None, c.samples if c else None,
        None if c else why, c.rate_hz if c else None,
        c.window_usage_cores if c else None, c.mean_s if c else None,
        c.p95_s if c else None, c.throttled_window_ratio if c else None)


def _node_view(n: swarmapi.SwarmNode, why: str | None, reports: NodeReports,
               classes: Counter[str], now: float) -> NodeView:
    """The node, its tasks counted by class (`classes`: those of its tasks)."""
    report = reports.report
    budget = report.budget_cpus if report else None
    used = report.used_cpus if report and why is None else None
    counts = {k: classes[k] if why is None else 0 for k in ("G", "S", "B", "idle", "pending")}
    return NodeView(
        n.id, n.hostname, n.role, n.state, n.availability, why is None, why, budget, used,
        None if budget is None or used is None else max(0.0, budget - used), **counts,
        refused=reports.refused,
        report_age_s=None if reports.received is None else now - reports.received,
        paused_by_placement=n.paused_by_us,
        cpu_pressure=report.pressure.get("cpu", {}).get("some_ratio")
        if report and why is None else None)


def _pushes(snapshot: Snapshot, stages: dict[str, dict[str, str]]
            ) -> dict[str, dict[str, dict[str, str]]]:
    """Node ID -> the dqoes. labels of each service of ours with a task meant to run there:
    a pipeline's stage gets its share of the pipeline's target (`stages`, by service ID)."""
    pushes: dict[str, dict[str, dict[str, str]]] = {}
    for t in snapshot.tasks:
        service = snapshot.services.get(t.service_id)
        if t.node_id and t.desired_state == "running" and service and service.concerns_us:
            pushes.setdefault(t.node_id, {})[service.id] = stages.get(service.id,
                                                                      service.labels)
    return pushes


def stage_label(target_s: float) -> str:
    """A stage's share as a dqoes.target value: whole microseconds, rounded down so that the
    shares along a path never add up to more than the pipeline's target."""
    return f"{max(1, math.floor(target_s * 1e6))}us"
