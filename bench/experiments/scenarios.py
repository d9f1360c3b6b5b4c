"""The paper's experiments (section V), at its scale for the simulator and scaled down for
real runs on a 2-CPU kernel.

Targets are given as ratios to the latency a container has at its node's even share (the
default platform's), which carries the paper's numbers over to any machine: its 10
ResNet-50 containers averaged 31.61 s at an even share, so its identical targets 20 s and
40 s are ratios 0.63 and 1.27.

The varied experiment names neither its model nor its even-share latency; it says that 7
of its targets ended in S "instead of 8", the most possible. Its targets 75, 53, ..., 25 s
are therefore taken over the even-share latency at which the oracle (analysis.oracle) also
finds 8: any from 37 to 58 s does (31.61 s would give 6, because three targets would need
less CPU than DQoES's floor); we take 40 s. Random targets are ratios drawn uniformly from
the same span, 5/40 to 95/40.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .sim import DEMAND_CORES, Container, Curve, Drift, Node, Params, Phases, default_latency

PAPER_EVEN_LATENCY_S = 31.61
PAPER_VARIED_S = (75, 53, 61, 44, 31, 95, 82, 5, 13, 25)
VARIED_EVEN_LATENCY_S = 40.0  # see above
PAPER_SIM_DURATION_S = 3000.0
RANDOM_RATIOS = (min(PAPER_VARIED_S) / VARIED_EVEN_LATENCY_S,
                 max(PAPER_VARIED_S) / VARIED_EVEN_LATENCY_S)
MODELS = ("tiny", "mini", "lite")  # the worker types (lab.workload) of the experiments

# The paper's parameters (alpha, beta, IV_initial) with the daemon's default ceiling of the
# listener's interval (the paper gives none): dqoesd's defaults.
PAPER_PARAMS = Params()
# Real runs are short (an emulated CPU, minutes per run): the listener starts at 2 s and
# stops doubling at 8 s, and the step is 0.3 (at 0.1 the varied scenarios do not converge
# within minutes: see the sensitivity sweep); alpha is the paper's.
REAL_PARAMS = Params(alpha=0.10, beta=0.30, iv_initial=2.0, iv_max=8.0, sample_interval=0.5)

# Solo latencies of the worker types on the emulated guest CPU, used when no calibration
# was measured (real.calibrate replaces them).
NOMINAL_CURVES = {"tiny": Curve(0.080), "mini": Curve(0.170), "lite": Curve(0.245)}


@dataclass(frozen=True)
class Plan:
    """A container before its target is known in seconds."""

    model: str
    ratio: float  # target / its latency at the node's even share
    arrival_s: float = 0.0
    departure_s: float = math.inf
    threads: float = DEMAND_CORES
    retargets: tuple[tuple[float, float], ...] = ()  # (time, new ratio)
    load: Phases = ()  # (start, end, work factor)
    load_cpu: float | None = None  # open loop: its arrivals' CPU (rate x solo); None: closed
    rates: Phases = ()  # (start, end, arrival-rate factor)


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    paper: str  # what the paper reports for it
    nodes: tuple[tuple[float, tuple[Plan, ...]], ...]  # (CPUs, containers) per node
    duration_s: float
    default_duration_s: float  # the default platform converges at once: shorter real runs
    slowdowns: tuple[tuple[float, float], ...] = ()  # (time, work factor) of every node

    @property
    def size(self) -> int:
        return sum(len(plans) for _, plans in self.nodes)

    def build(self, curves: dict[str, Curve], measured: np.ndarray | None = None,
              ) -> list[Node]:
        """The nodes with targets in seconds: each container's ratio times its latency at
        the even share (on the default platform, all present, before any phase: a
        service's as an M/D/1 queue, sim.default_latency), from its model's curve, or as
        `measured` (one per container, in node order) on the default platform."""
        nodes = []
        j = 0
        for k, (cpus, plans) in enumerate(self.nodes):
            steady = [Container("", p.model, 1.0, threads=p.threads, rate=None
                                if p.load_cpu is None else p.load_cpu / curves[p.model].solo_s)
                      for p in plans]
            even = default_latency(cpus, steady, curves, 0.0)
            if not np.isfinite(even).all():
                raise ValueError(f"{self.key}: a service cannot keep up at the even share")
            containers = []
            for i, p in enumerate(plans):
                latency = even[i] if measured is None else measured[j]
                j += 1
                containers.append(Container(
                    f"n{k + 1}c{i + 1}" if len(self.nodes) > 1 else f"c{i + 1}", p.model,
                    float(p.ratio * latency), p.arrival_s, p.departure_s, p.threads,
                    tuple((when, float(r * latency)) for when, r in p.retargets), p.load,
                    steady[i].rate, p.rates))
            nodes.append(Node(cpus, tuple(containers), self.slowdowns))
        return nodes


def _random(seed: int, n: int, models: tuple[str, ...], arrivals: tuple[float, float] | None,
            ) -> tuple[Plan, ...]:
    """n containers of random models and target ratios, arriving at random (None: burst)."""
    rng = np.random.default_rng(seed)
    ratios = rng.uniform(*RANDOM_RATIOS, n)
    kinds = rng.choice(models, n)
    times = np.sort(rng.uniform(*arrivals, n)).round() if arrivals else np.zeros(n)
    times -= times.min()  # the first arrives at 0
    return tuple(Plan(str(m), float(r), float(t))
                 for m, r, t in zip(kinds, ratios, times, strict=True))


def _same(n: int, ratio: float, model: str = "tiny") -> tuple[Plan, ...]:
    return tuple(Plan(model, ratio) for _ in range(n))


def _varied(targets_s: tuple[float, ...], every_s: float = 0.0) -> tuple[Plan, ...]:
    return tuple(Plan("tiny", t / VARIED_EVEN_LATENCY_S, i * every_s)
                 for i, t in enumerate(targets_s))


def _reseeded(plans: tuple[Plan, ...], every_s: float) -> tuple[Plan, ...]:
    """The same containers arriving every `every_s` seconds."""
    return tuple(Plan(p.model, p.ratio, i * every_s) for i, p in enumerate(plans))


UNACHIEVABLE, ACHIEVABLE = 20 / PAPER_EVEN_LATENCY_S, 40 / PAPER_EVEN_LATENCY_S
_RANDOM10 = _random(10, 10, ("tiny",), None)


def paper_scenarios(quick: bool = False) -> list[Scenario]:
    """The paper's experiments at its scale (10 containers a node, 4 nodes in the
    cluster), on simulated 2-CPU nodes."""
    # The paper's runs last 350 to 900 s; these run 3000 s, so that slow convergence shows.
    run = PAPER_SIM_DURATION_S * (0.15 if quick else 1.0)
    two = 2.0
    return [
        Scenario("s1-identical-unachievable", "10 identical unachievable targets, burst",
                 "all 10 in B at an even share", ((two, _same(10, UNACHIEVABLE)),),
                 run, run),
        Scenario("s2-identical-achievable", "10 identical achievable targets, burst",
                 "10/10 in S", ((two, _same(10, ACHIEVABLE)),), run, run),
        Scenario("s3-varied-burst", "10 varied targets (the paper's), burst",
                 "7/10 in S (target 5 s unachievable)", ((two, _varied(PAPER_VARIED_S)),),
                 run, run),
        Scenario("s3-varied-fixed", "10 random targets, one arrival every 50 s",
                 "8/10 in S (2 unachievable)", ((two, _reseeded(_RANDOM10, 50.0)),),
                 run, run),
        Scenario("s3-varied-random", "10 random targets, random arrivals in [0, 300 s]",
                 "|S| rises after the last arrival",
                 ((two, _random(11, 10, ("tiny",), (0, 300))),), run, run),
        Scenario("s4-multi-model", "10 containers of 3 model types, random targets and "
                 "arrivals", "most in S after the arrivals end",
                 ((two, _random(12, 10, MODELS, (0, 300))),), run, run),
        Scenario("s5-cluster", "4 workers x 10 containers, random models, targets and "
                 "arrivals", "26/40 in S with DQoES, 3/40 with the default",
                 tuple((two, _random(20 + k, 10, MODELS, (0, 300))) for k in range(4)),
                 run, run),
    ]


def _changed(plans: tuple[Plan, ...], **changes: dict[int, object]) -> tuple[Plan, ...]:
    """The plans with some fields changed: field=value per plan index."""
    out = list(plans)
    for name, per_plan in changes.items():
        for i, value in per_plan.items():
            out[i] = replace(out[i], **{name: value})
    return tuple(out)


def _ours(key: str, title: str, nodes: tuple[tuple[float, tuple[Plan, ...]], ...],
          duration_s: float, slowdowns: tuple[tuple[float, float], ...] = ()) -> Scenario:
    """One of our own scenarios: nothing in the paper to compare with, simulated only (the
    default platform as long as the policies)."""
    return Scenario(key, title, "-", nodes, duration_s, duration_s, slowdowns)


def own_scenarios(quick: bool = False) -> list[Scenario]:
    """Beyond the paper: what a host sees that its experiments do not. Simulated at the
    paper's scale; each change starts a phase that the evaluation judges on its own."""
    k = 0.2 if quick else 1.0
    two, four = 2.0, 4.0
    base = _random(50, 10, ("tiny",), None)
    retargeted = _changed(base, retargets={
        i: ((600 * k, base[i].ratio * f), (1200 * k, base[i].ratio))
        for i, f in ((0, 0.6), (1, 0.6), (2, 0.7), (3, 1.6), (4, 1.8), (5, 1.5))})
    loaded = _random(51, 10, MODELS, None)
    loaded = _changed(loaded, load={1: ((500 * k, 900 * k, 2.0),),
                                    4: ((500 * k, 900 * k, 2.0),)})
    # Two hopeless and two tight targets leave; six tight or easy ones stay and get their CPU.
    leaving = (*(Plan("tiny", r, departure_s=(400 + 100 * i) * k)
                 for i, r in enumerate((0.15, 0.55, 0.15, 0.6))),
               *(Plan("tiny", r) for r in (0.55, 0.55, 0.55, 0.55, 0.9, 1.3)))
    # Nine achievable targets filling most of a node, and one that needs 1.5 CPUs of a
    # single-threaded worker.
    busy = (*(Plan("tiny", r) for r in (0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 0.85)),
            Plan("tiny", 0.2 / 1.5))
    # Four single-threaded and four two-threaded workers on 4 CPUs (0.5 CPU each at an even
    # share): two of each kind need 1.4 CPUs, which only the two-threaded can use.
    threads = tuple(Plan(m, r, threads=t) for t in (1.0, 2.0)
                    for m, r in (("mini", 0.5 / 1.4), ("lite", 0.5 / 1.4), ("tiny", 1.2),
                                 ("mini", 1.5)))
    return [
        _ours("x1-retarget", "10 random targets; at 600 s three tightened and three loosened, "
              "at 1200 s back", ((two, retargeted),), 1800 * k),
        _ours("x2-load-phase", "10 containers of 3 types; two do twice the work per request "
              "from 500 to 900 s", ((two, loaded),), 1400 * k),
        _ours("x3-departures", "10 targets, four of them hopeless or tight; those four leave "
              "at 400, 500, 600 and 700 s", ((two, leaving),), 1200 * k),
        _ours("x4-hopeless", "nine achievable targets filling a busy node and one that needs "
              "1.5 CPUs of one thread", ((two, busy),), 900 * k),
        _ours("x5-dense", "20 containers of 3 types on 4 CPUs, random targets and arrivals in "
              "[0, 300 s]", ((four, _random(53, 20, MODELS, (0, 300))),), 1500 * k),
        _ours("x6-threads", "4 single- and 4 two-threaded workers on 4 CPUs; two of each need "
              "1.4 CPUs", ((four, threads),), 900 * k),
    ]


