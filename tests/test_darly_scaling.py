"""Darly's agent in the manager (dqoes_cg/cluster/darly_scaling.py, `dqoes-manager
--scheduler`), on the host: its actions go through the scaler's limits (the cap a minute,
the hold, never below one replica, an operator's paused node untouched, nothing while Swarm
updates a stage), an action that made things worse is undone, and its weights are saved and
loaded with the manager's state.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from dqoes_cg.cluster.darly import ActionSpace
from dqoes_cg.cluster.darly_scaling import DarlyParams, DarlyScaling
from dqoes_cg.cluster.view import (
    ClusterView,
    NodeView,
    PipelineView,
    ServiceView,
    StageView,
    TaskView,
)

NODES = ("n1", "n2", "n3")
STAGES = (("s1", "front", "n1"), ("s2", "back", "n2"))  # service ID, name, its node


class Recorder:
    """A view.Actions that keeps what it is asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []

    def move_away(self, service_id: str, node_id: str, why: str = "") -> None:
        self.asked.append(("move_away", service_id, node_id))

    def prefer(self, service_id: str, node_ids: object) -> None:
        self.asked.append(("prefer", service_id, *sorted(node_ids)))  # type: ignore[call-overload]

    def release(self, service_id: str) -> None:
        self.asked.append(("release", service_id))

    def scale(self, service_id: str, replicas: int, why: str = "") -> None:
        self.asked.append(("scale", service_id, str(replicas)))

    def close_node(self, node_id: str, why: str = "full") -> None:
        raise AssertionError("a scheduler closes no node")

    def open_node(self, node_id: str, why: str = "") -> None:
        raise AssertionError("a scheduler opens no node")


def view(latency: float = 0.5, replicas: int = 1, paused: str = "",
         updating: bool = False) -> ClusterView:
    """A pipeline of two stages, each with `replicas` tasks on its node, target 1 s."""
    nodes = [NodeView(n, n, "worker", "ready", "pause" if n == paused else "active", True,
                      None, 2.0, 0.5, 1.5, cpu_pressure=0.1 * i)
             for i, n in enumerate(NODES)]
    services = [ServiceView(sid, name, "replicated", replicas, replicas, None, None, None,
                            updating, True) for sid, name, _ in STAGES]
    tasks = [TaskView(f"{sid}.{k}", sid, name, k, node, node, f"c{sid}{k}", "running", "S",
                      0.5, "mean", latency / 2, None, 0.3, 10, rate_hz=5.0, mean_s=latency / 2,
                      throttled=0.1)
             for sid, name, node in STAGES for k in range(replicas)]
    stages = tuple(StageView(sid, name, (), 0.5, replicas, (node,), ("S",) * replicas,
                             latency / 2, 0.05, 5.0, replicas) for sid, name, node in STAGES)
    pipeline = PipelineView("video", 1.0, "mean", latency, latency, latency, True, stages)
    return ClusterView(0.0, "n1", None, nodes, services, tasks, pipelines=(pipeline,))


def scheduler(action: int, name: str = "fullmap", **params: object) -> DarlyScaling:
    """A scheduler whose agent always takes `action` (of its action space's numbering)."""
    darly = DarlyScaling(DarlyParams(scheduler=name, **params))  # type: ignore[arg-type]
    mine = darly._agent(view().pipelines[0], NODES)
    mine.agent.act = lambda state, explore=False: action  # type: ignore[method-assign]
    return darly


SPACE = ActionSpace("fullmap", 2, 3)  # 0 none; 1 out front, 2 in front, 3-5 move front


def test_a_scale_out_then_nothing_within_the_hold_and_the_cap() -> None:
    darly = scheduler(1, max_actions_per_minute=1)
    actions = Recorder()
    darly.tick(view(), 0.0, actions)
    assert actions.asked == [("scale", "s1", "2")]
    later = Recorder()
    darly.tick(view(replicas=2), 15.0, later)  # within the hold: waits to judge it
    assert later.asked == []
    darly.tick(view(replicas=2), 45.0, later)  # judged (better): acts again, capped
    assert later.asked == []
    darly.tick(view(replicas=2), 70.0, later)
    assert later.asked == [("scale", "s1", "3")]


def test_never_below_one_replica_nor_while_swarm_updates() -> None:
    actions = Recorder()
    scheduler(2).tick(view(replicas=1), 0.0, actions)
    assert actions.asked == []
    scheduler(1).tick(view(updating=True), 0.0, actions)
    assert actions.asked == []


def test_a_move_goes_where_the_agent_says_unless_a_node_is_paused() -> None:
    assert SPACE.decode(5).kind == "move" and SPACE.decode(5).destination == 2
    actions = Recorder()
    scheduler(5).tick(view(), 0.0, actions)
    assert actions.asked == [("prefer", "s1", "n3"), ("move_away", "s1", "n1")]
    for paused in ("n1", "n3"):  # its source, its destination
        actions = Recorder()
        scheduler(5).tick(view(paused=paused), 0.0, actions)
        assert actions.asked == []


def test_swarm_leaves_the_destination_to_swarm() -> None:
    actions = Recorder()
    scheduler(3, name="swarm").tick(view(), 0.0, actions)
    assert actions.asked == [("move_away", "s1", "n1")]


def test_an_action_that_made_things_worse_is_undone() -> None:
    darly = scheduler(2)
    actions = Recorder()
    darly.tick(view(latency=0.5, replicas=2), 0.0, actions)
    assert actions.asked == [("scale", "s1", "1")]
    actions = Recorder()
    darly.tick(view(latency=1.4, replicas=1), 40.0, actions)
    assert actions.asked == [("scale", "s1", "2")]


def test_weights_are_saved_and_loaded_with_the_managers_state(tmp_path: Path) -> None:
    darly = scheduler(0, weights_dir=tmp_path, save_s=0.0)
    darly.tick(view(), 0.0, Recorder())
    saved = tmp_path / "darly-video.npz"
    assert saved.exists()
    again = DarlyScaling(DarlyParams(scheduler="fullmap", weights_dir=tmp_path, seed=7))
    mine = again._agent(view().pipelines[0], NODES)
    state = np.ones(mine.agent.inputs)
    assert np.array_equal(mine.agent.q_values(state),
                          darly.pipelines["video"].agent.q_values(state))
    saved.write_bytes(b"junk")
    fresh = DarlyScaling(DarlyParams(scheduler="fullmap", weights_dir=tmp_path))
    fresh.tick(view(), 0.0, Recorder())  # starts afresh, no crash
    assert "video" in fresh.pipelines


def test_an_unmeasured_pipeline_is_left_alone() -> None:
    unmeasured = view()
    pipeline = replace(unmeasured.pipelines[0], measured_s=None)
    actions = Recorder()
    scheduler(1).tick(replace(unmeasured, pipelines=(pipeline,)), 0.0, actions)
    assert actions.asked == []
