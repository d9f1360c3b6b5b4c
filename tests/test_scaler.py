"""The pipelines' model-based scaler (issue 34, item 4), on the host: the rule
(dqoes_cg/cluster/scaler.py: out under a rising rate, in with hysteresis, never below one,
the cap, nothing while Swarm updates or on a hostile measurement, moves where a node is
taken), the manager carrying it out through Swarm's API (the stub of tests/fakeswarm.py) or
recommending it, and the simulator's check (bench/cluster/pipeline_scaling.py, in the model's
own world).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from bench.cluster.pipeline_scaling import compare, stage_latency
from dqoes_cg.cluster.actions import SwarmActions, Update
from dqoes_cg.cluster.manager import RESPLIT_S, Manager
from dqoes_cg.cluster.protocol import ContainerReport, Report
from dqoes_cg.cluster.scaler import (
    PipelineLoad,
    Scaler,
    ScalerParams,
    StageLoad,
    need,
    replicas_for,
)
from dqoes_cg.cluster.scaling import ModelScaling
from dqoes_cg.cluster.show import format_cluster
from tests.fakeswarm import StubEngine, node_doc, service_doc, task_doc
from tests.swarmca import swarm_id

# --- the rule ----------------------------------------------------------------------------

WORK, SHARE = 0.05, 0.1  # a replica of 1 CPU answers within the share below 10 requests/s


def stage(rate: float | None, asked: int = 1, work: float | None = WORK,
          share: float | None = SHARE, cpus: float = 1.0, busy: str | None = None,
          room: dict[str, float] | None = None, name: str = "detector") -> StageLoad:
    return StageLoad(name, name, asked, work, rate, share,
                     {f"n{i}": cpus for i in range(asked)},
                     {"spare": 1.0} if room is None else room, busy)


def plan(scaler: Scaler, now: float, *stages: StageLoad):  # type: ignore[no-untyped-def]
    return scaler.plan(now, [PipelineLoad("video", stages)]).decisions


def test_the_need_is_the_least_count_at_which_the_model_holds_the_share() -> None:
    assert need(WORK, 40.0, SHARE, 1.0) == pytest.approx(4.0)  # 2 CPUs of work / 0.5 left
    assert replicas_for(need(WORK, 40.0, SHARE, 1.0)) == 4  # type: ignore[arg-type]
    assert stage_latency(WORK, 40.0, 4) <= SHARE < stage_latency(WORK, 40.0, 3)
    assert need(WORK, 41.0, SHARE, 1.0) == pytest.approx(4.1)
    assert replicas_for(4.1) == 5 and replicas_for(0.2) == 1
    assert need(WORK, 10.0, SHARE, 0.5) == math.inf, "c <= s/L: no count helps"


def test_it_scales_out_at_once_as_the_rate_rises() -> None:
    scaler = Scaler()
    assert plan(scaler, 0.0, stage(8.0)) == ()  # needs 0.8
    (out,) = plan(scaler, 5.0, stage(30.0))
    assert (out.service_id, out.replicas, out.move_from, out.prefer) == (
        "detector", 3, None, ("spare",))
    assert out.why == ("scaling out 1 -> 3: needs 3.00 replicas (rate 30.00/s, work 50.0 ms, "
                       "share 100 ms, 1.00 CPU a replica)")
    assert plan(scaler, 10.0, stage(60.0)) == (), "held for hold_s after an action"
    (again,) = plan(scaler, 35.0, stage(60.0, asked=3))
    assert again.replicas == 6


def test_it_scales_in_one_at_a_time_with_hysteresis_and_never_below_one() -> None:
    params = ScalerParams(hold_s=0.0)
    scaler = Scaler(params)
    # 4 asked, need 2.5: three would hold it, but not with 20% to spare (2.5 > 0.8 x 3)
    for t in range(10):
        assert plan(scaler, 5.0 * t, stage(25.0, asked=4)) == ()
    made = []
    asked, t = 4, 100.0
    for _ in range(40):  # the rate falls to almost nothing
        decisions = plan(scaler, t, stage(0.5, asked=asked))
        made += [(t, d.replicas) for d in decisions]
        asked = decisions[0].replicas if decisions else asked
        t += 5.0
    assert [r for _, r in made] == [3, 2, 1], "one at a time, never below one"
    assert made[0][0] == 110.0, "after three evaluations in a row below"
    assert "scaling in 4 -> 3: needs 0.05 replicas" in plan(
        Scaler(ScalerParams(scale_in_evaluations=1)), 0.0, stage(0.5, asked=4))[0].why
    # a rate that comes back up in between starts the count again
    scaler = Scaler(params)
    rates = [0.5, 0.5, 25.0, 0.5, 0.5]
    assert all(plan(scaler, 5.0 * i, stage(r, asked=4)) == () for i, r in enumerate(rates))


def test_at_most_k_actions_a_minute_per_pipeline() -> None:
    scaler = Scaler(ScalerParams(max_actions_per_minute=2))
    stages = [stage(30.0, name=f"s{i}") for i in range(3)]
    other = PipelineLoad("other", (stage(30.0, name="o"),))
    first = scaler.plan(0.0, [PipelineLoad("video", tuple(stages)), other]).decisions
    assert [d.stage for d in first] == ["s0", "s1", "o"], "the cap is per pipeline"
    assert plan(scaler, 5.0, *stages) == ()
    assert plan(scaler, 55.0, *stages) == ()
    scaled = [stage(30.0, asked=3, name=f"s{i}") for i in range(2)]
    assert [d.stage for d in plan(scaler, 60.0, *scaled, stages[2])] == ["s2"]
    assert plan(Scaler(ScalerParams(max_actions_per_minute=0)), 0.0, *stages) == ()


@pytest.mark.parametrize("busy", ["Swarm is updating it", "2 of its 3 tasks running"])
def test_nothing_while_swarm_updates_the_service_or_its_tasks_are_not_all_there(
        busy: str) -> None:
    scaler = Scaler(ScalerParams(scale_in_evaluations=1))
    assert plan(scaler, 0.0, stage(30.0, busy=busy)) == ()
    assert plan(scaler, 5.0, stage(0.5, asked=3, busy=busy)) == ()
    assert plan(scaler, 10.0, stage(30.0))[0].replicas == 3, "and at once when it is done"


@pytest.mark.parametrize("work, rate, share", [
    (None, 30.0, SHARE), (WORK, None, SHARE), (WORK, 30.0, None), (math.nan, 30.0, SHARE),
    (WORK, math.nan, SHARE), (WORK, math.inf, SHARE), (WORK, 0.0, SHARE),
    (-WORK, 30.0, SHARE), (WORK, 30.0, 0.0), (WORK, -1.0, SHARE)])
def test_a_missing_or_hostile_measurement_leads_to_no_action(
        work: float | None, rate: float | None, share: float | None) -> None:
    scaler = Scaler(ScalerParams(scale_in_evaluations=1))
    assert plan(scaler, 0.0, stage(rate, work=work, share=share)) == ()
    assert plan(scaler, 5.0, stage(rate, asked=4, work=work, share=share)) == ()


def test_no_action_without_a_replica_whose_cpu_is_known_or_for_a_global_service() -> None:
    unknown = StageLoad("d", "d", 1, WORK, 30.0, SHARE, {}, {"spare": 1.0})
    global_ = StageLoad("d", "d", None, WORK, 30.0, SHARE, {"n0": 1.0}, {"spare": 1.0})
    nan_cpu = StageLoad("d", "d", 1, WORK, 30.0, SHARE, {"n0": math.nan}, {"spare": 1.0})
    assert plan(Scaler(), 0.0, unknown, global_, nan_cpu) == ()


def test_new_replicas_go_where_they_hold_and_a_taken_node_loses_its_replica() -> None:
    # a new replica at 3 holds the share with s/L + λs/3 = 0.5 + 0.5 = 1.0 CPU
    (out,) = plan(Scaler(), 0.0, stage(30.0, room={"big": 1.0, "small": 0.6}))
    assert out.prefer == ("big",)
    (spread,) = plan(Scaler(), 0.0, stage(30.0, room={"small": 0.6}))
    assert (spread.replicas, spread.prefer) == (3, ()), "no room anywhere: Swarm spreads"
    # its node leaves it 0.4 CPU: below s/L = 0.5 no count helps; a lone replica gets a
    # second where one holds at two (0.5 + 0.1 CPU), one of two moves
    (second,) = plan(Scaler(), 0.0, stage(4.0, cpus=0.4, room={"big": 1.0, "small": 0.55}))
    assert (second.replicas, second.move_from, second.prefer) == (2, None, ("big",))
    assert second.why.startswith("scaling out 1 -> 2 rather than moving its lone replica: "
                                 "0.40 CPU on its node cannot answer")
    two = replace(stage(4.0, asked=2, room={"big": 1.0, "small": 0.55}),
                  replica_cpus={"n0": 0.4, "n1": 1.0})
    (move,) = plan(Scaler(), 0.0, two)
    assert (move.replicas, move.move_from, move.prefer) == (2, "n0", ("big",))
    assert move.why.startswith("moving a replica off its node: 0.40 CPU there cannot answer")
    assert plan(Scaler(), 0.0, stage(4.0, cpus=0.4, room={"small": 0.55})) == (), \
        "nowhere to go: nothing"


def test_when_the_floors_fill_the_target_only_the_stages_that_fill_it_scale_out() -> None:
    squeezed = stage(8.0, share=0.055, name="framer")  # needs 8, its share squeezed
    overloaded = stage(30.0, name="detector")  # 1.5 CPUs of work on one replica
    both = (squeezed, overloaded)
    decisions = Scaler().plan(0.0, [PipelineLoad("video", both, feasible=False)]).decisions
    assert [d.stage for d in decisions] == ["detector"]
    assert [d.stage for d in Scaler().plan(0.0, [PipelineLoad("video", both)]).decisions] \
        == ["framer", "detector"], "a feasible split: each to its share"
    starting = (squeezed, stage(30.0, asked=3, busy="1 of its 3 tasks running"))
    assert Scaler().plan(0.0, [PipelineLoad("video", starting, False)]).decisions == ()
    alone = Scaler().plan(0.0, [PipelineLoad("video", (squeezed,), False)]).decisions
    assert [d.stage for d in alone] == ["framer"], "none fills it: more replicas lower floors"


def test_a_replica_on_a_nearly_taken_node_moves_rather_than_the_stage_scaling_far_out(
        ) -> None:
    # n0 leaves its replica 0.52 CPU, just over s/L = 0.5: the stage would need 25 replicas
    # there, 1 on n1; a move to a node with room does with the two it has
    near = StageLoad("detector", "detector", 2, WORK, 10.0, SHARE, {"n0": 0.52, "n1": 1.0},
                     {"big": 1.0, "small": 0.6})
    (move,) = plan(Scaler(), 0.0, near)
    assert (move.replicas, move.move_from, move.prefer) == (2, "n0", ("big",))
    assert move.why.startswith("moving a replica off its node: at 0.52 CPU there the stage "
                               "needs 25.00 replicas, 1.00 without it")
    (out,) = plan(Scaler(), 0.0, replace(near, room_cpus={"small": 0.6}))
    assert (out.replicas, out.move_from) == (25, None), "nowhere better to go: it scales out"
    alike = replace(near, replica_cpus={"n0": 0.52, "n1": 0.52})
    assert plan(Scaler(), 0.0, alike)[0].move_from is None, "the rest needs as many: out"
    # a move that would not change the count the rule heads for is not made
    kept = StageLoad("detector", "detector", 2, WORK, 10.0, SHARE, {"n0": 0.9, "n1": 1.0},
                     {"big": 1.0})
    assert plan(Scaler(), 0.0, kept) == ()


def test_a_lone_replica_is_never_moved_but_gets_a_second() -> None:
    # at 0.8 CPU its node makes the stage need 1.33 replicas; at the roomiest node (1 CPU)
    # one would do: a second replica there
    near = stage(8.0, cpus=0.8, room={"big": 1.0})
    (out,) = plan(Scaler(), 0.0, near)
    assert (out.replicas, out.move_from, out.prefer) == (2, None, ("big",))
    # at 0.55 CPU it would need 8, one at the roomiest node: a second replica, not eight
    (second,) = plan(Scaler(), 0.0, replace(near, replica_cpus={"n0": 0.55}))
    assert (second.replicas, second.move_from, second.prefer) == (2, None, ("big",))
    assert second.why.startswith("scaling out 1 -> 2 rather than moving its lone replica: at "
                                 "0.55 CPU on its node the stage needs 8.00 replicas, 0.80 "
                                 "on the roomiest node")


def test_a_stage_that_holds_its_share_is_neither_scaled_out_nor_moved() -> None:
    # the model finds it short (30/s of 50 ms on one replica; at 0.4 CPU no count helps),
    # but its nodes measure it within its share: the model is wrong there, not the stage
    for short in (stage(30.0), stage(4.0, cpus=0.4, room={"big": 1.0})):
        assert plan(Scaler(), 0.0, replace(short, latency_s=SHARE * 0.9)) == ()
        assert plan(Scaler(), 0.0, replace(short, latency_s=SHARE * 1.1)) != (), "misses it"
        assert plan(Scaler(), 0.0, short) != (), "not measured: the model decides"
    # holding, it still scales in as the model says
    scaler = Scaler(ScalerParams(scale_in_evaluations=1))
    (down,) = plan(scaler, 0.0, replace(stage(1.0, asked=3), latency_s=SHARE / 2))
    assert down.replicas == 2


def test_a_stage_that_misses_its_share_is_sized_by_the_cpu_its_latency_shows() -> None:
    # its node's budget leaves it a whole CPU, enough at 8/s (need 0.8); but it answers in
    # 200 ms for a share of 100: by the model it had 0.05/0.2 + 8 x 0.05 = 0.65 CPU (a hog
    # beside it that the budget does not show), at which it needs 0.4 / 0.15 = 2.67
    hogged = replace(stage(8.0, room={}), latency_s=0.2)
    (out,) = plan(Scaler(), 0.0, hogged)
    assert out.why == ("scaling out 1 -> 3: needs 2.67 replicas (rate 8.00/s, work 50.0 ms, "
                       "share 100 ms, 0.65 CPU a replica)")
    # a node with a whole CPU spare: one replica there would do; a second goes there
    (second,) = plan(Scaler(), 0.0, replace(hogged, room_cpus={"spare": 1.0}))
    assert (second.replicas, second.move_from, second.prefer) == (2, None, ("spare",))


def test_when_the_floors_fill_the_target_and_none_is_that_busy_only_the_busiest_scales(
        ) -> None:
    # neither is busier than split.RHO_MAX a replica: scaling the light framer to its
    # squeezed share would take 8 replicas and barely lower its floor
    framer = stage(8.0, share=0.055, name="framer")  # 0.4 CPU of work
    detector = stage(15.0, share=0.12, name="detector")  # 0.75
    decisions = Scaler().plan(0.0, [PipelineLoad("video", (framer, detector), False)])
    assert [d.stage for d in decisions.decisions] == ["detector"]


def test_under_the_cap_the_latest_stages_act_first_whatever_their_order() -> None:
    # the first two stages need one more replica each, the last is overloaded: with two
    # actions a minute the last is not left waiting behind them; scale-ins come last
    light = [stage(12.0, name=f"s{i}") for i in range(2)]  # 0.6 CPU of work on one
    heavy = stage(30.0, name="last")  # 1.5
    assert [d.stage for d in plan(Scaler(ScalerParams(max_actions_per_minute=2)), 0.0,
                                  *light, heavy)] == ["s0", "last"], "in the stages' order"
    idle = stage(0.5, asked=4, name="idle")
    scaler = Scaler(ScalerParams(max_actions_per_minute=1, scale_in_evaluations=1))
    assert [d.stage for d in plan(scaler, 0.0, idle, light[0])] == ["s0"]


# --- in the manager ------------------------------------------------------------------------

CIDS = {"cheap": "a" * 64, "dear": "b" * 64}


class Swarm:
    """node1 the manager; pipeline `video`: cheap (on node2) -> dear (on node3), each one
    replica asked and running; `dear_doc` changes dear's service document."""

    def __init__(self, acting: bool = True, **dear_doc: object) -> None:
        self.node1, self.node2, self.node3, self.node4 = (swarm_id() for _ in range(4))
        self.ids = {name: swarm_id() for name in CIDS}
        self.engine = StubEngine({
            "/nodes": [node_doc(self.node1, "node1", role="manager"),
                       node_doc(self.node2, "node2"), node_doc(self.node3, "node3"),
                       node_doc(self.node4, "node4")],
            "/services": [
                service_doc(self.ids["cheap"], "cheap", {
                    "dqoes.pipeline": "video", "dqoes.next": "dear",
                    "dqoes.pipeline.target": "1s", "dqoes.pipeline.metric": "mean"}),
                service_doc(self.ids["dear"], "dear", {"dqoes.pipeline": "video"},
                            **dear_doc)],  # type: ignore[arg-type]
            "/tasks": [task_doc(swarm_id(), self.ids["cheap"], self.node2, CIDS["cheap"]),
                       task_doc(swarm_id(), self.ids["dear"], self.node3, CIDS["dear"])]})
        self.manager = Manager(self.engine, self.node1, acting=acting,
                               scaling=ModelScaling())
        self.seq = 0

    def report(self, now: float, rate: float) -> None:
        """Every node reports (budget 1 CPU); cheap and dear serve `rate` requests a second
        of 10 ms and 100 ms, answered in M/M/1's time at one CPU (20 times the work past
        0.95 busy); node4 runs nothing."""
        self.seq += 1
        for node, name, work in ((self.node2, "cheap", 0.01), (self.node3, "dear", 0.1),
                                 (self.node4, None, 0.0)):
            latency = work / max(1.0 - rate * work, 0.05)
            containers = () if name is None else (ContainerReport(
                CIDS[name], "S", 0.5, "mean", latency, None, rate * work, 20, rate,
                rate * work, latency, 1.5 * latency),)
            self.manager.receive(node, Report(self.seq, 1.0, rate * work, True, True, None,
                                              containers), now)

    def run(self, rate: float) -> float:
        """Ticks through a split and an evaluation at `rate`; the clock after."""
        now = time.monotonic()
        self.manager.tick(now)
        self.report(now + 1, rate)
        self.manager.tick(now + 1)  # two windows of the stages' (stage_measures.MIN_REQUESTS)
        self.manager.tick(now + RESPLIT_S)
        return now + RESPLIT_S

    def updates(self) -> list[dict[str, object]]:
        return [body for path, _, body in self.engine.posts
                if path == f"/services/{self.ids['dear']}/update"]


