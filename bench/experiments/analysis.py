"""What a run achieved, what any run could achieve (the oracle), and how closely the
simulator follows the real kernel."""

from __future__ import annotations

import bisect
import itertools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dqoes_cg.policy import RHO_MAX, Cls, classify
from dqoes_cg.policy.admit import RHO_FLOOR

from .sim import Curve, Node, default_latency, md1_latency, packing_loss
from .trace import Run

TAIL = 0.15  # the last 15% of a run (or of a phase) is its converged state
MIN_WINDOWS = 6  # ... and at least this many windows of a short phase
_GRID = np.geomspace(1e-4, 1.0, 40001)  # fractions of its most at which the oracle looks
_BOUND_STRIDE = 10  # noisy_bound looks at every 10th of them (0.23% apart)
_LAMBDAS = np.concatenate(([0.0], np.geomspace(1e-3, 1e3, 601)))  # noisy_bound's prices
_SEEN_WINDOWS, _SEEN_WARMUP, _SEEN_POINTS, _SEEN_SEED = 400, 10, 24, 30  # windows_seen
SPEED_STEP = 0.04  # real_caps recomputes its allocation when the log speed moves this much


def settled_time(node: Node) -> float:
    """A time after every arrival and every event of the node: its final state."""
    return max([c.arrival_s for c in node.containers] + node_events(node), default=0.0) + 1.0


def node_events(node: Node) -> list[float]:
    """When anything changes on the node after the arrivals: its containers' events and its
    slowdowns."""
    return sorted({*(e for c in node.containers for e in c.events()),
                   *(when for when, _ in node.slowdowns)})


@dataclass(frozen=True)
class NodeState:
    """The containers present on a node at one time, each on a grid of the shares it can
    have (up to what it can use: its threads), with its mean latency there (a service's as
    an M/D/1 queue at its arrival rate then), its busy fraction there (a service's
    utilisation of its share; NaN for a closed-loop worker) and its target."""

    floor: float  # 1/(2n) of the node's CPUs, n counting the containers present
    cores: list[np.ndarray]
    latency: list[np.ndarray]
    busy: list[np.ndarray]
    target: list[float]


def state_at(node: Node, curves: dict[str, Curve], at: float | None = None,
             speed: float = 1.0) -> NodeState:
    """The node's state at time `at` (default: once every event has passed), every request
    costing `speed` times its nominal work besides (a drifting node's work factor)."""
    t = settled_time(node) if at is None else at
    present = [c for c in node.containers if c.present(t)]
    cores = [_GRID * min(c.threads, node.cpus) for c in present]
    service = [curves[c.model].latency(x) * c.load_at(t) * node.slowdown_at(t) * speed
               for c, x in zip(present, cores, strict=True)]
    return NodeState(node.cpus / (2 * max(len(present), 1)), cores,
                     [md1_latency(x, c.rate_at(t)) for c, x in zip(present, service,
                                                                   strict=True)],
                     [c.rate_at(t) * x if c.open_loop else np.full(len(x), np.nan)
                      for c, x in zip(present, service, strict=True)],
                     [float(c.target_at(np.array([t]))[0]) for c in present])


def counted(latency: np.ndarray, busy: np.ndarray, target: float, alpha: float,
            ) -> np.ndarray:
    """At which shares the oracle counts a container in S: a closed-loop worker (busy NaN)
    where its latency is within alpha of its target; a service where its latency is at
    most (1 + alpha) its target and it is busy at most RHO_MAX of the time (below the band
    too: held there, it has no CPU it could safely give back)."""
    in_band = np.abs(target - latency) <= alpha * target
    held = (latency <= (1 + alpha) * target) & (busy <= RHO_MAX)
    return np.where(np.isnan(busy), in_band, held)


def oracle(node: Node, curves: dict[str, Curve], alpha: float = 0.10,
           at: float | None = None) -> int:
    """The most containers of `node` that can be in S at once, at time `at` (default: once
    every event has passed), whatever the algorithm: each one in S needs a share whose
    latency (its model's, times its load factor and the node's slowdown then) is within
    alpha of its target then (a service: see `counted`), at most what it can use (its
    threads), and is held at the least such share lo_i, under
    the floor if its band is (as admit holds its admitted containers at their need); every
    other one keeps at least the floor 1/(2n) of the budget (as the policies' limits do), n
    counting the containers present; and all of it fits in the node's CPUs. Cheapest extra
    share over the floor first, lo_i - floor, negative for a need under the floor (optimal:
    each container counts one)."""
    return oracle_allocation(node, curves, alpha, at)[0]


