"""Issue 34 at a larger scale in the simulator (python -m bench.cluster.pipelines_at_scale
--quick): three pipelines sharing eight nodes, the model-based scaler against the least
over-provisioned fixed deployment that holds and Swarm's default, reported; the shared
nodes' CPU and Swarm's spread counting every pipeline's replicas."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.cluster.pipelines_at_scale import POLICIES, cluster, main


def test_the_bench_runs_quick_and_the_scaler_holds_with_fewer_replicas(tmp_path: Path
                                                                       ) -> None:
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "pipelines-at-scale.json").read_text())
    policies = results["policies"]
    assert set(policies) == set(POLICIES) and results["seeds"] == [0, 1]
    for p in results["pipelines"]:
        held = {n: policies[n]["pipelines"][p["name"]]["held"]["median"] for n in POLICIES}
        assert held["scaler"] > held["swarm"], p["name"]
        assert held["fixed"] >= 0.9, "the fixed deployment found holds"
    spent = {n: policies[n]["all"]["replica_seconds"]["median"] for n in POLICIES}
    assert spent["scaler"] < spent["fixed"]
    assert "python3 -m bench.cluster.pipelines_at_scale --quick" in \
        (tmp_path / "pipelines-at-scale.md").read_text()
    assert (tmp_path / "pipelines-at-scale.png").stat().st_size > 0


def test_pipelines_on_the_same_nodes_share_their_cpu_and_swarms_spread() -> None:
    envs = cluster(0)
    for env in envs:
        env.deploy()
        env.rate = 5.0
        env.level = np.zeros(env.nodes)
    tasks = envs[0].tasks()
    assert tasks.sum() == sum(env.stages for env in envs)
    assert tasks.max() - tasks.min() <= 1, "spread over every pipeline's tasks"
    video = envs[0]
    own = video._demand().sum(axis=0)
    assert np.all(video._node_demand() >= own) and video._node_demand().sum() > own.sum()
