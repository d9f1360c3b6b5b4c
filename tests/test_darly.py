"""Darly's learned scheduler (issue 35), on the host: the agent's network and learning
(dqoes_cg/cluster/darly.py) on a toy problem whose best actions are known, its weights saved
and loaded (checked), Eq. 1 and the state's bounds, and in the pipeline simulator
(bench/cluster/pipeline_env.py) a briefly trained agent beating random and do-nothing
agents; the Fig. 5 bench's smoke test (python -m bench.cluster.darly --quick) over two seeds
and its ranking of the schedulers seed by seed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.cluster.darly import (
    agent_policy,
    env_params,
    eval_seed,
    evaluate,
    main,
    nothing_policy,
    random_policy,
    ranking,
    summary,
    train,
)
from bench.cluster.pipeline_env import PipelineEnv
from dqoes_cg.cluster.darly import (
    K1,
    K2,
    QUOTIENT_CAP,
    Action,
    ActionSpace,
    Agent,
    AgentParams,
    feature_count,
    features,
    reward,
)

CONTEXTS, ACTIONS = 3, 4
QUICK = AgentParams(hidden=(16,), learning_rate=5e-3, batch=16, replay=2000, learn_start=50,
                    target_sync=50, epsilon_steps=1000)


def bandit_agent(seed: int, steps: int = 1500) -> Agent:
    """An agent taught a contextual bandit: in context c, action c pays 1, the rest 0."""
    agent = Agent(CONTEXTS, ACTIONS, QUICK, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        context = int(rng.integers(CONTEXTS))
        state = np.eye(CONTEXTS)[context]
        action = agent.act(state)
        agent.remember(state, action, 10.0 * (action == context), state, True)
        agent.learn()
    return agent


def test_the_agent_learns_the_best_action_of_each_context() -> None:
    agent = bandit_agent(seed=1)
    for context in range(CONTEXTS):
        assert agent.act(np.eye(CONTEXTS)[context], explore=False) == context


def test_the_agent_is_deterministic_given_its_seed() -> None:
    one, two = bandit_agent(seed=3, steps=300), bandit_agent(seed=3, steps=300)
    for a, b in zip(one.online.params, two.online.params, strict=True):
        assert np.array_equal(a, b)


def test_weights_are_saved_loaded_and_checked(tmp_path: Path) -> None:
    trained = bandit_agent(seed=2, steps=600)
    path = tmp_path / "agent.npz"
    trained.save(path)
    fresh = Agent(CONTEXTS, ACTIONS, QUICK, seed=9)
    fresh.load(path)
    state = np.eye(CONTEXTS)[1]
    assert np.array_equal(fresh.q_values(state), trained.q_values(state))
    with pytest.raises(ValueError, match="another network"):
        Agent(CONTEXTS + 1, ACTIONS, QUICK).load(path)
    bad = [p.copy() for p in trained.online.params]
    bad[0][0, 0] = math.nan
    with open(tmp_path / "nan.npz", "wb") as f:
        np.savez(f, sizes=np.asarray(trained.online.sizes), **{f"p{i}": p
                                                               for i, p in enumerate(bad)})
    with pytest.raises(ValueError, match="finite"):
        fresh.load(tmp_path / "nan.npz")
    with open(tmp_path / "pickled.npz", "wb") as f:  # an object array needs pickle
        np.savez(f, sizes=np.asarray([object()], dtype=object))
    with pytest.raises(ValueError):
        fresh.load(tmp_path / "pickled.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a saved agent"):
        fresh.load(tmp_path / "junk.npz")
    assert np.array_equal(fresh.q_values(state), trained.q_values(state))  # untouched


def test_eq1_prefers_fewer_nodes_and_replicas_under_the_constraint() -> None:
    assert reward(0.5, 1.0, servers=2, replicas=5, nodes=4, stages=5) == pytest.approx(
        4 / 2 + 5 / 5 + 0.5 * K1)
    assert reward(0.5, 1.0, 1, 5, 4, 5) > reward(0.5, 1.0, 2, 5, 4, 5) \
        > reward(0.5, 1.0, 2, 6, 4, 5)
    assert reward(1.5, 1.0, 1, 5, 4, 5) < 0 < reward(1.0, 1.0, 4, 30, 4, 5)
    assert reward(math.inf, 1.0, 1, 5, 4, 5) == -K2


def test_the_state_is_bounded_and_the_actions_decode() -> None:
    env = PipelineEnv(env_params("strict"), seed=4)
    obs = env.reset()
    state = features(obs)
    assert state.shape == (feature_count(env.stages, env.nodes),)
    assert np.all(np.isfinite(state)) and np.all(state >= 0) and np.all(state <= QUOTIENT_CAP)
    sizes = {s: ActionSpace(s, 5, 4).size for s in ("fullmap", "custom", "swarm", "profile")}
    assert sizes == {"fullmap": 31, "custom": 21, "swarm": 16, "profile": 16}
    space = ActionSpace("fullmap", 5, 4)
    assert space.decode(0) == Action("none")
    assert space.decode(1) == Action("out", 0)
    assert space.decode(8) == Action("in", 1)
    assert space.decode(9 + 3) == Action("move", 1, 3)
    assert ActionSpace("swarm", 5, 4).decode(3) == Action("move", 0, None)
    with pytest.raises(ValueError):
        space.decode(31)


def test_a_trained_agent_beats_random_and_doing_nothing() -> None:
    params = env_params("strict")
    agent, totals = train("custom", params, episodes=100, steps=40, seed=0)
    assert np.mean(totals[-30:]) > np.mean(totals[:30])  # it learnt something
    space = ActionSpace("custom", 5, 4)
    learnt = summary(evaluate(lambda: agent_policy(agent, space), "custom", params, 3, 100))
    rand = summary(evaluate(lambda: random_policy(space), "custom", params, 3, 100))
    idle = summary(evaluate(lambda: nothing_policy, "custom", params, 3, 100))
    # seeds 0, 1, 2: rewards -488, -455, -517 against -1000 random, -1646 idle; violations
    # 40, 37, 44 of 300 against 74 and 99
    assert learnt["reward"] > rand["reward"] + 200 and learnt["reward"] > idle["reward"] + 200
    assert learnt["violations"] < min(rand["violations"], idle["violations"])


def test_the_fig5_bench_runs_quick(tmp_path: Path) -> None:
    assert main(["--quick", "--seeds", "0", "1", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "darly.json").read_text())
    assert set(results) == {"loose", "strict"}
    names = {"fullmap", "custom", "swarm", "profile", "model", "fixed", "nothing", "random"}
    for res in results.values():
        assert res["seeds"] == [0, 1]
        assert set(res["policies"]) == names and set(res["per_seed"]) == names
        for name, figures in res["policies"].items():
            assert {"violations", "reward", "replicas", "nodes"} <= set(figures)
            seeds = [f["violations"] for f in res["per_seed"][name]]
            assert len(seeds) == 2
            assert figures["violations"] == {"median": float(np.median(seeds)),
                                             "min": min(seeds), "max": max(seeds)}
        assert set(res["ranking"]) == {"fullmap", "custom", "swarm", "profile"}
        assert all(len(t["minutes"]) == 2 for t in res["training"].values())
    assert "| custom |" in (tmp_path / "darly.md").read_text()
    store = json.loads((tmp_path / "fig5-runs.json").read_text())
    assert len(store) == 2 * 2 * 8  # seeds x constraints x policies, each kept once done


def test_the_fig5_bench_resumes_from_its_store(tmp_path: Path) -> None:
    assert main(["--quick", "--seeds", "3", "--out", str(tmp_path)]) == 0
    first = json.loads((tmp_path / "darly.json").read_text())
    assert main(["--quick", "--seeds", "3", "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "darly.json").read_text())
    # nothing trained again: the same training minutes, as measured the first time
    assert again["loose"]["training"] == first["loose"]["training"]
    assert again["strict"]["per_seed"] == first["strict"]["per_seed"]


def test_each_seed_judges_on_its_own_held_out_runs() -> None:
    assert eval_seed(0, 5) == 1000  # seed 0's runs are the single-seed bench's
    assert eval_seed(1, 5) == 1005 and eval_seed(2, 5) == 1010


def test_the_ranking_counts_each_seed_and_ties() -> None:
    def seed(violations: float, reward: float = 0.0) -> dict[str, float]:
        return {"violations": violations, "reward": reward}

    per_seed = {"fullmap": [seed(30), seed(10)], "custom": [seed(20), seed(10)],
                "swarm": [seed(40), seed(50)], "profile": [seed(20, 5.0), seed(12)],
                "model": [seed(25), seed(60)], "fixed": [seed(21), seed(5)]}
    got = ranking(per_seed)
    assert got["profile"] == {"best": 1, "worst": 0, "beats_model": 2, "beats_fixed": 1}
    assert got["custom"] == {"best": 1, "worst": 0, "beats_model": 2, "beats_fixed": 1}
    assert got["fullmap"]["best"] == 1  # tied with custom in the second seed
    assert got["swarm"] == {"best": 0, "worst": 2, "beats_model": 1, "beats_fixed": 0}