def oracle_allocation(node: Node, curves: dict[str, Curve], alpha: float = 0.10,
                      at: float | None = None, speed: float = 1.0, packing: bool = False,
                      arrivals: bool = False) -> tuple[int, np.ndarray]:
    """The oracle's count (see `oracle`) and the shares it holds the node's containers at
    (CPUs, in node order): the least share in S of each one it counts, the floor for the
    others, NaN for one absent at that time. With `speed`, every request costs that much
    more (a drifting node's work factor); with `packing`, the caps that deliver those
    shares (packed_caps) must fit in the CPUs, not the shares themselves; with `arrivals`,
    no open-loop service is held below its arrivals' need (see _cheapest_first)."""
    t = settled_time(node) if at is None else at
    count, shares, _ = _cheapest_first(node, state_at(node, curves, t, speed), t, alpha,
                                       packing, arrivals=arrivals)
    return count, _in_node_order(node, t, shares)


def _in_node_order(node: Node, t: float, values: np.ndarray) -> np.ndarray:
    out = np.full(len(node.containers), np.nan)
    out[[bool(c.present(t)) for c in node.containers]] = values
    return out


def _cheapest_first(node: Node, state: NodeState, t: float, alpha: float, packing: bool,
                    most: int | None = None, arrivals: bool = False,
                    ) -> tuple[int, np.ndarray, np.ndarray]:
    """The oracle's choice in `state` (at most `most` counted): its count, the shares of the
    containers present (the least in S of those counted, the base of the others) and which
    it counts. The base is the floor, and with `arrivals` an open-loop service's is at
    least the share its arrivals keep busy RHO_FLOOR of the time (no service is capped
    below what its arrivals need; README, "What satisfied means"), each of those asking
    beyond the floor cut by the same fraction if they do not all fit (as admit's are)."""
    single = np.array([c.threads <= 1.0 for c in node.containers if c.present(t)], bool)
    base = np.full(len(state.target), state.floor)
    if arrivals:
        for k, (cores, busy) in enumerate(zip(state.cores, state.busy, strict=True)):
            if not np.isnan(busy).all():
                keeps = busy <= RHO_FLOOR
                base[k] = max(state.floor, float(cores[keeps].min()) if keeps.any()
                              else float(cores[-1]))
        beyond = float((base - state.floor).sum())
        spare = node.cpus - state.floor * len(base)
        if beyond > spare > 0.0:
            base = state.floor + (base - state.floor) * spare / beyond
    extras = []
    for k, (cores, latency, busy, target) in enumerate(zip(
            state.cores, state.latency, state.busy, state.target, strict=True)):
        ok = counted(latency, busy, target, alpha)
        if ok.any():
            extras.append((float(cores[ok].min()) - base[k], k))
    shares = base.copy()
    chosen = np.zeros(len(state.target), bool)
    for extra, k in sorted(extras)[:most]:
        shares[k] += extra
        caps = packed_caps(shares, single, node.cpus) if packing else shares
        if caps.sum() > node.cpus + 1e-9:
            shares[k] -= extra
            break
        chosen[k] = True
    return int(chosen.sum()), shares, chosen


def packed_caps(shares: np.ndarray, single: np.ndarray, cpus: float) -> np.ndarray:
    """The caps under which containers get `shares` (CPUs) despite the packing shortfall of
    the single-threaded ones (`single`; sim.packing_loss): the fixed point of cap = share /
    (1 - loss(caps)), the loss growing with the caps. Infinite where it has none (the caps
    would have to exceed the CPUs)."""
    caps = shares.astype(float)
    for _ in range(30):
        loss = packing_loss(caps[single], cpus)
        if (loss >= 1.0).any():
            return np.full(len(shares), np.inf)
        packed = shares.astype(float)
        packed[single] = shares[single] / (1.0 - loss)
        if np.allclose(packed, caps, rtol=1e-6, atol=1e-9):
            return packed
        caps = packed
        if caps.sum() > 2.0 * cpus:
            return np.full(len(shares), np.inf)
    return caps