def real_scenarios(quick: bool = False) -> list[Scenario]:
    """The same experiments scaled to a 2-CPU kernel: 4 to 6 containers, minutes; and two
    of our own with open-loop services."""
    span = 0.4 if quick else 1.0
    varied = _varied((61, 44, 31, 5, 25))
    return [
        Scenario("r1-identical-unachievable", "4 identical unachievable targets, burst",
                 "all in B at an even share", ((2.0, _same(4, UNACHIEVABLE)),),
                 90 * span, 40 * span),
        Scenario("r2-identical-achievable", "4 identical achievable targets, burst",
                 "all in S", ((2.0, _same(4, ACHIEVABLE)),), 150 * span, 40 * span),
        Scenario("r3-varied-burst", "5 varied targets (61, 44, 31, 5, 25 s of the paper's),"
                 " burst", "all but the unachievable one in S", ((2.0, varied),),
                 150 * span, 40 * span),
        Scenario("r3-varied-fixed", "the same 5 targets, one arrival every 15 s",
                 "all but the unachievable one in S",
                 ((2.0, _reseeded(varied, 15.0)),), 200 * span, 100 * span),
        Scenario("r4-multi-model", "5 containers of 3 model types, random targets and "
                 "arrivals in [0, 45 s]", "most in S after the arrivals end",
                 ((2.0, _random(30, 5, MODELS, (0, 45))),), 200 * span, 90 * span),
        Scenario("r5-cluster", "2 workers of 1 CPU x 3 containers, random models and "
                 "targets, burst", "several times the default's |S|",
                 tuple((1.0, _random(40 + k, 3, MODELS, None)) for k in range(2)),
                 150 * span, 40 * span),
        # Open-loop services (Poisson arrivals, each request queueing; latency from its
        # arrival to its answer) among back-to-back workers, as issue 30 first tried them.
        Scenario("r6-open-services", "3 services (0.12-0.25 CPU of arrivals) and a worker, "
                 "random models and targets, burst", "-", ((2.0, _changed(
                     _random(70, 4, MODELS, None), load_cpu={0: 0.12, 1: 0.2, 2: 0.25})),),
                 200 * span, 60 * span),
        Scenario("r7-open-mix", "2 services (0.1, 0.2 CPU of arrivals) and 3 workers, random "
                 "models, targets and arrivals in [0, 45 s]", "-", ((2.0, _changed(
                     _random(71, 5, MODELS, (0, 45)), load_cpu={1: 0.1, 3: 0.2})),),
                 200 * span, 90 * span),
    ]


