"""Model-based horizontal scaling of a pipeline's stages: how many replicas each stage needs
to hold its share of the pipeline's target, and when to scale it out, in, or move one of its
replicas (pure; scaling.py runs it in the manager).

The model is split.py's. A replica of a stage whose requests cost s CPU-seconds each,
arriving at λ/r a second (λ the stage's rate over its r replicas: Swarm's load balancing
shares them out evenly), served at c CPUs, answers in about s / (c - λs/r) (M/M/1-like).
It holds the stage's share L of the end-to-end target when

    s / (c - λs/r) <= L   ⇔   r >= need = λs / (c - s/L)     (for c > s/L)

so the stage needs max(1, ⌈need⌉) replicas. c is the CPU its slowest replica can have on
its node (what the node's dqoesd budget leaves after the node's other containers, shared by
the stage's replicas there, at most MAX_REPLICA_CPUS: the split's floor counts one CPU a
replica), since every replica gets the same λ/r; or, where the stage misses its share, the
CPU its replicas had by the same model at the latency measured, s/p + λs/r, if less: what
a node's budget does not show (work beside the containers dqoesd holds, an injector's hog,
the node slowing down) shows there. When c <= s/L no count helps: that
replica's node is taken, and the replica moves to a node with room for it (a start-first
rolling update: its replacement runs before it stops), unless it is the stage's only one.

Rule, per stage, every `interval_s`:
- out, at once, to ⌈need⌉ (at most `max_replicas`) when that is more than it asks for; new
  replicas are steered to the nodes with room for one (a replica there could hold the share
  at the new count), Swarm spreading them over those; when no node has room, Swarm spreads
  them over all;
- in, by one, when even r - 1 replicas would hold the share with `scale_in_margin` to spare
  (need <= (1 - margin)(r - 1)) at `scale_in_evaluations` evaluations in a row; never below
  one replica;
- a move instead when the slowest replica's CPU is little more than s/L (need grows as
  1 / (c - s/L): the stage would be scaled far out, and kept there, for one replica's node)
  and the rest of the stage with a node with room would head for fewer replicas;
- a lone replica is never moved: its move is the whole stage starting again elsewhere (a
  container and its model: tens of seconds of an emulated CPU at what a loaded node leaves,
  its queue filling meanwhile; the testbed's fifth run moved lone replicas 16 times in ten
  minutes, chasing hogs that changed every 90 s on average, and its stages took 4 to 17 s).
  Where a move would help it (no count helps on its node, or the roomiest node would need
  fewer), it gets a second replica on a node with room; once two serve, the slower may move;
- out or a move only while the stage misses its share (its latency, as its nodes measured it
  in their last windows, over L) or that latency is unknown: the model's CPU per replica is
  the node's budget less its other containers' use, and a request shorter than its cap's
  quota in a period runs at a whole CPU, so a stage the model finds short of CPU may well
  hold its share, and on the testbed such moves chased each other from node to node;
- nothing while its measurements are missing or not finite, its rate is zero, Swarm is
  updating the service or its running tasks are not the count it asks for (a scale or a move
  in flight), or within `hold_s` of its last action (the nodes' windows must see the new
  count);
- at most `max_actions_per_minute` actions per pipeline, the latest stages first (the
  model's latency of the slowest replica over its share; scale-ins last).

When the stages' floors fill the target (the split is not feasible, split.py), every share
is squeezed below what one replica does at one CPU, and every stage would seem to need one
more: then only the stages busier than split.RHO_MAX a replica (the ones that fill it)
scale out, or the busiest one when none is, and nothing else while one of them is busy; the
others' shares come back once those have.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .split import RHO_MAX

MAX_REPLICA_CPUS = 1.0  # a replica serves its requests one at a time (split.py's floor)
UNIT_S = 60.0  # the actions cap's window


@dataclass(frozen=True)
class ScalerParams:
    interval_s: float = 5.0  # a pipeline is evaluated at most this often (split.RESPLIT_S)
    scale_in_margin: float = 0.2  # r - 1 replicas must hold the share with this to spare
    scale_in_evaluations: int = 3  # ... at this many evaluations in a row
    max_actions_per_minute: int = 2  # per pipeline
    hold_s: float = 30.0  # a stage acted on is left alone this long
    max_replicas: int = 32  # a stage's most

    def __post_init__(self) -> None:
        if not (0.0 <= self.scale_in_margin < 1.0 and self.scale_in_evaluations >= 1
                and self.max_actions_per_minute >= 0 and self.interval_s >= 0
                and self.hold_s >= 0 and self.max_replicas >= 1):
            raise ValueError("need 0 <= scale_in_margin < 1, scale_in_evaluations >= 1, "
                             "max_replicas >= 1 and the rest >= 0")


@dataclass(frozen=True)
class StageLoad:
    """One stage as the scaler sees it (None: not measured, or unknown)."""

    service_id: str
    name: str
    asked: int | None  # the replicas its service asks Swarm for (None: a global service)
    work_s: float | None  # CPU-seconds per request
    rate_hz: float | None  # requests a second, over its replicas
    target_s: float | None  # its share of the pipeline's target
    replica_cpus: Mapping[str, float]  # node ID: the CPU one of its replicas there can have
    room_cpus: Mapping[str, float]  # node ID: what a new replica could have there (the
    #                                 ready, active nodes it does not run on)
    busy: str | None = None  # why it must not be scaled now (Swarm updating it, ...)
    latency_s: float | None = None  # as measured, in its target's metric (None: unknown)


@dataclass(frozen=True)
class PipelineLoad:
    name: str
    stages: tuple[StageLoad, ...]
    feasible: bool = True  # its split's: the stages' floors fit in its target


@dataclass(frozen=True)
class Decision:
    """A stage to scale (`replicas` differs from what it asks) or one replica to move
    (`move_from`: the node it leaves), new tasks steered to `prefer` (empty: anywhere)."""

    pipeline: str
    service_id: str
    stage: str
    replicas: int
    prefer: tuple[str, ...]
    move_from: str | None
    why: str  # one line, with the figures


@dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]
    settled: tuple[str, ...]  # stages the scaler steered whose tasks are placed: release


def need(work_s: float | None, rate_hz: float | None, target_s: float | None,
         cpus: float | None) -> float | None:
    """λs / (c - s/L): the replicas (fractional) at which a replica of c CPUs answers
    within L; math.inf when none does (c <= s/L); None unless every input is a finite
    positive number."""
    values = (work_s, rate_hz, target_s, cpus)
    if any(v is None or not math.isfinite(v) or v <= 0.0 for v in values):
        return None
    s, lam, share, c = values  # type: ignore[misc]
    spare = c - s / share
    return math.inf if spare <= 0.0 else lam * s / spare


def replicas_for(fractional: float) -> int:
    """The least whole count at least `fractional` (and one)."""
    return max(1, math.ceil(fractional - 1e-9))  # 3.0000000001 from rounding is 3


@dataclass
class Scaler:
    """The rule of the module's doc, with its memory from one evaluation to the next."""

    params: ScalerParams = field(default_factory=ScalerParams)
    evaluated: dict[str, float] = field(default_factory=dict)  # pipeline: when
    below: dict[str, int] = field(default_factory=dict)  # stage: evaluations in a row
    acted: dict[str, float] = field(default_factory=dict)  # stage: its last action, when
    actions: dict[str, list[float]] = field(default_factory=dict)  # pipeline: the last
    #                                                                minute's, when
    steered: set[str] = field(default_factory=set)  # stages whose new tasks it steered

    def plan(self, now: float, pipelines: Sequence[PipelineLoad]) -> Plan:
        decisions: list[Decision] = []
        settled: list[str] = []
        names = {p.name for p in pipelines}
        self.evaluated = {k: v for k, v in self.evaluated.items() if k in names}
        self.actions = {k: v for k, v in self.actions.items() if k in names}
        for p in pipelines:
            if now - self.evaluated.get(p.name, -math.inf) < self.params.interval_s:
                continue
            self.evaluated[p.name] = now
            recent = [t for t in self.actions.get(p.name, []) if now - t < UNIT_S]
            self.actions[p.name] = recent
            overloaded = set() if p.feasible else _filling(p.stages)
            wanted: list[tuple[StageLoad, Decision]] = []
            for stage in p.stages:
                quiet = stage.busy is None and \
                    now - self.acted.get(stage.service_id, -math.inf) >= self.params.hold_s
                if stage.service_id in self.steered and quiet:
                    self.steered.discard(stage.service_id)
                    settled.append(stage.service_id)
                decision = self._decide(p.name, stage) if quiet else None
                if decision is not None and (not overloaded or stage.service_id in overloaded):
                    wanted.append((stage, decision))
            # under the cap the latest stage first (a scale in is never urgent): taken in the
            # stages' order, the first ones' moves could starve a later overloaded stage
            room = max(self.params.max_actions_per_minute - len(recent), 0)
            order = sorted(range(len(wanted)), key=lambda i: (
                wanted[i][1].replicas < (wanted[i][0].asked or 0), -_lateness(wanted[i][0])))
            for stage, decision in (wanted[i] for i in sorted(order[:room])):
                recent.append(now)
                self.acted[stage.service_id] = now
                self.below.pop(stage.service_id, None)
                if decision.prefer:
                    self.steered.add(stage.service_id)
                decisions.append(decision)
        return Plan(tuple(decisions), tuple(settled))

    def _decide(self, pipeline: str, stage: StageLoad) -> Decision | None:
        """What the stage needs now, if anything (the scale-in count kept up to date)."""
        asked = stage.asked
        if asked is None or asked < 1 or not stage.replica_cpus:
            self.below.pop(stage.service_id, None)
            return None
        slowest = min(stage.replica_cpus, key=lambda n: stage.replica_cpus[n])
        cpus = min(stage.replica_cpus[slowest], MAX_REPLICA_CPUS, _had(stage))
        needed = need(stage.work_s, stage.rate_hz, stage.target_s, cpus)
        if needed is None:
            self.below.pop(stage.service_id, None)
            return None
        s, lam, share = stage.work_s, stage.rate_hz, stage.target_s
        assert s is not None and lam is not None and share is not None  # need() checked
        figures = (f"rate {lam:.2f}/s, work {s * 1e3:.1f} ms, share {share * 1e3:.0f} ms, "
                   f"{cpus:.2f} CPU a replica")
        if stage.latency_s is not None and stage.latency_s <= share:  # it holds: in at most
            return self._scale_in(pipeline, stage, min(needed, asked), figures)
        if math.isinf(needed):
            self.below.pop(stage.service_id, None)
            # where a replica at the present count (two, for a lone one) could hold the share
            room = self._room(stage, s / share + lam * s / max(asked, 2))
            if not room:
                return None
            if asked == 1:
                return self._second(pipeline, stage, room, f"{cpus:.2f} CPU on its node "
                                    f"cannot answer within its share at any count", figures)
            return Decision(pipeline, stage.service_id, stage.name, asked, room, slowest,
                            f"moving a replica off its node: {cpus:.2f} CPU there cannot "
                            f"answer within its share at any count ({figures})")
        wanted = min(replicas_for(needed), self.params.max_replicas)
        # a node that leaves its replica little more than s/L would have the whole stage
        # scaled far out (need grows as 1 / (c - s/L)) and kept there: moving that replica
        # does with fewer when the rest of the stage (or, for a lone replica, the roomiest
        # node) needs fewer
        rest = [min(c, MAX_REPLICA_CPUS) for n, c in stage.replica_cpus.items() if n != slowest]
        roomiest = max((c for c in stage.room_cpus.values() if math.isfinite(c)), default=0.0)
        after = need(s, lam, share, min(rest) if rest else min(roomiest, MAX_REPLICA_CPUS))
        if after is not None and math.isfinite(after) \
                and self._count(after, asked) < self._count(needed, asked):
            room = self._room(stage, s / share + lam * s / max(replicas_for(after), asked, 2))
            if room:
                self.below.pop(stage.service_id, None)
                if not rest:
                    return self._second(pipeline, stage, room, f"at {cpus:.2f} CPU on its "
                                        f"node the stage needs {needed:.2f} replicas, "
                                        f"{after:.2f} on the roomiest node", figures)
                return Decision(pipeline, stage.service_id, stage.name, asked, room, slowest,
                                f"moving a replica off its node: at {cpus:.2f} CPU there the "
                                f"stage needs {needed:.2f} replicas, {after:.2f} without it "
                                f"({figures})")
        if wanted > asked:
            self.below.pop(stage.service_id, None)
            return Decision(pipeline, stage.service_id, stage.name, wanted,
                            self._room(stage, s / share + lam * s / wanted), None,
                            f"scaling out {asked} -> {wanted}: needs {needed:.2f} replicas "
                            f"({figures})")
        return self._scale_in(pipeline, stage, needed, figures)

    @staticmethod
    def _second(pipeline: str, stage: StageLoad, room: tuple[str, ...], why: str,
                figures: str) -> Decision:
        """A second replica, on a node with room, for a lone one that a move would help."""
        return Decision(pipeline, stage.service_id, stage.name, 2, room, None,
                        f"scaling out 1 -> 2 rather than moving its lone replica: {why} "
                        f"({figures})")

    def _scale_in(self, pipeline: str, stage: StageLoad, needed: float, figures: str
                  ) -> Decision | None:
        """In by one once `needed` left r - 1 replicas the margin scale_in_evaluations
        times in a row (the count kept up to date)."""
        asked = stage.asked or 1
        if asked > 1 and needed <= (1.0 - self.params.scale_in_margin) * (asked - 1):
            count = self.below[stage.service_id] = self.below.get(stage.service_id, 0) + 1
            if count >= self.params.scale_in_evaluations:
                return Decision(pipeline, stage.service_id, stage.name, asked - 1, (), None,
                                f"scaling in {asked} -> {asked - 1}: needs {needed:.2f} "
                                f"replicas ({figures})")
            return None
        self.below.pop(stage.service_id, None)
        return None

    def _count(self, needed: float, asked: int) -> int:
        """The replicas the rule heads for at a need of `needed` (a finite one)."""
        if needed > asked:
            return min(replicas_for(needed), self.params.max_replicas)
        return asked - 1 if asked > 1 and \
            needed <= (1.0 - self.params.scale_in_margin) * (asked - 1) else asked

    @staticmethod
    def _room(stage: StageLoad, cpus: float) -> tuple[str, ...]:
        """The nodes where a new replica could have `cpus` (within MAX_REPLICA_CPUS)."""
        if cpus > MAX_REPLICA_CPUS:
            return ()
        return tuple(sorted(n for n, c in stage.room_cpus.items()
                            if math.isfinite(c) and min(c, MAX_REPLICA_CPUS) >= cpus))