def oracle_caps(node: Node, curves: dict[str, Curve], alpha: float = 0.10,
                ) -> Callable[[float, float], np.ndarray]:
    """The oracle's allocation as caps at any time (computed once for each stretch between
    two changes: an arrival, a departure, an event), whatever the node's speed then."""
    changes = _changes(node)
    cache: dict[int, np.ndarray] = {}

    def caps(t: float, speed: float = 1.0) -> np.ndarray:
        stretch = bisect.bisect_right(changes, t + 1e-9)
        if stretch not in cache:
            cache[stretch] = oracle_allocation(node, curves, alpha, t)[1]
        return cache[stretch]

    return caps


def _changes(node: Node) -> list[float]:
    return sorted({*(c.arrival_s for c in node.containers), *node_events(node)})


def real_oracle(node: Node, curves: dict[str, Curve], scatter: float, alpha: float = 0.10,
                at: float | None = None, speed: float = 1.0, packing: bool = False,
                window: float = 0.0) -> int:
    """The most containers of `node` that a controller can hold in S at once under real
    conditions, in the median window: the oracle's count at the node's work factor `speed`
    with the caps packed (`packing`), and at most the next whole number above noisy_bound
    at that speed with a log-latency scatter `scatter` (what the controller cannot know
    when it sets its caps: the measurement noise, and the node's drift since its last
    window), no open-loop service held below its arrivals' need, and (`window`: the
    observer's) a service seen only in a window in which a request of it completed. Both
    are upper bounds: the
    noise-free count, and (the median of a sum of
    independent Bernoulli trials being at most the next integer above its mean) the median
    window's count."""
    count = oracle_allocation(node, curves, alpha, at, speed, packing, arrivals=True)[0]
    if scatter <= 0.0:
        return count
    return min(count, math.ceil(noisy_bound(node, curves, scatter, alpha, at, speed, window)
                                - 1e-6))


def real_caps(node: Node, curves: dict[str, Curve], scatter: float, packing: bool,
              alpha: float = 0.10, window: float = 0.0) -> Callable[[float, float], np.ndarray]:
    """The real oracle's own allocation as caps (CPUs, node order) at time t when the
    node's work factor is known to be `speed` (as of a decision window ago): the
    real_oracle's count of containers chosen cheapest first, moved from their least share
    in S towards where a scatter `scatter` leaves them in S most often (a worker's middle of
    the band, a service's latency two scatters under its slow edge) as far as the CPUs allow
    once packed (packed_caps); the others at the floor. Cached per stretch and per SPEED_STEP of
    speed."""
    changes = _changes(node)
    cache: dict[tuple[int, int], np.ndarray] = {}

    def caps(t: float, speed: float = 1.0) -> np.ndarray:
        key = (bisect.bisect_right(changes, t + 1e-9), round(math.log(speed) / SPEED_STEP))
        if key not in cache:
            known = math.exp(key[1] * SPEED_STEP)
            count = real_oracle(node, curves, scatter, alpha, t, known, packing, window)
            state = state_at(node, curves, t, known)
            _, least, chosen = _cheapest_first(node, state, t, alpha, packing, count,
                                               arrivals=True)
            aimed = least.copy()
            for k in np.flatnonzero(chosen):
                latency, busy, target = state.latency[k], state.busy[k], state.target[k]
                aim = target * (math.sqrt(1 - alpha**2) if np.isnan(busy).all()
                                else (1 + alpha) * math.exp(-2 * scatter))
                ok = counted(latency, busy, target, alpha) & (latency <= aim)
                if ok.any():
                    aimed[k] = max(least[k], float(state.cores[k][ok].min()))
            single = np.array([c.threads <= 1.0 for c in node.containers if c.present(t)],
                              bool)

            def fits(theta: float) -> bool:
                shares = least + theta * (aimed - least)
                caps = packed_caps(shares, single, node.cpus) if packing else shares
                return bool(caps.sum() <= node.cpus + 1e-9)

            low, high = (1.0, 1.0) if fits(1.0) else (0.0, 1.0)
            for _ in range(20 if low < high else 0):  # the furthest move that still fits
                middle = (low + high) / 2
                low, high = (middle, high) if fits(middle) else (low, middle)
            shares = least + low * (aimed - least)
            cache[key] = _in_node_order(node, t, packed_caps(shares, single, node.cpus)
                                        if packing else shares)
        return cache[key]

    return caps


