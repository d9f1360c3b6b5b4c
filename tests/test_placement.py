"""The placement decision (dqoes_cg.cluster.placement) on hand-made cluster views: what a node
admits, when a stuck task moves and where, the hysteresis, the cap on moves, the services it
never touches, and when nodes close to new tasks and open again."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dqoes_cg.cluster.placement import (
    Availability,
    ClusterView,
    Load,
    NodeView,
    Placement,
    PlacementParams,
    ServiceView,
    TaskView,
    admitted,
    raw_need,
    room,
    takes,
)

PARAMS = PlacementParams(settle_s=30.0, hold_s=600.0, max_moves_per_minute=2,
                         smoothing=1.0)


def task(name: str, node: str, need: float, cls: str, service: str | None = None,
         ) -> TaskView:
    """A task whose work per request over its target is `need` CPUs: it uses half its
    need and runs at twice its target (the need does not depend on the share)."""
    return TaskView(id=f"{name}-task", service=service or name, node=node, cls=cls,
                    target_s=1.0, measured_s=2.0, usage_cores=need / 2)


def view(now: float, tasks: list[TaskView], nodes: dict[str, float] | None = None,
         **node_overrides: dict[str, object]) -> ClusterView:
    budgets = nodes or {"a": 1.0, "b": 1.0}
    node_views = tuple(NodeView(name, budget, **node_overrides.get(name, {}))
                       for name, budget in budgets.items())
    services = {t.service for t in tasks}
    return ClusterView(now, node_views, tuple(tasks), tuple(
        ServiceView(s, replicas=sum(t.service == s for t in tasks),
                    running=sum(t.service == s for t in tasks)) for s in sorted(services)))


def crowded(node: str = "a") -> list[TaskView]:
    """Node `node` (1 CPU): three tasks needing 0.4 CPU each; two fit, the third is B."""
    prefix = "" if node == "a" else node
    return [task(f"{prefix}x1", node, 0.4, "S"), task(f"{prefix}x2", node, 0.4, "S"),
            task(f"{prefix}x3", node, 0.45, "B")]


def settle(placement: Placement, tasks: list[TaskView], until: float, **kw: object,
           ) -> list:
    """Plans from t=0 every 5 s up to `until`; the moves made."""
    moves = []
    t = 0.0
    while t <= until:
        moves += placement.plan(view(t, tasks, **kw)).moves
        t += 5.0
    return moves


# --- what a node admits -----------------------------------------------------------------


def test_need_is_work_per_request_over_the_target() -> None:
    t = TaskView("t", "s", "a", "B", target_s=0.5, measured_s=1.5, usage_cores=0.2)
    assert raw_need(t) == pytest.approx(0.6)
    for missing in ({"measured_s": None}, {"usage_cores": 0.0}, {"target_s": math.nan}):
        assert raw_need(TaskView(**{**t.__dict__, **missing})) is None


def test_a_node_admits_the_cheapest_that_fit_over_the_floors() -> None:
    # 1 CPU, 4 loads: floor 0.125, 0.5 CPU over the floors to share.
    loads = [Load("a", 0.3, 1.0), Load("b", 0.2, 1.0), Load("c", 0.4, 1.0),
             Load("d", 0.125, 1.0)]
    # costs 0.175, 0.075, 0.275, 0: d, b, a fit (0.25), c would make 0.525.
    assert admitted(1.0, loads, 0.1) == {"d", "b", "a"}
    assert room(1.0, loads, 0.1) == pytest.approx(0.25)


def test_a_need_under_the_floor_is_admitted_and_frees_cpu_a_hopeless_one_never() -> None:
    # floor 0.125: the need of 0.1 costs -0.025, which lets both 0.3s in (0.35 of 0.5 over
    # the floors); one of 3 CPUs is out of reach.
    loads = [Load("loose", 0.1, 1.0), Load("hopeless", 3.0, 1.0), Load("ok", 0.3, 1.0),
             Load("x", 0.3, 1.0)]
    assert admitted(1.0, loads, 0.1) == {"loose", "ok", "x"}
    assert room(1.0, loads, 0.1) == pytest.approx(0.175)
    assert admitted(2.0, [Load("thread", 1.5, 1.0)], 0.1) == set()  # one thread: 1 CPU


def test_a_node_takes_a_newcomer_only_without_displacing_anyone() -> None:
    here = [Load("a", 0.4, 1.0), Load("b", 0.4, 1.0)]
    assert takes(1.0, here, Load("n", 0.15, 1.0), 0.1)
    assert not takes(1.0, here, Load("n", 0.3, 1.0), 0.1)  # would push one of them out
    assert not takes(1.0, here, Load("n", 0.15, 1.0), 0.1, margin=2.0)  # no margin left


# --- moves --------------------------------------------------------------------------------


def test_a_task_stuck_in_b_moves_to_a_node_that_admits_it_after_it_settles() -> None:
    placement = Placement(PARAMS)
    tasks = [*crowded(), task("y1", "b", 0.2, "S")]
    assert placement.plan(view(0.0, tasks)).moves == []
    assert placement.plan(view(25.0, tasks)).moves == []  # stuck for 25 s of 30
    (move,) = placement.plan(view(30.0, tasks)).moves
    assert (move.service, move.source, move.destination) == ("x3", "a", "b")
    assert move.need_cores == pytest.approx(0.45)
    assert placement.moves_made == 1


def test_no_move_when_the_task_leaves_b_or_its_node_could_satisfy_it() -> None:
    placement = Placement(PARAMS)
    tasks = [*crowded(), task("y1", "b", 0.2, "S")]
    placement.plan(view(0.0, tasks))
    tasks[2] = task("x3", "a", 0.45, "S")  # it got there after all: the clock restarts
    placement.plan(view(20.0, tasks))
    placement.plan(view(35.0, tasks))  # (once it has been out of it for half of 30 s)
    tasks[2] = task("x3", "a", 0.45, "B")
    assert placement.plan(view(40.0, tasks)).moves == []
    assert placement.plan(view(65.0, tasks)).moves == []
    assert len(placement.plan(view(70.0, tasks)).moves) == 1
    assert settle(Placement(PARAMS), [task("x1", "a", 0.3, "B"), task("x2", "a", 0.3, "S")],
                  200.0) == []  # B, but its node has room for it: its policy's to fix


def test_a_tick_out_of_b_does_not_restart_the_clock() -> None:
    # A window of a few requests put it in S for one tick (10 s of the 30 s it waits).
    placement = Placement(PARAMS)
    tasks = [*crowded(), task("y1", "b", 0.2, "S")]
    placement.plan(view(0.0, tasks))
    tasks[2] = task("x3", "a", 0.45, "S")
    placement.plan(view(10.0, tasks))
    tasks[2] = task("x3", "a", 0.45, "B")
    assert placement.plan(view(20.0, tasks)).moves == []
    (move,) = placement.plan(view(30.0, tasks)).moves
    assert move.service == "x3"


def test_no_move_where_nothing_would_be_gained() -> None:
    full_b = [task(f"y{i}", "b", 0.4, "S") for i in range(2)]
    assert settle(Placement(PARAMS), [*crowded(), *full_b], 200.0) == []
    # A need no single node can serve (1 CPU) stays where it is.
    hopeless = [task("h", "a", 1.6, "B"), task("x", "a", 0.3, "S")]
    placement = Placement(PARAMS)
    assert settle(placement, hopeless, 200.0) == []
    # and says why, once it has been stuck for the settle time
    assert placement.plan(view(205.0, hopeless)).unmoved == {"h-task": (
        "no node has room for its need with 10% to spare, or would hold more in S with it")}
    assert placement.need_of("h-task") == pytest.approx(1.6)


def test_the_destination_is_the_one_left_with_the_most_room() -> None:
    tasks = [*crowded(), task("y", "b", 0.3, "S"), task("z", "c", 0.1, "S")]
    (move,) = settle(Placement(PARAMS), tasks, 60.0, nodes={"a": 1.0, "b": 1.0, "c": 1.0})
    assert move.destination == "c"


def test_moves_are_capped_per_minute_and_a_moved_service_holds() -> None:
    # Four crowded nodes and four light ones: four candidates at once, two a minute.
    nodes = {**{f"a{i}": 1.0 for i in range(4)}, **{f"e{i}": 1.0 for i in range(4)}}
    tasks = [*(t for i in range(4) for t in crowded(f"a{i}")),
             *(task(f"y{i}", f"e{i}", 0.2, "S") for i in range(4))]
    placement = Placement(PARAMS)
    first = settle(placement, tasks, 30.0, nodes=nodes)
    assert len(first) == 2
    assert placement.plan(view(59.0, tasks, nodes)).moves == []
    later = placement.plan(view(90.0, tasks, nodes)).moves  # the minute is over
    assert len(later) == 2
    assert {m.service for m in later}.isdisjoint({m.service for m in first})
    # The moved ones still show on their old nodes (Swarm is slow, then gave up):
    # never moved again within hold_s.
    for t in (120.0, 300.0, 500.0):
        assert placement.plan(view(t, tasks, nodes)).moves == []
    assert len(placement.plan(view(630.0, tasks, nodes)).moves) == 2


def test_a_service_moved_once_holds_for_hold_s_even_when_stuck_again() -> None:
    placement = Placement(PARAMS)
    nodes = {"a": 1.0, "b": 1.0, "c": 1.0}
    tasks = [*crowded(), task("y1", "b", 0.2, "S"), task("z1", "c", 0.3, "S")]
    (move,) = settle(placement, tasks, 30.0, nodes=nodes)
    assert (move.service, move.destination) == ("x3", "b")
    # It landed on b, and b filled up behind it: stuck again, with room on c.
    moved = [*crowded()[:2], task("x3", "b", 0.45, "B"), task("y1", "b", 0.2, "S"),
             task("y2", "b", 0.4, "S"), task("z1", "c", 0.3, "S")]
    assert placement.plan(view(35.0, moved, nodes)).settled == ["x3"]
    for t in range(40, 630, 10):
        assert placement.plan(view(float(t), moved, nodes)).moves == [], t
    (again,) = placement.plan(view(630.0, moved, nodes)).moves
    assert (again.service, again.source, again.destination) == ("x3", "b", "c")


@pytest.mark.parametrize("service", [
    ServiceView("x3", replicas=None, running=1),  # global: one per node by definition
    ServiceView("x3", replicas=2, running=1),  # a task short already
    ServiceView("x3", replicas=1, running=1, updating=True),  # Swarm is rolling it
])
def test_services_it_never_moves(service: ServiceView) -> None:
    tasks = [*crowded(), task("y1", "b", 0.2, "S")]
    placement = Placement(PARAMS)
    for t in range(0, 100, 5):
        base = view(float(t), tasks)
        others = tuple(s for s in base.services if s.name != "x3")
        assert placement.plan(ClusterView(base.now, base.nodes, base.tasks,
                                          (*others, service))).moves == []


@pytest.mark.parametrize("state", [
    {"ready": False}, {"availability": Availability.PAUSE},
    {"availability": Availability.DRAIN},
    {"availability": Availability.PAUSE, "paused_by_placement": True},
])
def test_never_onto_a_node_that_is_down_paused_or_drained(state: dict[str, object]) -> None:
    tasks = [*crowded(), task("y1", "b", 0.2, "S")]
    assert settle(Placement(PARAMS), tasks, 200.0, b=state) == []


def test_never_a_task_of_a_node_that_is_not_ready() -> None:
    tasks = [*crowded(), task("y1", "b", 0.2, "S")]
    assert settle(Placement(PARAMS), tasks, 200.0, a={"ready": False}) == []


def test_one_move_in_flight_per_node_then_settled_when_swarm_is_done() -> None:
    # Two stuck tasks on a, room for both on b and c: one move at a time from a.
    tasks = [task("x1", "a", 0.35, "S"), task("x2", "a", 0.35, "S"),
             task("x3", "a", 0.4, "B"), task("x4", "a", 0.4, "B"),
             task("y", "b", 0.2, "S"), task("z", "c", 0.2, "S")]
    nodes = {"a": 1.0, "b": 1.0, "c": 1.0}
    placement = Placement(PARAMS)
    (first,) = settle(placement, tasks, 30.0, nodes=nodes)
    assert placement.in_flight == [first]
    moved = [t if t.service != first.service else task(t.service, first.destination, 0.4, "S")
             for t in tasks]
    plan = placement.plan(view(40.0, moved, nodes))
    assert plan.settled == [first.service]
    (second,) = plan.moves
    assert placement.in_flight == [second]
    assert second.service != first.service and second.source == "a"


def test_a_move_settles_only_once_its_replacement_runs() -> None:
    """Lifting a moved service's constraint is a service update: made while its start-first
    replacement starts, Swarm keeps the replacement and stops the old task at once, so the
    move settles only when no task of it is starting."""
    tasks = [*crowded(), task("y1", "b", 0.2, "S")]
    placement = Placement(PARAMS)
    (move,) = settle(placement, tasks, 30.0)
    moved = [t if t.service != move.service else task(t.service, move.destination, 0.45, "S")
             for t in tasks]
    landed = view(40.0, moved)
    starting = tuple(replace(s, starting=int(s.name == move.service))
                     for s in landed.services)
    assert placement.plan(ClusterView(40.0, landed.nodes, landed.tasks, starting)).settled == []
    assert placement.plan(view(45.0, moved)).settled == [move.service]


def test_a_move_that_never_lands_is_given_up() -> None:
    placement = Placement(PARAMS)
    tasks = [*crowded(), task("y1", "b", 0.2, "S")]
    settle(placement, tasks, 30.0)
    slow = view(100.0, tasks)
    updating = tuple(ServiceView(s.name, s.replicas, s.running, updating=s.name == "x3")
                     for s in slow.services)
    assert placement.plan(ClusterView(100.0, slow.nodes, slow.tasks, updating)).settled == []
    assert placement.plan(ClusterView(400.0, slow.nodes, slow.tasks, updating)).settled == [
        "x3"]


# --- new tasks: closing and opening nodes ---------------------------------------------


def test_a_full_node_closes_at_once_and_opens_after_it_has_room_for_a_while() -> None:
    placement = Placement(PARAMS)
    tasks = [*crowded(), task("y1", "b", 0.2, "S")]
    plan = placement.plan(view(0.0, tasks))
    assert plan.pause == ["a"] and plan.resume == []
    paused = {"a": {"availability": Availability.PAUSE, "paused_by_placement": True}}
    assert placement.plan(view(5.0, tasks, **paused)).resume == []
    light = [task("x1", "a", 0.2, "S"), task("y1", "b", 0.2, "S")]  # two left a
    assert placement.plan(view(10.0, light, **paused)).resume == []
    assert placement.plan(view(39.0, light, **paused)).resume == []
    assert placement.plan(view(40.0, light, **paused)).resume == ["a"]


def test_a_paused_node_with_some_room_but_not_enough_stays_paused() -> None:
    placement = Placement(PARAMS)
    # Expected need 0.3 (the median). a could take 0.3 but not 1.5 x 0.3.
    tasks = [task("x1", "a", 0.3, "S"), task("x2", "a", 0.3, "S"),
             task("y1", "b", 0.3, "S"), task("y2", "b", 0.3, "S")]
    paused = {"a": {"availability": Availability.PAUSE, "paused_by_placement": True}}
    for t in range(0, 200, 10):
        assert placement.plan(view(float(t), tasks, **paused)).resume == []


def test_when_every_node_is_full_none_stays_paused() -> None:
    placement = Placement(PARAMS)
    tasks = [*crowded("a"), *crowded("b")]
    assert placement.plan(view(0.0, tasks)).pause == []  # Swarm spreads them by count
    paused = {n: {"availability": Availability.PAUSE, "paused_by_placement": True}
              for n in ("a", "b")}
    assert sorted(placement.plan(view(5.0, tasks, **paused)).resume) == ["a", "b"]


def test_a_node_is_always_left_open_and_toggles_at_most_once_per_settle_time() -> None:
    placement = Placement(PARAMS)
    nodes = {"a": 1.0, "b": 1.0}
    light = [task("x1", "a", 0.2, "S"), task("y1", "b", 0.3, "S"), task("y2", "b", 0.3, "S")]
    # b could take the expected need (0.3) but not 1.5 x: paused, it stays so; a is full.
    a_full = [*crowded("a"), *light[1:]]
    b_paused = {"b": {"availability": Availability.PAUSE, "paused_by_placement": True}}
    plan = placement.plan(view(0.0, a_full, nodes, **b_paused))
    assert plan.pause == ["a"] and plan.resume == ["b"]  # one node open, the roomiest
    a_paused = {"a": {"availability": Availability.PAUSE, "paused_by_placement": True}}
    assert not placement.plan(view(5.0, a_full, nodes, **a_paused))
    assert placement.plan(view(10.0, light, nodes, **a_paused)).resume == []
    assert placement.plan(view(30.0, light, nodes, **a_paused)).resume == []  # roomy 20 s
    assert placement.plan(view(40.0, light, nodes, **a_paused)).resume == ["a"]


def test_nodes_the_operator_paused_are_left_alone() -> None:
    placement = Placement(PARAMS)
    tasks = [task("x1", "a", 0.1, "S"), task("y1", "b", 0.1, "S")]
    operator = {"a": {"availability": Availability.PAUSE}}
    for t in range(0, 200, 10):
        plan = placement.plan(view(float(t), tasks, **operator))
        assert "a" not in plan.resume and "a" not in plan.pause


def test_nothing_is_closed_before_any_need_is_known() -> None:
    idle = [TaskView(f"t{i}", f"s{i}", "a", "pending", 1.0, None, None) for i in range(30)]
    assert not Placement(PARAMS).plan(view(0.0, idle))


# --- properties over random clusters -----------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> list[tuple[str, float, str]]:
    n = draw(st.integers(1, 24))
    return [(f"n{draw(st.integers(0, 3))}", draw(st.floats(0.02, 1.5)),
             draw(st.sampled_from(["G", "S", "B", "idle"]))) for _ in range(n)]


@settings(max_examples=60, deadline=None)
@given(clusters(), st.lists(st.sampled_from(["active", "pause", "drain", "down"]),
                            min_size=4, max_size=4))
def test_moves_respect_their_rules_on_any_cluster(
        spec: list[tuple[str, float, str]], states: list[str]) -> None:
    nodes = {f"n{i}": 1.0 for i in range(4)}
    overrides = {f"n{i}": ({"ready": False} if s == "down" else
                           {"availability": Availability(s)})
                 for i, s in enumerate(states)}
    tasks = [task(f"t{i}", node, need, cls) for i, (node, need, cls) in enumerate(spec)]
    placement = Placement(PARAMS)
    starts = []
    for t in range(0, 400, 5):
        plan = placement.plan(view(float(t), tasks, nodes, **overrides))
        for move in plan.moves:
            starts.append(float(t))
            assert overrides[move.destination] == {"availability": Availability.ACTIVE}
            assert overrides[move.source] != {"ready": False}
            source_task = next(x for x in tasks if x.service == move.service)
            assert source_task.cls in ("B", "G") and source_task.node == move.source
        assert set(plan.pause).isdisjoint(plan.resume)
        assert all(overrides[n] == {"availability": Availability.ACTIVE} for n in plan.pause)
    for s in starts:
        assert sum(s <= x < s + 60.0 for x in starts) <= PARAMS.max_moves_per_minute


def test_a_loose_target_in_g_under_its_nodes_floor_stays_where_it_is() -> None:
    # On a (1 CPU, 3 tasks, floor 0.17) a need of 0.1 is admitted at its need: the node's
    # policy slows it into S there, and no other node would do better.
    tasks = [task("x", "a", 0.1, "G"), task("y", "a", 0.3, "S"), task("z", "a", 0.3, "S"),
             *(task(f"b{i}", "b", 0.12, "S") for i in range(5))]
    assert settle(Placement(PARAMS), tasks, 200.0) == []
