"""Fig. 5 of the Darly paper in the simulator (bench/cluster/pipeline_env.py): the four
schedulers of its learned agent (fullmap, custom, swarm, profile; dqoes_cg.cluster.darly),
each trained for a number of episodes, beside the model-based scaler
(dqoes_cg.cluster.scaler), a fixed deployment spread by Swarm (Swarm's default without
dqoes-cg) and doing nothing from one replica a stage, at a loose and a strict constraint,
while the interference changes at random.

Each policy then runs the same evaluation: EVAL_RUNS runs of EVAL_STEPS windows, the same
seeds for all (so the same interference and rates), greedy (no exploration). Per policy:
the QoS quotient La/Lt over time, the cumulative reward (Eq. 1), the violations (windows
over Lt), the mean replicas and nodes used; a plot with matplotlib when it is installed.

All of it is repeated for each seed of --seeds: seed s trains the agents on seed s and
judges every policy on its own held-out runs (EVAL_SEED + EVAL_RUNS s onwards, never
trained on), so the figures' median and range over the seeds show what a training seed and
an interference trace move, and the schedulers' ranking is compared seed by seed (same runs
for all policies within a seed). darly.json, darly.md (the tables), darly.png; each judged
policy is kept in fig5-runs.json as it is done, and a rerun skips it (a stopped run
resumes; the same figures, as all is seeded).

    python3 -m bench.cluster.darly [--quick] [--episodes N] [--seeds S ...] [--jobs J]
                                   [--out DIR] [--weights DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dqoes_cg.cluster.darly import (
    SCHEDULERS,
    Action,
    ActionSpace,
    Agent,
    AgentParams,
    feature_count,
    features,
)
from dqoes_cg.cluster.scaler import Decision, PipelineLoad, Scaler, ScalerParams, StageLoad
from dqoes_cg.cluster.split import Split, split

from .pipeline_env import STAGES, STEP_S, EnvParams, PipelineEnv

# The constraints, as the paper's 35 s and 26 s (a ratio of 1.35): the strict one is about
# the pipeline's latency at the mean rate on idle nodes with two replicas of its two busiest
# stages (0.42 s), the fixed deployment's at the top rate (0.40 s), with a little to spare.
CONSTRAINTS = {"loose": 0.675, "strict": 0.5}
EPISODE_STEPS = 50
EPISODES = 1500
EVAL_RUNS = 5
EVAL_STEPS = 200
EVAL_SEED = 1000  # the first evaluation run's seed; training seeds stay below it
SEEDS = (0, 1, 2, 3, 4)
FIGURES = ("violations", "reward", "replicas", "nodes")
LEARNT = SCHEDULERS
BASELINES = ("model", "fixed", "nothing", "random")  # as judged_baselines makes them
QUOTIENT_SHOWN = 4.0  # the quotient over time is kept up to this (inf: overloaded)
FIXED_REPLICAS = (2, 3, 2, 3, 1)  # by the model: holds the top rate on idle nodes
RESULTS = Path(__file__).parent / "results" / "darly"

Policy = Callable[[PipelineEnv, float], Action]  # the env, its time (s): an action


@dataclass
class Trace:
    quotient: list[float]  # La/Lt a window (inf: overloaded)
    rewards: list[float]
    replicas: list[int]
    servers: list[int]

    def figures(self) -> dict[str, float]:
        n = len(self.rewards)
        return {"windows": n,
                "violations": sum(q > 1.0 for q in self.quotient),
                "reward": float(sum(self.rewards)),
                "mean_quotient_held": float(np.mean([q for q in self.quotient if q <= 1.0]
                                                    or [math.nan])),
                "replicas": float(np.mean(self.replicas)),
                "nodes": float(np.mean(self.servers))}


def env_params(constraint: str) -> EnvParams:
    return EnvParams(target_s=CONSTRAINTS[constraint])


def train(scheduler: str, params: EnvParams, episodes: int = EPISODES,
          steps: int = EPISODE_STEPS, seed: int = 0,
          agent_params: AgentParams | None = None) -> tuple[Agent, list[float]]:
    """An agent trained for `episodes` episodes of `steps` windows each: it, and each
    episode's reward."""
    env = PipelineEnv(params, seed=seed)
    space = ActionSpace(scheduler, env.stages, env.nodes)
    agent_params = agent_params or AgentParams(
        epsilon_steps=max(1, episodes * steps * 6 // 10))
    agent = Agent(feature_count(env.stages, env.nodes), space.size, agent_params, seed=seed)
    totals = []
    for _ in range(episodes):
        state = features(env.reset())
        total = 0.0
        for step in range(steps):
            index = agent.act(state)
            obs, r = env.step(space.decode(index), space)
            following = features(obs)
            agent.remember(state, index, r, following, step == steps - 1)
            agent.learn()
            state, total = following, total + r
        totals.append(float(total))
    return agent, totals


def agent_policy(agent: Agent, space: ActionSpace) -> Policy:
    def act(env: PipelineEnv, _now: float) -> Action:
        assert env.obs is not None
        return space.decode(agent.act(features(env.obs), explore=False))
    return act


def random_policy(space: ActionSpace, seed: int = 0) -> Policy:
    rng = np.random.default_rng(seed)
    return lambda _env, _now: space.decode(int(rng.integers(space.size)))


def nothing_policy(_env: PipelineEnv, _now: float) -> Action:
    return Action("none")


def env_split(env: PipelineEnv) -> Split:
    """The split of the env's pipeline target (split.py) from its stages' work, its rate and
    the replicas running."""
    p = env.params
    replicas = [int(env.placement[s].sum()) for s in range(env.stages)]
    return split(p.target_s, [list(path) for path in p.paths], list(p.work_s),
                 [env.rate] * env.stages, replicas)


def pipeline_load(env: PipelineEnv, name: str, shares: Split, stages: Sequence[str]
                  ) -> PipelineLoad:
    """The env's pipeline as the scaler reads it (stage i's service ID is NAME/i, a node's
    str(n)): each stage's work, rate, share of Lt, the CPU its replicas have and a new one
    could have on each node, its latency in the last window."""
    p = env.params
    return PipelineLoad(name, tuple(
        StageLoad(f"{name}/{s}", stages[s], int(env.placement[s].sum()), p.work_s[s], env.rate,
                  shares.stage_s[s], {str(n): c for n, c in env.replica_cpus(s).items()},
                  {str(n): c for n, c in env.room_cpus(s).items()},
                  latency_s=env.obs.stage_latency_s[s] if env.obs else None)
        for s in range(env.stages)), shares.feasible)


def decided_stage(d: Decision) -> int:
    """The stage a decision on a pipeline_load's stage is about."""
    return int(d.service_id.rsplit("/", 1)[1])


class ModelScalerPolicy:
    """The model-based scaler of the pipelines issue, fed what the env's nodes would
    report: each stage's work, rate, share of Lt (split.py), the CPU its replicas have."""

    def __init__(self, params: ScalerParams | None = None) -> None:
        self.scaler = Scaler(params or ScalerParams(interval_s=STEP_S, hold_s=2 * STEP_S))

    def __call__(self, env: PipelineEnv, now: float) -> Action:
        replicas = [int(env.placement[s].sum()) for s in range(env.stages)]
        plan = self.scaler.plan(now, [pipeline_load(env, "video", env_split(env), STAGES)])
        for d in plan.decisions:  # the env carries out one action a window
            s = decided_stage(d)
            if d.move_from is not None:
                # where Swarm's spread would put it among the nodes with room
                room = [int(n) for n in d.prefer]
                if room:
                    return Action("move", s, min(room, key=lambda n: (
                        env.placement[:, n].sum(), n)), int(d.move_from))
            elif d.replicas < replicas[s]:
                return Action("in", s)
            elif d.replicas > replicas[s]:  # steered to the nodes with room, spread there
                room = [int(n) for n in d.prefer]
                return Action("out", s, min(room, key=lambda n: (
                    env.placement[:, n].sum(), n)) if room else None)
        return Action("none")


def run(env: PipelineEnv, policy: Policy, scheduler: str, steps: int = EVAL_STEPS,
        replicas: Sequence[int] | None = None) -> Trace:
    """`steps` windows of `policy` from a fresh episode."""
    env.reset(replicas)
    trace = Trace([], [], [], [])
    for step in range(steps):
        env.apply(policy(env, step * STEP_S), scheduler)
        obs, r = env.advance()
        trace.quotient.append(obs.latency_s / obs.target_s)
        trace.rewards.append(r)
        trace.replicas.append(env.replicas())
        trace.servers.append(env.servers())
    return trace


def evaluate(policy_for: Callable[[], Policy], scheduler: str, params: EnvParams,
             runs: int = EVAL_RUNS, steps: int = EVAL_STEPS,
             replicas: Sequence[int] | None = None, first: int = EVAL_SEED) -> list[Trace]:
    """`runs` runs of a fresh policy on the evaluation seeds (first + run)."""
    return [run(PipelineEnv(params, seed=first + i), policy_for(), scheduler, steps, replicas)
            for i in range(runs)]


def eval_seed(seed: int, runs: int) -> int:
    """The first evaluation run of training seed `seed`: its runs are its own, held out."""
    return EVAL_SEED + runs * seed


def summary(traces: Sequence[Trace]) -> dict[str, float]:
    each = [t.figures() for t in traces]
    return {k: float(np.mean([f[k] for f in each])) for k in each[0]}


@dataclass
class Training:
    episodes: int
    minutes: float
    episode_reward: list[float]


@dataclass
class Judged:
    """One policy at one constraint and seed: each evaluation run's figures, the first run
    over time, and its training when it learnt."""

    policy: str
    constraint: str
    seed: int
    runs: list[dict[str, float]]
    first: Trace
    training: Training | None = None

    @classmethod
    def of(cls, policy: str, constraint: str, seed: int, traces: Sequence[Trace],
           training: Training | None = None) -> Judged:
        t = traces[0]
        first = Trace([float(min(q, QUOTIENT_SHOWN)) for q in t.quotient],
                      [float(r) for r in t.rewards], [int(r) for r in t.replicas],
                      [int(n) for n in t.servers])
        runs = [{k: float(v) for k, v in x.figures().items()} for x in traces]
        return cls(policy, constraint, seed, runs, first, training)

    def record(self) -> dict[str, object]:
        """As kept in the store (JSON)."""
        training = None if self.training is None else {
            "episodes": self.training.episodes, "minutes": self.training.minutes,
            "episode_reward": self.training.episode_reward}
        return {"policy": self.policy, "constraint": self.constraint, "seed": self.seed,
                "runs": self.runs, "first": asdict(self.first), "training": training}

    @classmethod
    def from_record(cls, doc: dict[str, Any]) -> Judged:
        training = doc["training"]
        return cls(doc["policy"], doc["constraint"], int(doc["seed"]), doc["runs"],
                   Trace(**doc["first"]), None if training is None else Training(**training))

    def figures(self) -> dict[str, float]:
        """The mean over its evaluation runs."""
        return {k: float(np.mean([r[k] for r in self.runs])) for k in self.runs[0]}


def judged_agent(scheduler: str, constraint: str, episodes: int, runs: int, steps: int,
                 seed: int, weights: Path | None) -> Judged:
    """`scheduler`'s agent trained on `seed` and judged on the seed's evaluation runs (its
    weights saved in `weights` as darly-SCHEDULER-CONSTRAINT-sSEED.npz)."""
    params = env_params(constraint)
    started = time.monotonic()
    agent, totals = train(scheduler, params, episodes, seed=seed)
    training = Training(episodes, (time.monotonic() - started) / 60.0,
                        [round(r, 1) for r in totals])  # kept for the plot, and stored
    if weights is not None:
        weights.mkdir(parents=True, exist_ok=True)
        agent.save(weights / f"darly-{scheduler}-{constraint}-s{seed}.npz")
    probe = PipelineEnv(params)
    space = ActionSpace(scheduler, probe.stages, probe.nodes)
    traces = evaluate(lambda: agent_policy(agent, space), scheduler, params, runs, steps,
                      first=eval_seed(seed, runs))
    return Judged.of(scheduler, constraint, seed, traces, training)


def judged_baselines(constraint: str, runs: int, steps: int, seed: int) -> list[Judged]:
    """The policies that do not learn, on the seed's evaluation runs: the model-based
    scaler, Swarm's default (a fixed deployment spread by Swarm), nothing, random."""
    params = env_params(constraint)
    probe = PipelineEnv(params)
    space = ActionSpace("fullmap", probe.stages, probe.nodes)
    first = eval_seed(seed, runs)
    got = {"model": evaluate(ModelScalerPolicy, "fullmap", params, runs, steps, first=first),
           "fixed": evaluate(lambda: nothing_policy, "swarm", params, runs, steps,
                             FIXED_REPLICAS, first=first),
           "nothing": evaluate(lambda: nothing_policy, "swarm", params, runs, steps,
                               first=first),
           "random": evaluate(lambda: random_policy(space, seed), "fullmap", params, runs,
                              steps, first=first)}
    return [Judged.of(name, constraint, seed, traces) for name, traces in got.items()]


def _judged_agent(job: tuple[str, str, int, int, int, int, Path | None]) -> Judged:
    return judged_agent(*job)


def store_key(policy: str, constraint: str, seed: int, episodes: int | None, runs: int,
              steps: int) -> str:
    """A judged policy's name in the store (episodes None: it does not learn)."""
    trained = "" if episodes is None else f" episodes={episodes}"
    return f"{constraint} {policy} seed={seed}{trained} runs={runs} steps={steps}"


def judge_all(episodes: int, runs: int, steps: int, seeds: Sequence[int], jobs: int,
              weights: Path | None, store: Path | None = None) -> list[Judged]:
    """Every policy at every constraint and seed; the agents' trainings `jobs` at a time.
    Each judged policy is kept in `store` (JSON) as it is done, and one found there is not
    run again, so a stopped run resumes."""
    kept: dict[str, dict[str, Any]] = json.loads(store.read_text()) \
        if store is not None and store.exists() else {}

    def keep(key: str, j: Judged) -> Judged:
        kept[key] = j.record()  # type: ignore[assignment]
        if store is not None:
            store.write_text(json.dumps(kept))
        return j

    out = []
    for seed in seeds:
        for constraint in CONSTRAINTS:
            keys = [store_key(n, constraint, seed, None, runs, steps) for n in BASELINES]
            if all(k in kept for k in keys):
                out += [Judged.from_record(kept[k]) for k in keys]
            else:
                out += [keep(k, j) for k, j in zip(
                    keys, judged_baselines(constraint, runs, steps, seed), strict=True)]
    todo = []
    for seed in seeds:
        for constraint in CONSTRAINTS:
            for scheduler in LEARNT:
                key = store_key(scheduler, constraint, seed, episodes, runs, steps)
                if key in kept:
                    out.append(Judged.from_record(kept[key]))
                else:
                    todo.append((scheduler, constraint, episodes, runs, steps, seed, weights))

    def trained(done: Iterable[Judged]) -> None:
        for j in done:
            print(f"  {j.constraint} seed {j.seed} {j.policy}: violations "
                  f"{j.figures()['violations']:.1f} ({j.training.minutes if j.training else 0:.1f}"
                  " min)", flush=True)
            out.append(keep(store_key(j.policy, j.constraint, j.seed, episodes, runs, steps),
                            j))

    if jobs > 1 and len(todo) > 1:
        with ProcessPoolExecutor(jobs) as pool:
            trained(pool.map(_judged_agent, todo))
    else:
        trained(map(_judged_agent, todo))
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": float(np.median(values)), "min": float(np.min(values)),
            "max": float(np.max(values))}


def ranking(per_seed: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, int]]:
    """Per learnt scheduler, over the seeds (each seed's policies judged on the same runs):
    how often it had the fewest violations of the four (ties by reward), the most, and
    fewer than the model-based scaler and than Swarm's default."""
    seeds = len(per_seed["model"])
    out = {s: {"best": 0, "worst": 0, "beats_model": 0, "beats_fixed": 0} for s in LEARNT}
    for i in range(seeds):
        order = {s: (per_seed[s][i]["violations"], -per_seed[s][i]["reward"])
                 for s in LEARNT}
        for s, at in order.items():  # a tie counts for each tied scheduler
            out[s]["best"] += at == min(order.values())
            out[s]["worst"] += at == max(order.values())
        for s in LEARNT:
            mine = per_seed[s][i]["violations"]
            out[s]["beats_model"] += mine < per_seed["model"][i]["violations"]
            out[s]["beats_fixed"] += mine < per_seed["fixed"][i]["violations"]
    return out