def noisy_bound(node: Node, curves: dict[str, Curve], scatter: float, alpha: float = 0.10,
                at: float | None = None, speed: float = 1.0, window: float = 0.0) -> float:
    """The most containers of `node` that any controller can expect in S in one window when
    each window's latency is seen through log-normal noise of standard deviation `scatter`
    (the noise sweep's): an upper bound, under the oracle's rules.

    A container held at share c, whose latency there is L(c), is seen in S with probability
    P(c) = Phi(ln((1 + alpha) o / L(c)) / scatter) - Phi(ln((1 - alpha) o / L(c)) / scatter).
    Its share is at most what it can use and at least the floor, or its least share in the
    band if that is lower (the oracle's rules). The most expected |S|, max Σ P_i(c_i) with
    Σ c_i <= CPUs, is at most the Lagrangian dual D(lam) = lam CPUs + Σ_i max_c (P_i(c) -
    lam c) for every lam >= 0: the least D over a grid of lam is returned. Without noise it
    is the oracle's count, or above it by less than one (the bound relaxes counting whole
    containers). The noise comes after the controller's choice, so it bounds the mean |S|
    over any stretch of windows, whatever the controller does. An open-loop service counts
    in S at any latency up to (1 + alpha) its target (as Run.classes counts it), so its P(c)
    is only the upper Phi. `speed`: every request costs that much more (see state_at).

    With a `window` (the observer's, s), a service's P(c) is what its windows show
    (windows_seen): a window's latency is the mean of the few requests completed in it,
    which scatters with the queue's chance, and a window in which none completed is idle
    for every controller."""
    t = settled_time(node) if at is None else at
    state = state_at(node, curves, t, speed)
    if not state.target:
        return 0.0
    rates = [c.rate_at(t) if c.open_loop else 0.0 for c in node.containers if c.present(t)]
    dual = _LAMBDAS * node.cpus
    phi = np.vectorize(lambda z: 0.5 * math.erfc(-z / math.sqrt(2.0)))
    for cores, latency, busy, target, rate in zip(state.cores, state.latency, state.busy,
                                                  state.target, rates, strict=True):
        ok = counted(latency, busy, target, alpha)
        least = min(state.floor, float(cores[ok].min())) if ok.any() else state.floor
        least = min(least, float(cores[-1]))  # a floor beyond what it can use
        held = cores >= least - 1e-12
        c, log_l = cores[held][::_BOUND_STRIDE], np.log(latency[held][::_BOUND_STRIDE])
        one_sided = not np.isnan(busy).all()  # an open-loop service
        seen = phi((math.log((1 + alpha) * target) - log_l) / scatter)
        if not one_sided:
            seen = seen - phi((math.log((1 - alpha) * target) - log_l) / scatter)
        elif window > 0.0 and rate > 0.0:
            seen = windows_seen(rate, busy[held][::_BOUND_STRIDE] / rate, (1 + alpha) * target,
                                window, scatter)
        dual += (seen[None, :] - _LAMBDAS[:, None] * c[None, :]).max(axis=1)
    return float(dual.min())