def test_the_manager_scales_a_stage_out_through_swarm_onto_a_node_with_room() -> None:
    swarm = Swarm()
    swarm.run(15.0)  # dear: 1.5 CPUs of work a second on one replica
    (spec,) = swarm.updates()
    replicas = spec["Mode"]["Replicated"]["Replicas"]  # type: ignore[index]
    assert replicas >= 2
    constraints = spec["TaskTemplate"]["Placement"]["Constraints"]  # type: ignore[index]
    # new tasks on node4 (the one with room) or node3 (where it runs): off the others
    assert sorted(constraints) == sorted(f"node.id!={n}" for n in (swarm.node1, swarm.node2))
    assert [body for path, _, body in swarm.engine.posts
            if path != f"/services/{swarm.ids['dear']}/update"] == [], "cheap needs one"


def test_recommending_only_it_lists_the_scale_instead_of_making_it() -> None:
    swarm = Swarm(acting=False)
    now = swarm.run(15.0)
    assert swarm.engine.posts == []
    view = swarm.manager.tick(now + 1)
    (rec,) = view.recommended
    assert rec.what.startswith("service dear: pipeline video: scaling out 1 -> ")
    assert "rate 15.00/s, work 100.0 ms" in rec.what
    text = format_cluster(view)
    assert "scaling out 1 -> " in text and "recommend only" in text