def assemble(judged: Sequence[Judged], seeds: Sequence[int]) -> dict[str, dict[str, object]]:
    """Per constraint: per policy each seed's figures (`per_seed`, in `seeds`' order) and
    their median and range (`policies`), the learnt schedulers' ranking, their training
    (minutes per seed, the first seed's reward an episode), and the first seed's first
    evaluation run over time (`traces`)."""
    results: dict[str, dict[str, object]] = {}
    for constraint, target in CONSTRAINTS.items():
        mine = [j for j in judged if j.constraint == constraint]
        names = list(LEARNT) + list(BASELINES)
        by = {(j.policy, j.seed): j for j in mine}
        per_seed = {n: [by[n, s].figures() for s in seeds] for n in names}
        first = {n: by[n, seeds[0]] for n in names}
        trainings = {s: [t for seed in seeds if (t := by[s, seed].training) is not None]
                     for s in LEARNT}
        results[constraint] = {
            "target_s": target,
            "seeds": list(seeds),
            "policies": {n: {f: spread([x[f] for x in per_seed[n]]) for f in FIGURES}
                         for n in names},
            "ranking": ranking(per_seed),
            "per_seed": per_seed,
            "training": {s: {"episodes": trainings[s][0].episodes,
                             "minutes": [t.minutes for t in trainings[s]],
                             "episode_reward": trainings[s][0].episode_reward}
                         for s in LEARNT},
            "traces": {n: {"quotient": j.first.quotient,
                           "reward": [float(x) for x in np.cumsum(j.first.rewards)],
                           "replicas": j.first.replicas, "servers": j.first.servers}
                       for n, j in first.items()}}
    return results