def windows_seen(rate: float, service_s: np.ndarray, limit_s: float, window: float,
                 scatter: float) -> np.ndarray:
    """For an M/D/1 service (Poisson arrivals at `rate`, each served in `service_s`), the
    fraction of observer windows (`window` s) in which it is seen at most `limit_s` slow:
    some request completed in the window, and their mean latency, times log-normal noise
    of `scatter`, is under the limit. Simulated (Lindley's recursion, the same arrivals for
    every service time: a fixed seed, so the oracle is a function) over _SEEN_WINDOWS
    windows at _SEEN_POINTS service times, interpolated in log service time."""
    rng = np.random.default_rng(_SEEN_SEED)
    span = _SEEN_WINDOWS * window
    arrivals = np.sort(rng.uniform(0.0, span, rng.poisson(rate * span)))
    points = np.geomspace(float(np.min(service_s)), float(np.max(service_s)), _SEEN_POINTS)
    phi = np.vectorize(lambda z: 0.5 * math.erfc(-z / math.sqrt(2.0)))
    n = np.arange(len(arrivals))
    seen = np.zeros(_SEEN_POINTS)
    for j, x in enumerate(points):
        leaves = np.maximum.accumulate(arrivals - n * x) + (n + 1) * x
        which = (leaves // window).astype(int)
        keep = which < _SEEN_WINDOWS
        count = np.bincount(which[keep], minlength=_SEEN_WINDOWS)[_SEEN_WARMUP:]
        total = np.bincount(which[keep], (leaves - arrivals)[keep],
                            minlength=_SEEN_WINDOWS)[_SEEN_WARMUP:]
        done = count > 0
        mean = total[done] / count[done]
        seen[j] = float(phi(np.log(limit_s / mean) / scatter).sum()) / len(count)
    return np.interp(np.log(service_s), np.log(points), seen)


def default_satisfied(node: Node, curves: dict[str, Curve], alpha: float = 0.10) -> int:
    """How many are in S on the default platform once all have arrived: even share (what
    each can use, the rest shared by the others; sim.default_latency)."""
    t = settled_time(node)
    cs = [c for c in node.containers if c.present(t)]
    latency = default_latency(node.cpus, cs, curves, t, node.slowdown_at(t))
    targets = [float(c.target_at(np.array([t]))[0]) for c in cs]
    return int((classify(targets, latency, alpha) == Cls.S).sum())


@dataclass(frozen=True)
class Outcome:
    final_s: int  # |S| in the converged state (median over the tail)
    reached_s: float | None  # when |S| first held that level (s), None if never
    shares: np.ndarray  # converged CPU use per container (CPUs, mean over the tail)
    median_latency_ratio: np.ndarray  # converged latency / target per container


def outcome(run: Run, alpha: float = 0.10) -> Outcome:
    satisfied = run.satisfied(alpha)
    tail = run.t >= run.t[-1] * (1 - TAIL)
    final = int(np.percentile(satisfied[tail], 50, method="lower"))
    with warnings.catch_warnings():  # a container that never arrived: NaN, said once
        warnings.simplefilter("ignore", RuntimeWarning)
        return Outcome(final, reached(run.t, satisfied, final),
                       np.nanmean(run.usage_cores[tail], axis=0),
                       np.nanmedian(run.latency_s[tail] / run.targets[tail], axis=0))


def reached(t: np.ndarray, satisfied: np.ndarray, level: int,
            hold: float | None = None) -> float | None:
    """The first time from which |S| stays at `level` or above for most (the median) of
    the following `hold` seconds (default: the TAIL of the run): when a noisy run got
    there, not a passing touch."""
    hold = t[-1] * TAIL if hold is None else hold
    for k in np.flatnonzero(satisfied >= level):
        ahead = satisfied[(t >= t[k]) & (t <= t[k] + hold)]
        if np.percentile(ahead, 50, method="lower") >= level:
            return float(t[k])
    return None


@dataclass(frozen=True)
class Phase:
    """One stretch of a run between changes (the last arrival, then each target change,
    load change or departure): what was possible in it and what the run got."""

    start: float
    end: float
    oracle: list[int]  # per node
    final: list[int]  # per node: median |S| over the phase's tail
    final_s: int  # all nodes: median of the total |S| over the phase's tail
    reached_s: float | None  # seconds from the start until the total first held final_s
    rounds: int | None  # policy rounds by then (the most of any node)
    mean: list[float]  # per node: mean |S| over the phase's tail
    bound: list[float] | None  # per node: noisy_bound at the run's noise; None: no noise

    @property
    def oracle_s(self) -> int:
        return sum(self.oracle)


def phases(nodes: list[Node], end: float) -> list[tuple[float, float]]:
    """The phases of a run that ends at `end`: from the last arrival to the first change,
    from there to the next, ... to the end."""
    cs = [c for nd in nodes for c in nd.containers]
    start = max((c.arrival_s for c in cs), default=0.0)
    if start >= end:  # a run shorter than its arrivals (a quick one): judged as a whole
        return [(0.0, end)]
    events = sorted({e for nd in nodes for e in node_events(nd) if start < e < end})
    bounds = [start, *events, end]
    return list(itertools.pairwise(bounds))


def phase_outcomes(run: Run, curves: dict[str, Curve], alpha: float = 0.10,
                   bound: bool = True) -> list[Phase]:
    """Each phase of the run against the oracle of its state (and, for a run with simulated
    noise and `bound`, against noisy_bound at that noise)."""
    by_node = [run.satisfied(alpha, node=k) for k in range(len(run.nodes))]
    noise = float(run.notes.get("noise", 0.0))
    total = np.sum(by_node, axis=0)
    step = float(run.t[1] - run.t[0]) if len(run.t) > 1 else 1.0
    out = []
    for a, b in phases(run.nodes, float(run.t[-1])):
        inside = (run.t > a) & (run.t <= b + 1e-9)
        if not inside.any():
            continue
        hold = max(TAIL * (b - a), MIN_WINDOWS * step)
        tail = inside & (run.t > b - hold)
        final = int(np.percentile(total[tail], 50, method="lower"))
        when = reached(run.t[inside], total[inside], final, hold)
        rounds = None if when is None or not any(run.decisions) else max(
            int(np.count_nonzero((np.array(d) > a) & (np.array(d) <= when)))
            for d in run.decisions)
        middle = (a + b) / 2
        out.append(Phase(a, b, [oracle(nd, curves, alpha, at=middle) for nd in run.nodes],
                         [int(np.percentile(sat[tail], 50, method="lower")) for sat in by_node],
                         final, None if when is None else when - a, rounds,
                         [float(sat[tail].mean()) for sat in by_node],
                         [noisy_bound(nd, curves, noise, alpha, at=middle)
                          for nd in run.nodes] if noise and bound else None))
    return out


def scatter(run: Run) -> float:
    """How much a run's window latencies scatter around each container's converged one:
    the median over containers of the standard deviation of log latency over the tail."""
    tail = run.t >= run.t[-1] * (1 - TAIL)
    logs = np.log(run.latency_s[tail])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmedian(np.nanstd(logs, axis=0)))


