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

    python3 -m bench.cluster.darly [--quick] [--episodes N] [--out DIR] [--weights DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

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
from dqoes_cg.cluster.scaler import PipelineLoad, Scaler, ScalerParams, StageLoad
from dqoes_cg.cluster.split import split

from .pipeline_env import STAGES, STEP_S, EnvParams, PipelineEnv

# The constraints, as the paper's 35 s and 26 s (a ratio of 1.35): the strict one is about
# the pipeline's latency at the mean rate on idle nodes with two replicas of its two busiest
# stages (0.42 s), the fixed deployment's at the top rate (0.40 s), with a little to spare.
CONSTRAINTS = {"loose": 0.675, "strict": 0.5}
EPISODE_STEPS = 50
EPISODES = 1500
EVAL_RUNS = 5
EVAL_STEPS = 200
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


class ModelScalerPolicy:
    """The model-based scaler of the pipelines issue, fed what the env's nodes would
    report: each stage's work, rate, share of Lt (split.py), the CPU its replicas have."""

    def __init__(self, params: ScalerParams | None = None) -> None:
        self.scaler = Scaler(params or ScalerParams(interval_s=STEP_S, hold_s=2 * STEP_S))

    def __call__(self, env: PipelineEnv, now: float) -> Action:
        p = env.params
        replicas = [int(env.placement[s].sum()) for s in range(env.stages)]
        shares = split(p.target_s, [list(path) for path in p.paths], list(p.work_s),
                       [env.rate] * env.stages, replicas)
        stages = tuple(
            StageLoad(str(s), STAGES[s], replicas[s], p.work_s[s], env.rate,
                      shares.stage_s[s], {str(n): c for n, c in env.replica_cpus(s).items()},
                      {str(n): c for n, c in env.room_cpus(s).items()})
            for s in range(env.stages))
        plan = self.scaler.plan(now, [PipelineLoad("video", stages, shares.feasible)])
        for d in plan.decisions:  # the env carries out one action a window
            s = int(d.service_id)
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
             replicas: Sequence[int] | None = None) -> list[Trace]:
    """`runs` runs of a fresh policy on the evaluation seeds (1000 + run)."""
    return [run(PipelineEnv(params, seed=1000 + i), policy_for(), scheduler, steps, replicas)
            for i in range(runs)]


def summary(traces: Sequence[Trace]) -> dict[str, float]:
    each = [t.figures() for t in traces]
    return {k: float(np.mean([f[k] for f in each])) for k in each[0]}


def experiment(constraint: str, episodes: int, runs: int, steps: int, seed: int = 0,
               weights: Path | None = None) -> dict[str, object]:
    """Each scheduler trained and judged, and the other policies judged, at `constraint`
    (each agent's weights saved in `weights` as darly-SCHEDULER-CONSTRAINT.npz)."""
    params = env_params(constraint)
    env = PipelineEnv(params)
    out: dict[str, object] = {"target_s": params.target_s}
    traces: dict[str, list[Trace]] = {}
    training: dict[str, dict[str, object]] = {}
    for scheduler in SCHEDULERS:
        started = time.monotonic()
        agent, totals = train(scheduler, params, episodes, seed=seed)
        training[scheduler] = {"episodes": episodes, "steps": episodes * EPISODE_STEPS,
                               "minutes": (time.monotonic() - started) / 60.0,
                               "episode_reward": totals}
        if weights is not None:
            weights.mkdir(parents=True, exist_ok=True)
            agent.save(weights / f"darly-{scheduler}-{constraint}.npz")
        space = ActionSpace(scheduler, env.stages, env.nodes)
        traces[scheduler] = evaluate(lambda a=agent, s=space: agent_policy(a, s),
                                     scheduler, params, runs, steps)
    space = ActionSpace("fullmap", env.stages, env.nodes)
    traces["model"] = evaluate(ModelScalerPolicy, "fullmap", params, runs, steps)
    traces["fixed"] = evaluate(lambda: nothing_policy, "swarm", params, runs, steps,
                               FIXED_REPLICAS)
    traces["nothing"] = evaluate(lambda: nothing_policy, "swarm", params, runs, steps)
    traces["random"] = evaluate(lambda: random_policy(space), "fullmap", params, runs, steps)
    out["training"] = training
    out["policies"] = {name: summary(t) for name, t in traces.items()}
    out["traces"] = {name: {"quotient": [min(q, 4.0) for q in t[0].quotient],
                            "reward": list(np.cumsum(t[0].rewards)),
                            "replicas": t[0].replicas, "servers": t[0].servers}
                     for name, t in traces.items()}
    return out


def plot(results: dict[str, dict[str, object]], path: Path) -> bool:
    """Per constraint: the QoS quotient and cumulative reward over the first evaluation
    run, and each agent's reward an episode while it trained (False: matplotlib is not
    installed)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(results), figsize=(6 * len(results), 10), squeeze=False)
    for col, (constraint, res) in enumerate(results.items()):
        traces, training = res["traces"], res["training"]
        assert isinstance(traces, dict) and isinstance(training, dict)
        for scheduler, t in training.items():
            rewards = np.asarray(t["episode_reward"])
            width = max(1, len(rewards) // 30)
            smooth = np.convolve(rewards, np.ones(width) / width, mode="valid")
            axes[2][col].plot(smooth, label=scheduler, lw=0.8)
        axes[2][col].set_title("training: reward an episode (moving mean)")
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--weights", type=Path, default=None, metavar="DIR",
                   help="save each trained agent there (dqoes-manager --weights takes one "
                        "as DIR/darly-PIPELINE.npz for a pipeline of 5 stages on 4 nodes)")
    args = p.parse_args(argv)
    episodes, runs, steps = (5, 1, 20) if args.quick else (args.episodes, EVAL_RUNS,
                                                            EVAL_STEPS)
    results = {c: experiment(c, episodes, runs, steps, args.seed, args.weights)
               for c in CONSTRAINTS}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "darly.json").write_text(json.dumps(results, indent=1))
    plotted = plot(results, args.out / "darly.png")
    for constraint, res in results.items():
        print(f"{constraint} (Lt {res['target_s']} s):")
        policies = res["policies"]
        assert isinstance(policies, dict)
        for name, f in policies.items():
            print(f"  {name:8} violations {f['violations']:6.1f}/{f['windows']:.0f}  reward "
                  f"{f['reward']:8.1f}  replicas {f['replicas']:5.2f}  nodes {f['nodes']:4.2f}")
        training = res["training"]
        assert isinstance(training, dict)
        print("  training: " + ", ".join(f"{s} {t['minutes']:.1f} min"
                                         for s, t in training.items()))
    print(f"results in {args.out}" + ("" if plotted else " (no plot: matplotlib missing)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

