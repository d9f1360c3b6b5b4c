"""Issue 34 in the simulator at a larger scale: three pipelines sharing eight nodes under
open-loop load and random interference, scaled by the model-based scaler
(dqoes_cg.cluster.scaler, dqoes-cg's default) against the least over-provisioned fixed
deployment that holds and Swarm's default (one replica a stage, nothing done).

The world is bench/cluster/pipeline_env.py's (M/M/1-like replicas at most one CPU each,
work slowed non-linearly by interference, 5% noise on each stage's measured latency), with
one PipelineEnv a pipeline, each the others' neighbours: a node's CPU is shared by every
replica of every pipeline on it, and Swarm's spread counts them all. The nodes (NODE_CPUS,
NODE_SPEED) have 8 to 16 CPUs at speeds 0.8 to 1.15 (Swarm's spread is blind to CPUs, so a
node's share of the load does not fall with more replicas: with 4 CPUs, a node at 75%
interference broke every fixed deployment); each node's interference is 0, 25, 50 or 75% (odds
0.4, 0.3, 0.2, 0.1), drawn afresh with chance 0.1 a window, as pipeline_env does. The
pipelines (PIPELINES): the paper's five-stage video DAG, a three-stage chain, a
four-stage fork (one branch a sink of its own), each with its own end-to-end target
(mean latency of its longest path) and its own open-loop Poisson arrivals, whose rate
steps (chance 0.05 a window, to anywhere in its range) and bursts (chance BURST_CHANCE
a window, BURST_FACTOR times the rate for 1 to 3 windows). One window is 10 s; a seed
draws the interference and the rates once (`Load`), and every policy runs on that trace
and on the same arrivals and noise.

The policies:
- `scaler`: one Scaler for the three pipelines, as the manager runs it (every window, the
  split made again from each pipeline's rate, work and replicas and held while no share moves
  more than 10%; its limits: 30 s hold after a stage's action, 2 actions a minute per
  pipeline; each decision one Swarm update: a scale to its count, spread over the nodes it
  prefers, or a move of the stage's tasks off a node), from one replica a stage. It reads the
  model's CPU a replica has and the last window's mean rate, without noise: it is judged on
  its rule, not on its measurements.
- `fixed`: a fixed deployment spread by Swarm, per pipeline max(1, ⌈k λ s⌉) replicas a stage
  (λ the pipeline's top rate in a burst, s the stage's work: k times the CPUs it needs at
  that rate on an idle node of speed 1), with the least k of FACTORS that holds the target in
  at least 90% of the settled windows in every seed (searched, pipeline by pipeline, with the
  others at theirs: the least over-provisioned uniform deployment that holds).
- `swarm`: Swarm's default, one replica a stage spread, nothing done.

A window is settled from SETTLE windows on (the scaler starts from one replica a stage);
every figure is over the settled windows: the share holding the target, violations,
replica-seconds, the nodes a pipeline runs on (median), and its reaction to each rise of a
node's interference level while it has a replica there: the windows from the rise until it
holds its target again (0: it held through it). Median (min-max) over the seeds.

    python3 -m bench.cluster.pipelines_at_scale [--quick] [--seeds S ...] [--windows W]
                                                [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dqoes_cg.cluster.scaler import Decision, Scaler, ScalerParams
from dqoes_cg.cluster.split import Split, settle

from .darly import decided_stage, env_split, pipeline_load, spread
from .pipeline_env import LEVEL_ODDS, LEVELS, PATHS, STAGES, STEP_S, WORK_S, EnvParams, PipelineEnv

NODE_CPUS = (16.0, 16.0, 12.0, 12.0, 8.0, 8.0, 8.0, 8.0)
NODE_SPEED = (1.0, 0.85, 1.15, 0.9, 1.05, 0.8, 1.1, 0.95)


@dataclass(frozen=True)
class Pipeline:
    name: str
    stages: tuple[str, ...]
    work_s: tuple[float, ...]  # CPU-seconds a request at speed 1
    paths: tuple[tuple[int, ...], ...]  # source to sink
    target_s: float  # end to end
    rate_hz: tuple[float, float]  # its rate steps within this (bursts go past it)


PIPELINES = (
    Pipeline("video", STAGES, WORK_S, PATHS, 0.675, (3.0, 7.0)),
    Pipeline("ingest", ("parse", "transform", "store"), (0.020, 0.050, 0.010), ((0, 1, 2),),
             0.3, (8.0, 24.0)),
    Pipeline("recommend", ("gateway", "candidates", "ranker", "logger"),
             (0.010, 0.060, 0.090, 0.015), ((0, 1, 2), (0, 3)), 0.45, (3.0, 8.0)),
)
BURST_CHANCE = 0.03  # a window, per pipeline
BURST_FACTOR = 1.6
BURST_WINDOWS = (1, 3)
WINDOWS = 360  # an hour
SETTLE = 18  # the first 3 minutes are not counted
SEEDS = (0, 1, 2, 3, 4)
GOAL = 0.9  # the share of settled windows that must hold the target
FACTORS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0)
MAX_REPLICAS = 32  # the scaler's
POLICIES = ("scaler", "fixed", "swarm")
RESULTS = Path(__file__).parent / "results" / "pipelines-at-scale"


@dataclass(frozen=True)
class Load:
    """A seed's trace: each node's interference level and each pipeline's rate, a window."""

    level: np.ndarray  # windows x nodes
    rate: np.ndarray  # windows x pipelines