def settled_latency(run: Run) -> np.ndarray:
    """Each container's latency once all have arrived (median of the windows from 4 s
    after the last arrival)."""
    last = max(c.arrival_s for c in run.containers)
    settled = run.t >= min(last + 4.0, run.t[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(run.latency_s[settled], axis=0)


def matched_curves(curves: dict[str, Curve], default: Run) -> dict[str, Curve]:
    """The curves scaled so that each model's latency on the default platform is what the
    real default run measured (median over its containers of that model, its back-to-back
    workers alone where it has any: their latency is in proportion to the model's speed, a
    queue's is not): the same shape, at the speed the emulated CPUs had then. A container's
    modelled latency there is sim.default_latency's (a service as an M/D/1 queue at what its
    arrivals need), once every container has arrived."""
    measured = settled_latency(default)
    settled = max(c.arrival_s for c in default.containers)
    modelled = np.concatenate([default_latency(node.cpus, node.containers, curves, settled)
                               for node in default.nodes])
    matched = dict(curves)
    for model in {c.model for c in default.containers}:
        mine = [i for i, c in enumerate(default.containers) if c.model == model]
        workers = [i for i in mine if not default.containers[i].open_loop]
        ratios = measured[workers or mine] / modelled[workers or mine]
        matched[model] = Curve(curves[model].solo_s * float(np.nanmedian(ratios)))
    return matched


@dataclass(frozen=True)
class Agreement:
    """Simulated against real, for one scenario and mode."""

    real_s: int
    sim_s: int
    share_error: float  # mean |sim - real| converged CPU share, CPUs

    def within(self, s_tolerance: int, share_tolerance: float) -> bool:
        return abs(self.sim_s - self.real_s) <= s_tolerance and \
            self.share_error <= share_tolerance


def agreement(real: Run, sim: Run, alpha: float = 0.10) -> Agreement:
    """The final |S| of each, and their converged CPU shares compared container by
    container, but among interchangeable containers (same model, node, arrival, departure,
    threads and events, targets within alpha/2 of each other) share by share in sorted
    order: a policy picks among those by the noise of its measurements, which no simulator
    repeats."""
    r, s = outcome(real, alpha), outcome(sim, alpha)
    real_shares, sim_shares = r.shares.copy(), s.shares.copy()
    for group in interchangeable(real, alpha / 2):
        real_shares[group] = np.sort(real_shares[group])
        sim_shares[group] = np.sort(sim_shares[group])
    return Agreement(r.final_s, s.final_s, float(np.nanmean(np.abs(sim_shares - real_shares))))


def interchangeable(run: Run, tolerance: float) -> list[np.ndarray]:
    """Groups (of two or more, by index) of the run's containers that differ only by their
    targets, each within `tolerance` (relative) of the group's loosest."""
    groups: dict[tuple[object, ...], list[tuple[float, int]]] = {}
    for i, (c, node) in enumerate(zip(run.containers, run.node_of, strict=True)):
        kind = (c.model, int(node), c.arrival_s, c.departure_s, c.threads, c.retargets, c.load)
        groups.setdefault(kind, []).append((c.target_s, i))
    out = []
    for members in groups.values():
        members.sort(reverse=True)
        while members:
            loosest = members[0][0]
            near = [i for target, i in members if target >= loosest * (1 - tolerance)]
            members = [m for m in members if m[1] not in near]
            if len(near) > 1:
                out.append(np.array(sorted(near)))
    return out