def test_no_scale_while_swarm_updates_the_stage() -> None:
    swarm = Swarm(updating=True)
    swarm.run(15.0)
    assert swarm.engine.posts == []


def test_cluster_status_shows_the_replicas_running_of_those_asked() -> None:
    swarm = Swarm(replicas=3)  # asked 3, one running: a scale-out under way
    view = swarm.manager.tick(time.monotonic())
    line = next(x for x in format_cluster(view).splitlines() if x.startswith("video/dear"))
    assert line.split()[5] == "1/3"
    swarm.run(15.0)
    assert swarm.engine.posts == [], "tasks not all running: busy"


def test_a_scale_and_its_constraints_are_one_update_of_the_service() -> None:
    swarm = Swarm()
    view = swarm.manager.tick(time.monotonic())
    actions = SwarmActions(view, 0.0, {})
    actions.prefer(swarm.ids["dear"], [swarm.node4])
    actions.scale(swarm.ids["dear"], 3, "more")
    (update,) = actions.updates()
    assert (update.replicas, update.avoid) == (3, frozenset({swarm.node1, swarm.node2}))
    assert update.what == "service dear: more; new tasks on node4"
    update.apply(swarm.engine)
    (spec,) = swarm.updates()
    assert spec["Mode"]["Replicated"]["Replicas"] == 3  # type: ignore[index]
    assert spec["UpdateConfig"]["Order"] == "start-first"  # type: ignore[index]
    actions = SwarmActions(view, 0.0, {})
    actions.scale(swarm.ids["dear"], 1)  # what it asks already: no update
    actions.scale(swarm.ids["cheap"], 0)  # refused: below one
    assert actions.updates() == []
    assert Update("x", service_id="s", replicas=2) != Update("x", service_id="s")