def load_trace(seed: int, windows: int, pipelines: Sequence[Pipeline] = PIPELINES,
               nodes: int = len(NODE_CPUS)) -> Load:
    """Interference as pipeline_env's (each node's level drawn afresh with its chance a
    window), rates stepping within each pipeline's range and bursting past it."""
    rng = np.random.default_rng([seed, 0])  # a stream each, so a shorter run is a prefix
    env = EnvParams()
    level = np.empty((windows, nodes))
    level[0] = rng.choice(LEVELS, size=nodes, p=LEVEL_ODDS)
    for t in range(1, windows):
        change = rng.random(nodes) < env.interference_change
        level[t] = np.where(change, rng.choice(LEVELS, size=nodes, p=LEVEL_ODDS), level[t - 1])
    rate = np.empty((windows, len(pipelines)))
    for i, p in enumerate(pipelines):
        rng = np.random.default_rng([seed, 1 + i])
        base, burst = float(rng.uniform(*p.rate_hz)), 0
        for t in range(windows):
            if rng.random() < env.rate_change:
                base = float(rng.uniform(*p.rate_hz))
            if burst == 0 and rng.random() < BURST_CHANCE:
                burst = int(rng.integers(BURST_WINDOWS[0], BURST_WINDOWS[1] + 1))
            rate[t, i] = base * (BURST_FACTOR if burst else 1.0)
            burst = max(burst - 1, 0)
    return Load(level, rate)


def cluster(seed: int, pipelines: Sequence[Pipeline] = PIPELINES) -> list[PipelineEnv]:
    """One env a pipeline on the same nodes, each the others' neighbours (its own arrivals'
    and noise's seed)."""
    envs = [PipelineEnv(EnvParams(target_s=p.target_s, node_cpus=NODE_CPUS,
                                  node_speed=NODE_SPEED, work_s=p.work_s, paths=p.paths,
                                  rate_hz=p.rate_hz, max_replicas=MAX_REPLICAS),
                        seed=seed * len(pipelines) + i) for i, p in enumerate(pipelines)]
    for env in envs:
        env.neighbours = [o for o in envs if o is not env]
    return envs


Policy = Callable[[list[PipelineEnv], float], None]  # acts on the envs at a time (s)


def do_nothing(_envs: list[PipelineEnv], _now: float) -> None:
    return None


@dataclass
class ScalerPolicy:
    """The model-based scaler over all the pipelines, as the manager runs it: each window
    each pipeline's split made again (held within split.HYSTERESIS), one plan for all, every
    decision carried out as Swarm would (pipeline_env's swarm_scale and swarm_move)."""

    pipelines: Sequence[Pipeline]
    params: ScalerParams = field(default_factory=lambda: ScalerParams(interval_s=STEP_S))
    log: list[tuple[float, str, str]] = field(default_factory=list)  # when, pipeline, why

    def __post_init__(self) -> None:
        self.scaler = Scaler(self.params)
        self.held: list[Split | None] = [None] * len(self.pipelines)

    def __call__(self, envs: list[PipelineEnv], now: float) -> None:
        loads = []
        for i, (env, p) in enumerate(zip(envs, self.pipelines, strict=True)):
            held = self.held[i] = settle(self.held[i], env_split(env))
            loads.append(pipeline_load(env, p.name, held, p.stages))
        names = [p.name for p in self.pipelines]
        for d in self.scaler.plan(now, loads).decisions:
            carry_out(envs[names.index(d.pipeline)], d)
            self.log.append((now, d.pipeline, d.why))


