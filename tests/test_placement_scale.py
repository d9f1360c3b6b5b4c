"""Placement's and `cluster status`'s work as the cluster grows, counted in operations
(never timed): a placement tick with nothing new does the same work whatever the number of
unchanged tasks, one where a node changed does that node's work; the status is encoded once
per view, and then only the tasks of the nodes the manager made again."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from dqoes_cg.cluster import view_json
from dqoes_cg.cluster.manager import Manager
from dqoes_cg.cluster.placement import (
    ClusterView,
    NodeView,
    Placement,
    PlacementParams,
    ServiceView,
    TaskView,
)
from dqoes_cg.cluster.view_json import ViewJSON
from dqoes_cg.jsonline import decode, encode
from tests.operations import operations
from tests.test_cluster_scale import node_id, report, swarm

NODES = 8


def cluster(tasks_per_node: int, nodes: int = NODES) -> dict[str, list[TaskView]]:
    """Light tasks on every node (all admitted) but one crowded node ("hot": two of three
    fit, the third is stuck with nowhere to go: every node is as light and takes none of
    its size beside its own)."""
    groups = {f"n{i}": [TaskView(f"n{i}-t{j}", f"s{j}", f"n{i}", "S", 1.0, 2.0, 0.005)
                        for j in range(tasks_per_node)] for i in range(nodes)}
    groups["hot"] = [TaskView(f"hot-x{j}", f"x{j}", "hot", "S" if j < 2 else "B", 1.0, 2.0,
                              need / 2) for j, need in enumerate((0.4, 0.4, 0.45))]
    return groups


def view(now: float, groups: dict[str, Sequence[TaskView]]) -> ClusterView:
    """The view as the manager gives it: each node's tasks as one object, the same while
    they are not made again."""
    tasks = tuple(t for group in groups.values() for t in group)
    nodes = tuple(NodeView(name, 1.0 if name == "hot" else 4.0) for name in groups)
    services = tuple(ServiceView(s, 1, 1) for s in sorted({t.service for t in tasks}))
    return ClusterView(now, nodes, tasks, services, groups)


def settled(tasks_per_node: int, nodes: int = NODES
            ) -> tuple[Placement, dict[str, Sequence[TaskView]], float]:
    """A placement that has seen the cluster long enough for every smoothed need to settle
    and the stuck task to have been tried (the settle time passed)."""
    placement = Placement(PlacementParams(settle_s=30.0))
    groups: dict[str, Sequence[TaskView]] = dict(cluster(tasks_per_node, nodes))
    now = 0.0
    for _ in range(200):
        now += 1.0
        placement.plan(view(now, groups))
    assert placement.stuck_since.keys() == {"hot-x2"}
    return placement, groups, now


def quiet_work(tasks_per_node: int, nodes: int = NODES) -> int:
    placement, groups, now = settled(tasks_per_node, nodes)
    return tick_work(placement, view(now + 1.0, groups))


def tick_work(placement: Placement, cluster_view: ClusterView) -> int:
    return operations(lambda: placement.plan(cluster_view))


def test_a_tick_with_nothing_new_does_not_grow_with_the_unchanged_tasks() -> None:
    assert quiet_work(10) == quiet_work(100)


def test_a_tick_does_the_work_of_the_node_that_changed_not_of_the_others() -> None:
    def one_changed(tasks_per_node: int, nodes: int) -> int:
        placement, groups, now = settled(tasks_per_node, nodes)
        groups["n0"] = [replace(t, cls="G") for t in groups["n0"]]  # its report: all G
        return tick_work(placement, view(now + 1.0, groups))

    # Four times the nodes, each as large: the tick's work grows by what a quiet tick's
    # grows (a look at each node's view), not by their tasks.
    more_nodes = one_changed(100, 4 * NODES) - one_changed(100, NODES)
    assert more_nodes == quiet_work(100, 4 * NODES) - quiet_work(100, NODES)
    # and a larger node that changed costs in proportion to its tasks
    assert one_changed(100, NODES) - quiet_work(100) > 5 * (one_changed(10, NODES)
                                                            - quiet_work(10))


def test_a_node_s_tasks_again_as_a_new_but_equal_object_cost_a_comparison() -> None:
    placement, groups, now = settled(50)
    groups["n0"] = list(groups["n0"])  # reported again, nothing moved
    again = tick_work(placement, view(now + 1.0, groups))
    assert again - quiet_work(50) < 200  # a comparison of its tasks, no need made again


# --- the manager's status ----------------------------------------------------------------


def test_the_status_is_encoded_once_per_view_then_only_the_tasks_made_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    manager = Manager(swarm(10), "m" * 25)
    now = 100.0
    manager.tick(now)
    for i in range(10):
        manager.receive(node_id(i), report(i), now)
    first = manager.tick(now + 0.5)

    encoded = 0
    task_json = view_json.task_json

    def counting(t: Any) -> Any:
        nonlocal encoded
        encoded += 1
        return task_json(t)

    monkeypatch.setattr(view_json, "task_json", counting)
    statuses = ViewJSON()
    answer = statuses.of(first)
    assert encoded == len(first.tasks) == 40
    assert statuses.of(first) is answer and encoded == 40, "shared while the view is the last"
    assert json.loads(answer.text) == decode(encode(first.to_json()))  # as made whole

    manager.receive(node_id(3), report(3, 2), now + 1)  # one node reported
    second = manager.tick(now + 1)
    assert json.loads(statuses.of(second).text) == decode(encode(second.to_json()))
    assert encoded == 40 + 4, "only the tasks of the node that reported"