def _had(stage: StageLoad) -> float:
    """The CPU a replica of a stage that misses its share had, by the model, at the latency
    measured: s/p + λs/r (math.inf: it holds its share, or that is unknown)."""
    known = (stage.work_s, stage.rate_hz, stage.asked, stage.target_s, stage.latency_s)
    if any(v is None or not math.isfinite(v) or v <= 0 for v in known):
        return math.inf
    s, lam, r, share, p = known
    return s / p + lam * s / r if p > share else math.inf  # type: ignore[operator]


def _filling(stages: Sequence[StageLoad]) -> set[str]:
    """The stages that fill an infeasible split's target: those busier than RHO_MAX a
    replica or being scaled (one may be one of them), else the busiest: its floor falls most
    with one more replica, while a little-used stage scaled to its squeezed share would take
    many replicas for nothing (the split gives the shares back once the floors fit)."""
    over = {st.service_id for st in stages if st.busy is not None or _utilisation(st) > RHO_MAX}
    top = max((_utilisation(st) for st in stages), default=0.0)
    return over or {st.service_id for st in stages if top > 0.0 and _utilisation(st) >= top}


def _lateness(stage: StageLoad) -> float:
    """The model's latency of its slowest replica over its share, s / (c - λs/r) / L
    (math.inf: overloaded; 0 when unknown)."""
    cpus = min(stage.replica_cpus.values(), default=0.0)
    known = (stage.work_s, stage.rate_hz, stage.asked, stage.target_s, cpus)
    if any(v is None or not math.isfinite(v) or v <= 0 for v in known):
        return 0.0
    s, lam, r, share, c = known
    spare = min(c, MAX_REPLICA_CPUS) - lam * s / r  # type: ignore[operator]
    return math.inf if spare <= 0.0 else s / spare / share  # type: ignore[operator]


def _utilisation(stage: StageLoad) -> float:
    """λs / (r c) of its replicas at the CPU they can have (0 when unknown)."""
    cpus = min(stage.replica_cpus.values(), default=0.0)
    known = (stage.work_s, stage.rate_hz, stage.asked, min(cpus, MAX_REPLICA_CPUS))
    if any(v is None or not math.isfinite(v) or v <= 0 for v in known):
        return 0.0
    s, lam, r, c = known
    return s * lam / (r * c)  # type: ignore[operator]