def carry_out(env: PipelineEnv, d: Decision) -> None:
    """A decision as one Swarm update of the stage's service."""
    stage, among = decided_stage(d), [int(n) for n in d.prefer] or None
    if d.move_from is not None:
        env.swarm_move(stage, int(d.move_from), among)
    else:
        env.swarm_scale(stage, d.replicas, among)


@dataclass
class Run:
    """One policy on one seed's trace, a window at a time."""

    quotient: np.ndarray  # windows x pipelines: La/Lt (inf: overloaded)
    replicas: np.ndarray  # windows x pipelines
    uses: np.ndarray  # windows x pipelines x nodes: it has a replica there (bool)
    actions: int = 0


def run(policy: Policy, load: Load, seed: int, replicas: Sequence[Sequence[int]] | None = None,
        pipelines: Sequence[Pipeline] = PIPELINES) -> Run:
    """The policy over the trace, from `replicas` a stage per pipeline (one by default),
    spread by Swarm pipeline after pipeline. It acts at the start of each window on the last
    one's measurements (the first, on a window at the first's levels and rates)."""
    envs = cluster(seed, pipelines)
    for i, env in enumerate(envs):
        env.deploy(None if replicas is None else replicas[i])
    windows, nodes = load.level.shape
    out = Run(np.empty((windows, len(envs))), np.empty((windows, len(envs)), np.int64),
              np.empty((windows, len(envs), nodes), bool))

    def measure(t: int) -> None:
        for i, env in enumerate(envs):
            env.level, env.rate = load.level[t], float(load.rate[t, i])
        for env in envs:
            env.measure()

    measure(0)
    for t in range(windows):
        policy(envs, t * STEP_S)
        measure(t)
        for i, env in enumerate(envs):
            assert env.obs is not None
            out.quotient[t, i] = env.obs.latency_s / env.obs.target_s
            out.replicas[t, i] = env.replicas()
            out.uses[t, i] = env.placement.sum(axis=0) > 0
    if isinstance(policy, ScalerPolicy):
        out.actions = len(policy.log)
    return out


def reactions(level: np.ndarray, held: np.ndarray, uses: np.ndarray, first: int
              ) -> list[list[int]]:
    """Per pipeline, for each rise of a node's level from window `first` on while the
    pipeline has a replica there: the windows until it holds again (0: it held; the run's end
    when it never did)."""
    windows, pipelines = held.shape
    out: list[list[int]] = [[] for _ in range(pipelines)]
    for t in range(max(first, 1), windows):
        for n in np.nonzero(level[t] > level[t - 1])[0]:
            for i in np.nonzero(uses[t, :, n])[0]:
                late = np.nonzero(held[t:, i])[0]
                out[i].append(int(late[0]) if late.size else windows - t)
    return out


def figures(r: Run, load: Load, settle_at: int) -> list[dict[str, float]]:
    """Per pipeline, over the settled windows: held (share), violations, replica-seconds,
    nodes (median), reactions (rises met, how many broke it, median and max windows)."""
    held = r.quotient <= 1.0
    react = reactions(load.level, held, r.uses, settle_at)
    out = []
    for i in range(held.shape[1]):
        mine = held[settle_at:, i]
        out.append({"held": float(mine.mean()), "violations": int((~mine).sum()),
                    "replica_seconds": float(r.replicas[settle_at:, i].sum() * STEP_S),
                    "nodes": float(np.median(r.uses[settle_at:, i].sum(axis=1))),
                    "rises": len(react[i]), "broke": sum(k > 0 for k in react[i]),
                    "reaction_median": float(np.median(react[i])) if react[i] else 0.0,
                    "reaction_max": float(max(react[i], default=0))})
    return out