# A real host's speed drifts for every container of a node at once (issue 30: the real
# runs' emulated CPUs, by about 9% with a correlation time of some five decision windows):
# 50 s at the paper's scale (a window of 10 to 20 s), 25 s at the real runs' (2 to 8 s).
PAPER_DRIFT = Drift(0.09, 50.0)
REAL_DRIFT = Drift(0.09, 25.0)
SLOWDOWN = 1.25  # a node 20% slower: every request takes 1/0.8 the time
BURST_S = 30.0  # a burst of arrivals lasts this long, at three times the rate


def open_scenarios(quick: bool = False) -> list[Scenario]:
    """Open-loop services (Poisson arrivals at their own pace, each request queueing) among
    back-to-back workers, at the paper's scale: a node of 2 CPUs and 10 containers, or 4
    CPUs and 20, arriving in [0, 300 s]. A service's arrivals need 0.05 to 0.2 CPU (0.2 to
    0.45 while its rate is doubled, its cost doubled or in a burst), so that it keeps up at
    the even share, which its target is a ratio to (its M/D/1 mean latency there). Each
    change starts a phase."""
    k = 0.2 if quick else 1.0
    two, four = 2.0, 4.0

    def mixed(seed: int, loads: dict[int, float], n: int = 10) -> tuple[Plan, ...]:
        """n containers of random models, targets and arrivals; those of `loads` are
        services whose arrivals need that much CPU."""
        return _changed(_random(seed, n, MODELS, (0, 300 * k)), load_cpu=loads)

    services = {1: 0.05, 3: 0.1, 6: 0.15, 8: 0.2}
    stepped = _changed(mixed(61, services), rates={6: ((600 * k, 1200 * k, 2.0),)})
    burst = _changed(mixed(62, services), rates={3: ((600 * k, 600 * k + BURST_S, 3.0),),
                                                 6: ((1000 * k, 1000 * k + BURST_S, 3.0),)})
    costly = _changed(mixed(63, services), load={3: ((600 * k, 1200 * k, 2.0),),
                                                 8: ((600 * k, 1200 * k, 2.0),)})
    leaving = _changed(mixed(65, services), departure_s={0: 500 * k, 3: 600 * k, 7: 700 * k})
    dense = mixed(66, {i: float(x) for i, x in zip(range(0, 20, 2), np.linspace(0.05, 0.2, 10),
                                                    strict=True)}, 20)
    return [
        _ours("o1-open-mix", "4 services (0.05-0.2 CPU of arrivals) and 6 workers, random "
              "targets and arrivals", ((two, mixed(60, services)),), 1500 * k),
        _ours("o2-rate-step", "o1's kind; a service's arrival rate doubles (0.15 -> 0.3 CPU) "
              "from 600 to 1200 s", ((two, stepped),), 1800 * k),
        _ours("o3-burst", "o1's kind; two services get three times their arrivals for 30 s, "
              "at 600 and 1000 s", ((two, burst),), 1400 * k),
        _ours("o4-cost", "o1's kind; two services' requests cost twice as much from 600 to "
              "1200 s", ((two, costly),), 1800 * k),
        _ours("o5-slowdown", "o1's kind; the node slows down by 20% at 600 s",
              ((two, mixed(64, services)),), 1200 * k, slowdowns=((600 * k, SLOWDOWN),)),
        _ours("o6-departures", "o1's kind; a worker, a service and a worker leave at 500, 600 "
              "and 700 s", ((two, leaving),), 1000 * k),
        _ours("o7-dense", "10 services (0.05-0.2 CPU of arrivals) and 10 workers on 4 CPUs, "
              "random targets and arrivals", ((four, dense),), 1500 * k),
    ]