def markdown(results: dict[str, dict[str, object]], runs: int, steps: int) -> str:
    """The tables: per constraint and policy the median [min-max] over the seeds of each
    figure, then the learnt schedulers' ranking seed by seed."""
    lines: list[str] = []
    for constraint, res in results.items():
        policies, rank = res["policies"], res["ranking"]
        assert isinstance(policies, dict) and isinstance(rank, dict)
        seeds = len(res["seeds"])  # type: ignore[arg-type]
        lines += [f"### {constraint} (Lt {res['target_s']} s), {seeds} seeds", "",
                  f"| policy | violations /{steps} | reward | replicas | nodes |",
                  "|---|---|---|---|---|"]
        for name, figures in policies.items():
            cells = [f"{f['median']:.{d}f} [{f['min']:.{d}f} to {f['max']:.{d}f}]"
                     for f, d in zip((figures[k] for k in FIGURES), (1, 0, 1, 2),
                                     strict=True)]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", "| scheduler | fewest violations of the four | most | fewer than "
                  "model | fewer than Swarm's default |", "|---|---|---|---|---|"]
        for name, r in rank.items():
            lines.append(f"| {name} | {r['best']}/{seeds} | {r['worst']}/{seeds} | "
                         f"{r['beats_model']}/{seeds} | {r['beats_fixed']}/{seeds} |")
        lines.append("")
    lines.append(f"Violations are the mean over {runs} evaluation runs of {steps} windows "
                 "(per seed), reward their mean cumulative Eq. 1; [min to max] over seeds.")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict[str, object]], path: Path) -> bool:
    """Per constraint: the QoS quotient and cumulative reward over the first seed's first
    evaluation run, each agent's reward an episode while it trained (first seed), and each
    policy's violations seed by seed with their median (False: matplotlib is not
    installed)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, len(results), figsize=(6 * len(results), 13), squeeze=False)
    for col, (constraint, res) in enumerate(results.items()):
        traces, training, per_seed = res["traces"], res["training"], res["per_seed"]
        assert isinstance(traces, dict) and isinstance(training, dict) \
            and isinstance(per_seed, dict)
        for scheduler, t in training.items():
            rewards = np.asarray(t["episode_reward"])
            width = max(1, len(rewards) // 30)
            smooth = np.convolve(rewards, np.ones(width) / width, mode="valid")
            axes[2][col].plot(smooth, label=scheduler, lw=0.8)
        axes[2][col].set_title("training: reward an episode (moving mean, first seed)")
        axes[2][col].set_xlabel(f"episode ({EPISODE_STEPS} windows)")
        for name, tr in traces.items():
            if name == "random":
                continue
            axes[0][col].plot(tr["quotient"], label=name, lw=0.8)
            axes[1][col].plot(tr["reward"], label=name, lw=0.8)
        axes[0][col].axhline(1.0, color="k", lw=0.5)
        axes[0][col].set_title(f"{constraint} (Lt {res['target_s']} s): QoS quotient La/Lt")
        axes[0][col].set_ylim(0, 2)
        axes[1][col].set_title("cumulative reward (Eq. 1)")
        axes[1][col].set_xlabel(f"evaluation window ({STEP_S:.0f} s)")
        names = [n for n in per_seed if n not in ("nothing", "random")]
        for x, name in enumerate(names):
            values = [f["violations"] for f in per_seed[name]]
            axes[3][col].plot([x] * len(values), values, "o", color="C0", alpha=0.5, ms=4)
            axes[3][col].plot([x - 0.3, x + 0.3], [np.median(values)] * 2, color="k")
        axes[3][col].set_xticks(range(len(names)), names, fontsize=8)
        axes[3][col].set_title(f"violations (of {EVAL_STEPS}) per seed, and median")
        axes[3][col].set_ylim(bottom=0)
    axes[0][0].legend(fontsize=7)
    axes[2][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.cluster.darly", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few episodes and short runs")
    p.add_argument("--episodes", type=int, default=EPISODES)
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS),
                   help=f"training seeds (below {EVAL_SEED}), one evaluation each")
    p.add_argument("--jobs", type=int, default=1, help="trainings at a time")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--weights", type=Path, default=None, metavar="DIR",
                   help="save each trained agent there (dqoes-manager --weights takes one "
                        "as DIR/darly-PIPELINE.npz for a pipeline of 5 stages on 4 nodes)")
    args = p.parse_args(argv)
    if not args.seeds or min(args.seeds) < 0 or max(args.seeds) >= EVAL_SEED \
            or len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds: distinct seeds from 0 to {EVAL_SEED - 1}")
    episodes, runs, steps = (5, 1, 20) if args.quick else (args.episodes, EVAL_RUNS,
                                                            EVAL_STEPS)
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    judged = judge_all(episodes, runs, steps, args.seeds, max(1, args.jobs), args.weights,
                       args.out / "fig5-runs.json")
    results = assemble(judged, args.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "darly.json").write_text(json.dumps(results, indent=1))
    table = markdown(results, runs, steps)
    (args.out / "darly.md").write_text(table)
    plotted = plot(results, args.out / "darly.png")
    print(table)
    for constraint, res in results.items():
        training = res["training"]
        assert isinstance(training, dict)
        print(f"{constraint} training ({episodes} episodes), minutes per seed: " + ", ".join(
            f"{s} {min(t['minutes']):.1f}-{max(t['minutes']):.1f}"
            for s, t in training.items()))
    print(f"{(time.monotonic() - started) / 60.0:.1f} minutes in all; results in {args.out}"
          + ("" if plotted else " (no plot: matplotlib missing)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