def overall(r: Run, settle_at: int) -> dict[str, float]:
    """All pipelines together, over the settled windows: the share of windows where every
    pipeline held, replica-seconds, the nodes any runs on (median)."""
    return {"all_held": float((r.quotient[settle_at:] <= 1.0).all(axis=1).mean()),
            "replica_seconds": float(r.replicas[settle_at:].sum() * STEP_S),
            "nodes": float(np.median(r.uses[settle_at:].any(axis=1).sum(axis=1))),
            "actions": float(r.actions)}


def fixed_replicas(p: Pipeline, factor: float) -> tuple[int, ...]:
    """max(1, ⌈k λ s⌉) a stage: k times the CPUs it needs at the top rate of a burst."""
    peak = p.rate_hz[1] * BURST_FACTOR
    return tuple(max(1, math.ceil(factor * peak * s - 1e-9)) for s in p.work_s)


def search_fixed(loads: Sequence[Load], seeds: Sequence[int], settle_at: int,
                 pipelines: Sequence[Pipeline] = PIPELINES
                 ) -> tuple[list[float], list[Run], list[dict[str, object]]]:
    """The least factor of FACTORS per pipeline whose fixed deployment holds GOAL of the
    settled windows in every seed, the others at theirs: from the least, each pipeline that
    does not hold takes the next factor, until all hold (or are at the largest). The factors,
    their runs, and each round tried."""
    at = [0] * len(pipelines)
    tried: list[dict[str, object]] = []
    while True:
        factors = [FACTORS[k] for k in at]
        deployment = [fixed_replicas(p, f) for p, f in zip(pipelines, factors, strict=True)]
        runs = [run(do_nothing, load, seed, deployment, pipelines)
                for load, seed in zip(loads, seeds, strict=True)]
        least = [min(figures(r, load, settle_at)[i]["held"]
                     for r, load in zip(runs, loads, strict=True))
                 for i in range(len(pipelines))]
        tried.append({"factors": factors, "least_held": least})
        short = [i for i, h in enumerate(least) if h < GOAL and at[i] + 1 < len(FACTORS)]
        if not short:
            return factors, runs, tried
        for i in short:
            at[i] += 1


def judge(seeds: Sequence[int], windows: int, settle_at: int,
          pipelines: Sequence[Pipeline] = PIPELINES) -> dict[str, object]:
    """Every policy on every seed's trace: per policy, per pipeline and over all, each
    seed's figures and their median (min-max); the first seed's runs over time."""
    loads = [load_trace(seed, windows, pipelines) for seed in seeds]
    factors, fixed_runs, tried = search_fixed(loads, seeds, settle_at, pipelines)
    runs: dict[str, list[Run]] = {"fixed": fixed_runs}
    logs: list[list[tuple[float, str, str]]] = []
    runs["scaler"], runs["swarm"] = [], []
    for load, seed in zip(loads, seeds, strict=True):
        policy = ScalerPolicy(pipelines)
        runs["scaler"].append(run(policy, load, seed, None, pipelines))
        logs.append(policy.log)
        runs["swarm"].append(run(do_nothing, load, seed, None, pipelines))
    results: dict[str, object] = {
        "seeds": list(seeds), "windows": windows, "settle": settle_at,
        "pipelines": [{"name": p.name, "stages": list(p.stages), "work_s": list(p.work_s),
                       "paths": [list(x) for x in p.paths], "target_s": p.target_s,
                       "rate_hz": list(p.rate_hz),
                       "fixed_factor": f, "fixed_replicas": list(fixed_replicas(p, f))}
                      for p, f in zip(pipelines, factors, strict=True)],
        "fixed_search": tried, "policies": {}}
    policies: dict[str, object] = {}
    for name in POLICIES:
        each = [figures(r, load, settle_at) for r, load in zip(runs[name], loads, strict=True)]
        every = [overall(r, settle_at) for r in runs[name]]
        policies[name] = {
            "pipelines": {p.name: {k: spread([e[i][k] for e in each]) for k in each[0][i]}
                          for i, p in enumerate(pipelines)},
            "all": {k: spread([e[k] for e in every]) for k in every[0]},
            "per_seed": {"pipelines": each, "all": every}}
    results["policies"] = policies
    first = {name: runs[name][0] for name in POLICIES}
    results["first_seed"] = {
        "level": loads[0].level.tolist(), "rate": loads[0].rate.tolist(),
        "quotient": {n: np.minimum(r.quotient, 4.0).tolist() for n, r in first.items()},
        "replicas": {n: r.replicas.tolist() for n, r in first.items()},
        "scaler_log": [list(x) for x in logs[0]]}
    return results


