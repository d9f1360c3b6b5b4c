"""The manager's work as the Swarm grows, counted in operations (never timed): Swarm's task
list is read and parsed only when something may have changed it, a tick remakes only the
tasks of the nodes that reported, and a report's work does not grow with the number of
nodes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from dqoes_cg.cluster import manager as manager_module
from dqoes_cg.cluster import swarmapi
from dqoes_cg.cluster.manager import Manager
from dqoes_cg.cluster.protocol import ContainerReport, Report
from tests.fakeswarm import StubEngine, node_doc, service_doc, task_doc
from tests.operations import operations

SERVICES = 4  # a task of each on every node


def node_id(i: int) -> str:
    return f"n{i:024d}"


def container_id(node: int, service: int) -> str:
    return f"{node:032x}{service:032x}"


class CountingEngine(StubEngine):
    """The stub engine, counting the GETs of each path."""

    def __init__(self, docs: dict[str, Any]) -> None:
        super().__init__(docs)
        self.gets: Counter[str] = Counter()

    def call(self, method: str, path: str, query: dict[str, str] | None = None,
             body: Any = None, missing_ok: tuple[int, ...] = ()) -> Any:
        if method == "GET":
            self.gets[path] += 1
        return super().call(method, path, query, body, missing_ok)


def swarm(nodes: int) -> CountingEngine:
    """A Swarm of `nodes` workers and SERVICES services of ours, a task of each on every
    node; every object versioned, as Docker's Engine API gives them."""
    return CountingEngine({
        "/nodes": [node_doc(node_id(i), f"node{i:04d}") for i in range(nodes)],
        "/services": [service_doc(f"v{j:024d}", f"svc{j}", {"dqoes.target": "2s"},
                                  replicas=nodes) for j in range(SERVICES)],
        "/tasks": [{**task_doc(f"t{i:012d}{j:012d}", f"v{j:024d}", node_id(i),
                               container_id(i, j), slot=i + 1), "Version": {"Index": 1}}
                   for i in range(nodes) for j in range(SERVICES)]})


def report(node: int, seq: int = 1, unknown: str | None = None) -> Report:
    ids = [container_id(node, j) for j in range(SERVICES)] + ([unknown] if unknown else [])
    return Report(seq, 4.0, 1.0, True, True, None, tuple(
        ContainerReport(cid, "S", 2.0, "p95", 1.8, 0.3, 0.25, 12) for cid in ids))


def test_a_settled_swarm_s_task_list_is_read_again_only_when_something_may_have_changed_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = swarm(3)
    manager = Manager(engine, "m" * 25)
    now = 100.0
    manager.tick(now)
    assert engine.gets["/tasks"] == 1
    for k in range(1, 4):  # settled: nodes and services listed, their tasks not
        manager.tick(now + k)
    assert (engine.gets["/nodes"], engine.gets["/tasks"]) == (4, 1)

    # A node reports a container Swarm's last list lacks: the next tick reads it again.
    engine.docs["/tasks"].append({**task_doc("t-new", "v" + "0" * 24, node_id(0), "c-new",
                                             slot=9), "Version": {"Index": 1}})
    manager.receive(node_id(0), report(0, unknown="c-new"), now + 4)
    view = manager.tick(now + 4)
    assert engine.gets["/tasks"] == 2
    assert "t-new" in {t.id for t in view.tasks}
    assert manager.receive(node_id(0), report(0, 2, "c-new"), now + 4.5).refused == ()

    # A service that changed (its version moved): read again, and while it converges (it
    # runs another number of tasks than it asks for), every tick.
    engine.docs["/services"][0]["Spec"]["Mode"]["Replicated"]["Replicas"] = 5
    manager.tick(now + 5)
    manager.tick(now + 6)
    assert engine.gets["/tasks"] == 4
    engine.docs["/services"][0]["Spec"]["Mode"]["Replicated"]["Replicas"] = 4
    manager.tick(now + 7)
    manager.tick(now + 8)
    assert engine.gets["/tasks"] == 5

    # And at least every TASKS_REFRESH_S: a task may change with nothing else.
    manager.tick(now + 7 + swarmapi.TASKS_REFRESH_S)
    assert engine.gets["/tasks"] == 6

    # An object whose version did not move is not parsed again.
    parsed = Counter[str]()
    parse = swarmapi.parse_task
    monkeypatch.setattr(swarmapi, "parse_task",
                        lambda doc: (parsed.update([doc["ID"]]), parse(doc))[1])
    engine.docs["/tasks"][0]["Status"]["State"] = "failed"
    manager.tick(now + 8 + 2 * swarmapi.TASKS_REFRESH_S)
    assert parsed == Counter([engine.docs["/tasks"][0]["ID"]])


def test_an_unversioned_swarm_is_read_every_tick() -> None:
    engine = swarm(2)
    for doc in engine.docs["/tasks"]:
        del doc["Version"]
    manager = Manager(engine, "m" * 25)
    for k in range(3):
        manager.tick(100.0 + k)
    assert engine.gets["/tasks"] == 3


def tick_and_report_work(nodes: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """At `nodes` nodes, all reported once and viewed: (operations of one more report,
    task views a tick makes after one node reported)."""
    manager = Manager(swarm(nodes), "m" * 25)
    now = 100.0
    manager.tick(now)
    for i in range(nodes):
        manager.receive(node_id(i), report(i), now)
    manager.tick(now + 0.5)
    work = operations(lambda: manager.receive(node_id(0), report(0, 2), now + 1))

    made = 0
    task_view = manager_module._task_view

    def counting(*args: Any) -> Any:
        nonlocal made
        made += 1
        return task_view(*args)

    monkeypatch.setattr(manager_module, "_task_view", counting)
    manager.tick(now + 1)
    return work, made


def test_a_report_s_work_and_a_tick_s_tasks_do_not_grow_with_the_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    small, small_made = tick_and_report_work(4, monkeypatch)
    large, large_made = tick_and_report_work(64, monkeypatch)
    assert small == large  # a report: the same operations at 4 nodes as at 64
    assert small_made == large_made == SERVICES  # only the reporting node's tasks remade