def test_a_move_waits_for_a_starting_task_and_a_scale_does_not() -> None:
    """A changed constraint while a start-first replacement starts makes Swarm stop the old
    task at once; a changed replica count alone leaves its tasks as they are."""
    swarm = Swarm()
    view = swarm.manager.tick(time.monotonic())
    services = [replace(s, starting=1) if s.id == swarm.ids["dear"] else s
                for s in view.services]
    actions = SwarmActions(replace(view, services=services), 0.0, {})
    actions.move_away(swarm.ids["dear"], swarm.node1)
    assert actions.updates() == []
    actions.scale(swarm.ids["dear"], 3, "more")
    (update,) = actions.updates()
    assert (update.replicas, update.avoid) == (3, frozenset())  # its constraints as they were

# --- the simulator -------------------------------------------------------------------------

def test_the_scaled_chain_holds_its_target_with_fewer_replica_seconds_than_fixed() -> None:
    """In the model's own world (the stages are the model): a chain of three under a step
    of the rate from 10 to 40 a second and back."""
    result = compare()
    scaled, most, least = result["scaled"], result["fixed_most"], result["fixed_least"]
    assert scaled["held_settled"] >= 0.9 and scaled["held"] >= 0.95
    assert least["held"] == most["held"] == 1.0
    assert scaled["replica_seconds"] < least["replica_seconds"] < most["replica_seconds"]
    assert scaled["actions"] <= 12