FIGURES = (("held", "held", 1), ("violations", "violations", 0),
           ("replica_seconds", "replica-seconds", 0), ("nodes", "nodes", 1),
           ("reaction_median", "reaction, median", 1), ("reaction_max", "reaction, max", 0))


def _cell(f: dict[str, float], digits: int, percent: bool = False) -> str:
    scale = 100.0 if percent else 1.0
    return (f"{f['median'] * scale:,.{digits}f} ({f['min'] * scale:,.{digits}f}-"
            f"{f['max'] * scale:,.{digits}f})")


def markdown(results: dict[str, object], command: str) -> str:
    """The tables: per pipeline and over all, each policy's figures, median (min-max) over
    the seeds; the fixed deployment found; the command."""
    seeds, windows, at = results["seeds"], results["windows"], results["settle"]
    pipelines, policies = results["pipelines"], results["policies"]
    assert isinstance(seeds, list) and isinstance(pipelines, list) \
        and isinstance(policies, dict) and isinstance(windows, int) and isinstance(at, int)
    settled = windows - at
    lines = [f"# Pipelines at scale: {len(pipelines)} pipelines on {len(NODE_CPUS)} nodes", "",
             f"    {command}", "",
             f"Nodes: CPUs {', '.join(f'{c:g}' for c in NODE_CPUS)}; speeds "
             f"{', '.join(f'{s:g}' for s in NODE_SPEED)}; interference 0/25/50/75% (odds "
             f"{'/'.join(f'{o:g}' for o in LEVEL_ODDS)}), drawn afresh on each node with "
             f"chance {EnvParams().interference_change:g} a window. {windows} windows of "
             f"{STEP_S:g} s per seed, seeds {', '.join(map(str, seeds))}; settled from window "
             f"{at} on ({settled} windows counted). Rates step with chance "
             f"{EnvParams().rate_change:g} a window and burst x{BURST_FACTOR:g} for "
             f"{BURST_WINDOWS[0]}-{BURST_WINDOWS[1]} windows with chance {BURST_CHANCE:g}.", "",
             "| pipeline | stages (work ms) | paths | target | rate /s | fixed (k) |",
             "|---|---|---|---|---|---|"]
    for p in pipelines:
        stages = ", ".join(f"{n} {w * 1e3:g}" for n, w in zip(p["stages"], p["work_s"],
                                                               strict=True))
        paths = "; ".join("-".join(str(s) for s in path) for path in p["paths"])
        lines.append(f"| {p['name']} | {stages} | {paths} | {p['target_s']:g} s | "
                     f"{p['rate_hz'][0]:g}-{p['rate_hz'][1]:g} | "
                     f"{tuple(p['fixed_replicas'])} ({p['fixed_factor']:g}) |")
    lines += ["", "Median (min-max) over the seeds; held: share of the settled windows "
              "within the target; reaction: windows from a rise of a node's level (while the "
              "pipeline has a replica there) until it holds again, 0 when it held.", ""]
    for p in pipelines:
        lines += [f"## {p['name']} (Lt {p['target_s']:g} s)", "",
                  "| policy | held % | violations | replica-seconds | nodes | rises | broke "
                  "| reaction median | reaction max |", "|---|---|---|---|---|---|---|---|---|"]
        for name in POLICIES:
            f = policies[name]["pipelines"][p["name"]]
            lines.append(
                f"| {name} | {_cell(f['held'], 1, True)} | {_cell(f['violations'], 0)} | "
                f"{_cell(f['replica_seconds'], 0)} | {_cell(f['nodes'], 1)} | "
                f"{_cell(f['rises'], 0)} | {_cell(f['broke'], 0)} | "
                f"{_cell(f['reaction_median'], 1)} | {_cell(f['reaction_max'], 0)} |")
        lines.append("")
    lines += ["## All pipelines", "",
              "| policy | windows all held % | replica-seconds | nodes used | actions |",
              "|---|---|---|---|---|"]
    for name in POLICIES:
        f = policies[name]["all"]
        lines.append(f"| {name} | {_cell(f['all_held'], 1, True)} | "
                     f"{_cell(f['replica_seconds'], 0)} | {_cell(f['nodes'], 1)} | "
                     f"{_cell(f['actions'], 0)} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, object], path: Path) -> bool:
    """The first seed over time (each pipeline's La/Lt and replicas per policy, each node's
    interference) and, per seed, each policy's held share and replica-seconds (False:
    matplotlib is not installed)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, pipelines, policies = results["first_seed"], results["pipelines"], \
        results["policies"]
    assert isinstance(first, dict) and isinstance(pipelines, list) \
        and isinstance(policies, dict)
    cols = len(pipelines)
    fig, axes = plt.subplots(3, cols, figsize=(6 * cols, 11), squeeze=False)
    for i, p in enumerate(pipelines):
        for name in POLICIES:
            axes[0][i].plot([q[i] for q in first["quotient"][name]], label=name, lw=0.7)
            axes[1][i].plot([r[i] for r in first["replicas"][name]], label=name, lw=0.8)
        axes[0][i].axhline(1.0, color="k", lw=0.5)
        axes[0][i].set_ylim(0, 2.5)
        axes[0][i].set_title(f"{p['name']} (Lt {p['target_s']:g} s): La/Lt, first seed")
        axes[1][i].set_title(f"{p['name']}: replicas")
        axes[1][i].set_xlabel(f"window ({STEP_S:g} s)")
    axes[0][0].legend(fontsize=7)
    level = np.asarray(first["level"]).T
    axes[2][0].imshow(level, aspect="auto", cmap="Reds", vmin=0, vmax=0.75,
                      interpolation="nearest")
    axes[2][0].set_title("interference a node (0 to 75%), first seed")
    axes[2][0].set_ylabel("node")
    for x, name in enumerate(POLICIES):
        each = policies[name]["per_seed"]
        for i in range(cols):
            held = [100.0 * s[i]["held"] for s in each["pipelines"]]
            axes[2][1].plot([x + 0.2 * (i - 1)] * len(held), held, "o", ms=3,
                            color=f"C{i}", label=pipelines[i]["name"] if x == 0 else None)
        spent = [a["replica_seconds"] for a in each["all"]]
        axes[2][2 % cols].plot([x] * len(spent), spent, "o", color="C0", alpha=0.6, ms=4)
    axes[2][1].axhline(100.0 * GOAL, color="k", lw=0.5)
    axes[2][1].set_xticks(range(len(POLICIES)), POLICIES)
    axes[2][1].set_title("held % of settled windows, per seed and pipeline")
    axes[2][1].legend(fontsize=7)
    axes[2][2 % cols].set_xticks(range(len(POLICIES)), POLICIES)
    axes[2][2 % cols].set_title("replica-seconds, all pipelines, per seed")
    axes[2][2 % cols].set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.cluster.pipelines_at_scale",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="two seeds of 60 windows, settled after 12")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--windows", type=int, default=None)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    seeds = args.seeds or ([0, 1] if args.quick else list(SEEDS))
    windows = args.windows or (60 if args.quick else WINDOWS)
    settle_at = 12 if args.quick else SETTLE
    if windows <= settle_at or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        p.error(f"--windows above {settle_at}, distinct seeds from 0")
    started = time.monotonic()
    results = judge(seeds, windows, settle_at)
    command = " ".join(["python3 -m bench.cluster.pipelines_at_scale",
                        *(sys.argv[1:] if argv is None else argv)])
    results["command"] = command
    results["minutes"] = (time.monotonic() - started) / 60.0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pipelines-at-scale.json").write_text(json.dumps(results, indent=1))
    table = markdown(results, command)
    (args.out / "pipelines-at-scale.md").write_text(table)
    plotted = plot(results, args.out / "pipelines-at-scale.png")
    print(table)
    print(f"{results['minutes']:.1f} minutes; results in {args.out}"
          + ("" if plotted else " (no plot: matplotlib missing)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
