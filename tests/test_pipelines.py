"""Pipelines on Swarm (issue 34, items 1 and 3), on the host: their declaration by service
labels (every malformed one refused with a one-line reason, the others managed), the split
of the end-to-end target into stage targets (split.py: chains and DAGs, every path within
the target, the cheapest stage tightest, hysteresis), the manager pushing each stage's share
to its nodes (through a real agent to a stand-in dqoesd), and `dqoesctl cluster status`.
Swarm's API is the stub of tests/fakeswarm.py.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dqoes_cg.cluster.agent import Agent, build_report
from dqoes_cg.cluster.manager import BUDGET, RESPLIT_S, Manager, stage_label
from dqoes_cg.cluster.pipelines import MAX_NEXT, MAX_STAGES, declared
from dqoes_cg.cluster.protocol import ContainerReport, ProtocolError, Report, parse
from dqoes_cg.cluster.server import Server
from dqoes_cg.cluster.show import format_cluster
from dqoes_cg.cluster.split import FLOOR_MARGIN, HYSTERESIS, Split, settle, split
from dqoes_cg.cluster.stage_measures import (
    MIN_REQUESTS,
    SMOOTH_S,
    StageHistory,
    StageMeasure,
    stage_measurements,
)
from dqoes_cg.cluster.swarmapi import SwarmService, parse_service
from dqoes_cg.cluster.view import ClusterView, TaskView
from dqoes_cg.duration import parse_duration
from dqoes_cg.jsonline import encode
from dqoes_cg.membership.labels import objective
from dqoes_cg.membership.objective import Objective
from dqoes_cg.status import Status
from lab.pipeline_swarm import STAGES, stage_labels
from tests.fakeswarm import FakeDqoesd, StubEngine, node_doc, service_doc, status_doc, task_doc
from tests.swarmca import SwarmCA, swarm_id
from tests.test_cluster import wait_for

# --- the declaration ---------------------------------------------------------------------

GOOD = {"g1": {"dqoes.pipeline": "good", "dqoes.next": "g2",
               "dqoes.pipeline.target": "2s"},
        "g2": {"dqoes.pipeline": "good"}}


def services(declarations: dict[str, dict[str, str]]) -> list[SwarmService]:
    """Services of these names and labels, as the manager reads them from Swarm."""
    found = [parse_service(service_doc(f"{i:025d}", name, labels))
             for i, (name, labels) in enumerate(declarations.items())]
    assert all(s is not None for s in found)
    return [s for s in found if s is not None]


def chain(name: str, *stages: str, target: str = "35s") -> dict[str, dict[str, str]]:
    labels: dict[str, dict[str, str]] = {}
    for i, stage in enumerate(stages):
        labels[stage] = {"dqoes.pipeline": name}
        if i + 1 < len(stages):
            labels[stage]["dqoes.next"] = stages[i + 1]
    labels[stages[0]]["dqoes.pipeline.target"] = target
    return labels


def test_a_chain_and_a_fan_out_dag_are_declared_in_order() -> None:
    video = {"framer": {"dqoes.pipeline": "video", "dqoes.next": "detector",
                        "dqoes.pipeline.target": "35s", "dqoes.pipeline.metric": "mean"},
             "detector": {"dqoes.pipeline": "video", "dqoes.next": "analyzer, recognizer"},
             "analyzer": {"dqoes.pipeline": "video", "dqoes.next": "uploader"},
             "recognizer": {"dqoes.pipeline": "video", "dqoes.next": "uploader"},
             "uploader": {"dqoes.pipeline": "video"}}
    pipelines, refused = declared(services({**video, **GOOD}))
    assert refused == []
    assert [p.name for p in pipelines] == ["good", "video"]
    good, v = pipelines
    assert (good.target_s, good.metric, [s.name for s in good.stages]) == (2.0, "p95",
                                                                          ["g1", "g2"])
    assert (v.target_s, v.metric) == (35.0, "mean")
    names = [s.name for s in v.stages]
    assert names[:2] == ["framer", "detector"] and names[-1] == "uploader"
    assert {tuple(names[i] for i in path) for path in v.paths} == {
        ("framer", "detector", "analyzer", "uploader"),
        ("framer", "detector", "recognizer", "uploader")}
    for i, stage in enumerate(v.stages):  # topological: a stage before those it feeds
        assert all(j > i for j in stage.next)


def test_a_stages_pipeline_labels_are_no_target_of_its_own() -> None:
    labels = {"dqoes.pipeline": "video", "dqoes.next": "b", "dqoes.pipeline.target": "3s"}
    assert objective(labels) is None
    assert objective({**labels, "dqoes.target": "1s"}) == Objective(1.0, "p95")
    stage = services({"a": labels})[0]
    assert (stage.objective, stage.error, stage.labels, stage.concerns_us) == (
        None, None, {}, True)


BAD = {
    "a cycle": ({"a": {"dqoes.pipeline": "bad", "dqoes.next": "b",
                       "dqoes.pipeline.target": "1s"},
                 "b": {"dqoes.pipeline": "bad", "dqoes.next": "c"},
                 "c": {"dqoes.pipeline": "bad", "dqoes.next": "b"}},
                "a cycle through b, c"),
    "a stage feeding itself": ({"a": {"dqoes.pipeline": "bad", "dqoes.next": "a",
                                      "dqoes.pipeline.target": "1s"}}, "a cycle through a"),
    "an unknown stage": ({**chain("bad", "a", "b"),
                          "b": {"dqoes.pipeline": "bad", "dqoes.next": "nowhere"}},
                         "next stage 'nowhere' is no stage of this pipeline"),
    "two targets": ({**chain("bad", "a", "b"),
                     "b": {"dqoes.pipeline": "bad", "dqoes.pipeline.target": "2s"}},
                    "two stages have dqoes.pipeline.target: a, b"),
    "no target": ({"a": {"dqoes.pipeline": "bad", "dqoes.next": "b"},
                   "b": {"dqoes.pipeline": "bad"}}, "no stage has dqoes.pipeline.target"),
    "a stage in two pipelines": ({**chain("bad", "a", "b"),
                                  "b": {"dqoes.pipeline": "bad", "dqoes.next": "g2"}},
                                 "next stage 'g2' is a stage of pipeline good"),
    "a stage with a target of its own": (
        {**chain("bad", "a", "b"), "b": {"dqoes.pipeline": "bad", "dqoes.target": "1s"}},
        "stage b has a dqoes.target of its own"),
    "a stage whose labels are refused": (
        {**chain("bad", "a", "b"), "b": {"dqoes.pipeline": "bad", "dqoes.speed": "9"}},
        "stage b: labels refused: unknown label 'dqoes.speed'"),
    "a malformed target": (chain("bad", "a", "b", target="fast"),
                           "dqoes.pipeline.target: bad duration 'fast'"),
    "a target of an unknown metric": (
        {**chain("bad", "a", "b"), "a": {"dqoes.pipeline": "bad", "dqoes.next": "b",
                                         "dqoes.pipeline.target": "1s",
                                         "dqoes.pipeline.metric": "p42"}},
        "unknown metric 'p42'"),
    "a metric without the target": (
        {**chain("bad", "a", "b"), "b": {"dqoes.pipeline": "bad",
                                         "dqoes.pipeline.metric": "mean"}},
        "stage b has dqoes.pipeline.metric without dqoes.pipeline.target"),
    "stages not connected": ({**chain("bad", "a", "b"), "c": {"dqoes.pipeline": "bad"}},
                             "stages c are not connected to stage a"),
    "too many stages": (chain("bad", *(f"s{i:02d}" for i in range(MAX_STAGES + 1))),
                        f"{MAX_STAGES + 1} stages (at most {MAX_STAGES})"),
    "a label too long to read whole": (
        {**chain("bad", "a", "b"), "b": {"dqoes.pipeline": "bad",
                                         "dqoes.next": ",".join(["c" * 60] * 5)}},
        "stage b: dqoes.next is longer than 255 characters"),
    "a stage with every label": (
        {**chain("bad", "a", "b"), "a": {"dqoes.pipeline": "bad", "dqoes.next": "b",
                                         "dqoes.pipeline.target": "1s",
                                         "dqoes.pipeline.metric": "mean",
                                         "dqoes.target": "1s", "dqoes.metric": "mean",
                                         "dqoes.policy": "flowcon", "dqoes.x": "1"}},
        "stage a: labels refused"),
    "too many next stages": (
        {"a": {"dqoes.pipeline": "bad", "dqoes.pipeline.target": "1s",
               "dqoes.next": ",".join(f"n{i}" for i in range(MAX_NEXT + 1))},
         **{f"n{i}": {"dqoes.pipeline": "bad"} for i in range(MAX_NEXT + 1)}},
        f"stage a has {MAX_NEXT + 1} next stages (at most {MAX_NEXT})"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_pipeline_is_refused_in_one_line_and_the_others_stay(case: str) -> None:
    labels, reason = BAD[case]
    pipelines, refused = declared(services({**GOOD, **labels}))
    assert [p.name for p in pipelines] == ["good"]
    assert [r.name for r in refused] == ["bad"]
    assert reason in refused[0].reason
    assert "\n" not in refused[0].reason and len(refused[0].reason) < 200
    assert len(refused[0].service_ids) == len(labels)


@pytest.mark.parametrize("labels, reason", [
    ({"dqoes.pipeline": "a" * 64, "dqoes.pipeline.target": "1s"}, "a pipeline name is"),
    ({"dqoes.pipeline": "x,y", "dqoes.pipeline.target": "1s"}, "a pipeline name is"),
    ({"dqoes.pipeline": "x\ny", "dqoes.pipeline.target": "1s"}, "a pipeline name is"),
    ({"dqoes.next": "g1"}, "has dqoes.next without dqoes.pipeline"),
])
def test_a_stage_without_a_pipeline_it_may_name_is_refused(labels: dict[str, str],
                                                           reason: str) -> None:
    pipelines, refused = declared(services({**GOOD, "odd": labels}))
    assert [p.name for p in pipelines] == ["good"]
    assert len(refused) == 1 and reason in refused[0].reason
    assert "\n" not in refused[0].name + refused[0].reason


# --- the split ---------------------------------------------------------------------------

def cost(stage_s: Any, work_s: Any, replicas: Any) -> float:
    """The CPUs beyond the arrivals' own: sum of r s / L (split.py's model)."""
    return float(np.sum(np.asarray(replicas) * np.asarray(work_s) / np.asarray(stage_s)))


def within(result: Split, paths: list[tuple[int, ...]]) -> bool:
    return all(sum(result.stage_s[i] for i in p) <= result.target_s * (1 + 1e-9)
               for p in paths)


def test_the_lab_pipelines_labels_declare_it() -> None:
    """The five stages the Swarm test creates (a stage with a dqoes.metric of its own, and no
    target, was refused: its labels name no objective)."""
    pipelines, refused = declared(services(stage_labels(STAGES, "20s")))
    assert refused == []
    (video,) = pipelines
    assert [s.name for s in video.stages] == list(STAGES)
    assert (video.target_s, video.metric) == (20.0, "mean")


def test_a_chain_is_split_as_the_square_root_of_work_times_replicas() -> None:
    work, replicas = [0.01, 0.04, 0.03], [1, 1, 3]  # weights 0.01, 0.04, 0.09
    result = split(1.0, [(0, 1, 2)], work, [1.0, 1.0, 1.0], replicas)
    assert result.feasible
    assert np.allclose(result.stage_s, np.array([1, 2, 3]) / 6, rtol=1e-6)
    assert result.stage_s[0] == min(result.stage_s), "the cheapest millisecond: tightest"
    even = [1 / 3] * 3
    assert cost(result.stage_s, work, replicas) < cost(even, work, replicas)


def test_parallel_branches_weigh_together_on_a_fan_out_dag() -> None:
    """a -> {b, c} -> d: b and c share one budget, so they act as one stage of weight
    w_b + w_c (0.04: twice a's and d's square root)."""
    paths = [(0, 1, 3), (0, 2, 3)]
    result = split(1.0, paths, [0.01, 0.03, 0.01, 0.01], [1.0] * 4, [1] * 4)
    assert np.allclose(result.stage_s, [0.25, 0.5, 0.5, 0.25], atol=1e-3)
    assert within(result, paths)


def test_the_dag_split_is_the_least_cost_on_every_path() -> None:
    """Darly's pipeline (framer, detector, then analyzer or recognizer, uploader, the
    detector feeding the uploader directly too): every path within the target, and no
    feasible split found by random search costs less."""
    paths = [(0, 1, 2, 4), (0, 1, 3, 4), (0, 1, 4)]
    work, rates, replicas = [0.05, 0.5, 0.8, 0.3, 0.02], [2.0] * 5, [1, 2, 3, 1, 1]
    result = split(35.0, paths, work, rates, replicas)
    assert result.feasible and within(result, paths)
    assert max(sum(result.stage_s[i] for i in p) for p in paths) == pytest.approx(35.0)
    best = cost(result.stage_s, work, replicas)
    rng = np.random.default_rng(1)
    incidence = np.zeros((len(paths), 5))
    for p, path in enumerate(paths):
        incidence[p, list(path)] = 1
    for _ in range(20000):
        candidate = rng.uniform(0.01, 1, 5) * np.asarray(result.stage_s) ** rng.uniform(0, 1)
        candidate *= 35.0 / (incidence @ candidate).max()
        assert cost(candidate, work, replicas) >= best * (1 - 1e-3)


def test_every_stage_keeps_its_floor_and_an_impossible_target_is_said() -> None:
    """Stage 1's square-root share (0.30 s) is below its floor at one CPU: 0.40 s."""
    work, rates, replicas = [0.01, 0.2, 0.001], [2.0, 2.0, 2.0], [100, 1, 1]
    floor = FLOOR_MARGIN * 0.2 / (1 - 0.4)  # rho = 2 x 0.2 at one CPU
    free = split(1.0, [(0, 1, 2)], work, [None] * 3, replicas)  # no rate: no queueing
    assert free.stage_s[1] < floor
    result = split(1.0, [(0, 1, 2)], work, rates, replicas)
    assert result.feasible and result.stage_s[1] == pytest.approx(floor)
    assert sum(result.stage_s) == pytest.approx(1.0)
    assert result.stage_s[0] / result.stage_s[2] == pytest.approx(np.sqrt(1.0 / 0.001)), \
        "the others share what is left as the square roots of their weights"
    tight = split(0.3, [(0, 1, 2)], work, rates, replicas)
    assert not tight.feasible and sum(tight.stage_s) == pytest.approx(0.3)


def test_stages_not_measured_yet_share_alike() -> None:
    result = split(3.0, [(0, 1, 2)], [None, None, None], [None, None, None], [1, 1, 1])
    assert np.allclose(result.stage_s, [1.0, 1.0, 1.0])
    one = split(3.0, [(0, 1, 2)], [0.01, None, 0.04], [1.0, None, 1.0], [1, 1, 1])
    assert one.stage_s[0] < one.stage_s[1] < one.stage_s[2]  # the median's weight: 0.025


@pytest.mark.parametrize("work, rates, replicas", [
    ([0.01, 0.01, 1e-9, 0.01, 0.01, 0.01], [1.0] * 6, [1] * 6),  # a branch almost free
    ([0.0, -1.0, None, 1e3, 0.01, 0.01], [0.0, None, 5.0, 1e6, 0.0, 1.0], [0, 1, 2, 3, 1, 1]),
    ([0.25] * 6, [None] * 6, [1] * 6),  # the floors (0.3 s) fill the long path exactly
])
def test_any_measurement_gives_a_split_within_the_target(work: list[float | None],
                                                         rates: list[float | None],
                                                         replicas: list[int]) -> None:
    paths = [(0, 1, 3, 4, 5), (0, 2)]
    result = split(1.5, paths, work, rates, replicas)
    assert within(result, paths) and all(np.isfinite(result.stage_s))
    assert min(result.stage_s) > 0


def test_a_split_is_held_until_a_share_moves_by_more_than_ten_percent() -> None:
    paths = [(0, 1)]
    first = split(1.0, paths, [0.01, 0.04], [1.0, 1.0], [1, 1])
    noise = split(1.0, paths, [0.011, 0.04], [1.0, 1.0], [1, 1])  # shares move ~3%
    assert settle(first, noise) is first
    moved = split(1.0, paths, [0.04, 0.04], [1.0, 1.0], [1, 1])
    assert settle(first, moved) is moved
    retarget = split(0.95, paths, [0.01, 0.04], [1.0, 1.0], [1, 1])
    assert settle(first, retarget) is retarget, "a new target is taken at once"
    assert settle(None, first) is first


def test_shares_as_labels_never_add_up_to_more_than_the_target() -> None:
    for stage_s in itertools.product([0.1234567, 1 / 3, 2.7182818], repeat=3):
        assert sum(parse_duration(stage_label(x)) for x in stage_s) <= sum(stage_s)


# --- the manager -------------------------------------------------------------------------

CIDS = {name: c * 64 for name, c in (("cheap", "a"), ("dear", "b"), ("other", "c"))}


class Swarm:
    """node1 the manager; pipeline `video` of stages cheap (on node2) -> dear (on node3),
    and a refused pipeline `broken` (no target) whose stage `other` runs on node2."""

    def __init__(self) -> None:
        self.node1, self.node2, self.node3 = swarm_id(), swarm_id(), swarm_id()
        self.ids = {name: swarm_id() for name in CIDS}
        placed = {"cheap": self.node2, "dear": self.node3, "other": self.node2}
        self.engine = StubEngine({
            "/nodes": [node_doc(self.node1, "node1", role="manager"),
                       node_doc(self.node2, "node2"), node_doc(self.node3, "node3")],
            "/services": [
                service_doc(self.ids["cheap"], "cheap", {
                    "dqoes.pipeline": "video", "dqoes.next": "dear",
                    "dqoes.pipeline.target": "3s", "dqoes.pipeline.metric": "mean"}),
                service_doc(self.ids["dear"], "dear", {"dqoes.pipeline": "video"}),
                service_doc(self.ids["other"], "other", {"dqoes.pipeline": "broken"})],
            "/tasks": [task_doc(swarm_id(), self.ids[name], node, CIDS[name])
                       for name, node in placed.items()]})
        self.manager = Manager(self.engine, self.node1)
        self.seq = 0

    def report(self, now: float, work: dict[str, float], rate: float = 2.0,
               latency_s: float = 1.0) -> None:
        """node2 and node3 report their stages, each at `rate` requests a second costing
        `work[stage]` CPU-seconds each, answered in `latency_s` (mean), 1.5 times that
        (p95)."""
        self.seq += 1
        for node, names in ((self.node2, ("cheap", "other")), (self.node3, ("dear",))):
            self.manager.receive(node, Report(self.seq, 1.0, 0.5, True, True, None, tuple(
                ContainerReport(CIDS[n], "S", 1.0, "mean", latency_s, 0.5, 0.4, 20, rate,
                                rate * work.get(n, 0.01), latency_s, 1.5 * latency_s)
                for n in names)), now)

    def targets(self, node: str) -> dict[str, dict[str, str]]:
        return {name: labels for name, sid in self.ids.items()
                if (labels := self.manager.services_for(node).get(sid)) is not None}


def test_the_manager_pushes_each_stage_its_share_and_nothing_to_a_refused_one() -> None:
    swarm = Swarm()
    now = time.monotonic()
    view = swarm.manager.tick(now)
    stages_s = 3.0 * BUDGET  # the shares' sum: at their bands' edge, room for scatter
    even = {"dqoes.target": stage_label(stages_s / 2), "dqoes.metric": "mean"}  # unmeasured
    assert swarm.targets(swarm.node2) == {"cheap": even, "other": {}}
    assert swarm.targets(swarm.node3) == {"dear": even}
    # weights 1:9, shares 1:3; at 4 requests a second, past MIN_REQUESTS by the next split
    swarm.report(now + 1, {"cheap": 0.01, "dear": 0.09}, rate=4.0)
    swarm.manager.tick(now + 1)
    assert swarm.targets(swarm.node2)["cheap"] == even, "made again only every RESPLIT_S"
    view = swarm.manager.tick(now + RESPLIT_S)
    cheap = parse_duration(swarm.targets(swarm.node2)["cheap"]["dqoes.target"])
    dear = parse_duration(swarm.targets(swarm.node3)["dear"]["dqoes.target"])
    assert (cheap, dear) == pytest.approx((stages_s / 4, stages_s * 3 / 4), rel=1e-3)
    assert cheap + dear <= stages_s
    video = next(p for p in view.pipelines if p.name == "video")
    assert (video.target_s, video.metric, video.measured_s, video.mean_s, video.p95_s,
            video.feasible) == (3.0, "mean", 2.0, 2.0, 3.0, True)
    assert [(s.name, s.next, s.replicas, s.nodes, s.classes) for s in video.stages] == [
        ("cheap", ("dear",), 1, ("node2",), ("S",)), ("dear", (), 1, ("node3",), ("S",))]
    assert video.stages[1].work_s == pytest.approx(0.09)
    assert video.stages[1].rate_hz == pytest.approx(4.0)
    broken = next(p for p in view.pipelines if p.name == "broken")
    assert broken.error == "no stage has dqoes.pipeline.target" and broken.stages == ()

    swarm.report(now + 6, {"cheap": 0.0105, "dear": 0.09})  # noise: held
    swarm.manager.tick(now + 2 * RESPLIT_S)
    assert parse_duration(swarm.targets(swarm.node2)["cheap"]["dqoes.target"]) == cheap
    # interference on cheap: re-split as its work's mean over SMOOTH_S moves
    moved = now + 2 * RESPLIT_S
    while moved < now + 2 * RESPLIT_S + SMOOTH_S + RESPLIT_S:
        moved += RESPLIT_S
        swarm.report(moved - 1, {"cheap": 0.09, "dear": 0.09})
        swarm.manager.tick(moved)
        if moved < now + 3 * RESPLIT_S + 1:  # a window's rise moves the mean a quarter
            assert parse_duration(swarm.targets(swarm.node2)["cheap"]["dqoes.target"]) \
                < stages_s / 2
    # alike now, within the split's hysteresis (a share is held until it moves by more)
    for node, name in ((swarm.node2, "cheap"), (swarm.node3, "dear")):
        assert parse_duration(swarm.targets(node)[name]["dqoes.target"]) == \
            pytest.approx(stages_s / 2, rel=HYSTERESIS)


def test_a_stage_target_reaches_the_nodes_dqoesd_through_its_agent(tmp_path: Path) -> None:
    ca = SwarmCA(tmp_path / "ca")
    swarm = Swarm()
    _, manager_creds = ca.node("node1", "manager", node=swarm.node1)
    _, node2_creds = ca.node("node2", "worker", node=swarm.node2)
    server = Server(swarm.manager, manager_creds, ca.swarm, ("127.0.0.1", 0))
    server.start()
    dqoesd = FakeDqoesd(tmp_path / "dqoesd.sock")
    dqoesd.status = status_doc(1.0, [{"name": "cheap.1.x", "class": "S"}])
    engine = StubEngine({
        "/info": {"DockerRootDir": "/nonexistent",
                  "Swarm": {"LocalNodeState": "active", "NodeID": swarm.node2,
                            "RemoteManagers": [{"NodeID": swarm.node1,
                                                "Addr": "127.0.0.1:2377"}]}},
        "/containers/json": [{"Id": CIDS["cheap"], "Names": ["/cheap.1.x"]}]})
    agent = Agent(engine, dqoesd.path, server.address[1], node2_creds.directory)
    try:
        def given() -> bool:
            agent.step(time.monotonic())
            swarm.manager.tick(time.monotonic())
            return dqoesd.labels.get(swarm.ids["cheap"]) is not None

        wait_for("node2's dqoesd was given the stage's share", given)
    finally:
        agent.close()
        dqoesd.close()
        server.close()
    assert dqoesd.labels[swarm.ids["cheap"]] == {
        "dqoes.target": stage_label(3.0 * BUDGET / 2), "dqoes.metric": "mean"}
    assert dqoesd.labels[swarm.ids["other"]] == {}, "a refused pipeline's stage: no target"


def test_a_stages_rate_and_work_are_their_means_over_the_last_smooth_s() -> None:
    history = StageHistory()

    def measured(now: float, rate: float | None, work: float | None) -> StageMeasure:
        (m,) = history.smoothed(now, {"s": StageMeasure(work, rate, 0.5, 0.5, 0.9)}).values()
        return m

    assert measured(0.0, None, None).rate_hz is None, "nothing measured yet"
    first = measured(1.0, 6.0, 0.1)
    assert (first.rate_hz, first.work_s) == (6.0, None), f"under {MIN_REQUESTS} requests"
    assert measured(3.0, 6.0, 0.1) == StageMeasure(pytest.approx(0.1), 6.0, 0.5, 0.5, 0.9)
    quiet = measured(4.0, 0.0, None)  # a window without a request counts as a zero rate
    assert (quiet.rate_hz, quiet.work_s) == pytest.approx((4.0, 0.1))
    later = measured(5.0, 2.0, 0.4)  # work: the CPU over the windows' requests
    assert (later.rate_hz, later.work_s) == pytest.approx((3.5, (0.6 + 0.6 + 0.8) / 14))
    gone = measured(3.5 + SMOOTH_S, 4.0, 0.05)  # only the last SMOOTH_S count
    assert (gone.rate_hz, gone.work_s) == pytest.approx((2.0, (0.8 + 0.2) / 6))
    history.smoothed(40.0, {})
    assert history.windows == {}, "a stage gone is forgotten"


def test_a_starting_replicas_cpu_is_not_its_stages_work() -> None:
    """A replica that served no request in its window is starting (its imports and model:
    seconds of CPU on an emulated one) or idle: its CPU is no request's."""
    def task(rate: float | None, usage: float | None) -> TaskView:
        return TaskView("t", "s", "stage", 1, "n", "node", "c", "running", "S", 1.0, "mean",
                        0.5, 0.5, usage, 10, rate_hz=rate, window_usage_cores=usage)

    serving, starting = task(2.0, 0.2), task(0.0, 0.9)
    assert stage_measurements([serving, starting]).work_s == pytest.approx(0.1)
    assert stage_measurements([serving, starting]).rate_hz == pytest.approx(2.0)
    assert stage_measurements([starting]).work_s is None
    assert stage_measurements([serving, task(1.0, None)]).work_s is None, "one unknown"


def test_cluster_status_shows_each_pipeline_and_a_refused_one() -> None:
    swarm = Swarm()
    now = time.monotonic()
    swarm.manager.tick(now)
    swarm.report(now, {"cheap": 0.01, "dear": 0.09}, rate=4.0)
    swarm.manager.tick(now + 1)
    view = swarm.manager.tick(now + RESPLIT_S)  # past MIN_REQUESTS
    text = format_cluster(view)
    assert "PIPELINE" in text
    lines = text.splitlines()
    video = next(line for line in lines if line.startswith("video "))
    assert video.split()[:6] == ["video", "3.00s", "mean", "2.00s", "2.00s", "3.00s"]
    cheap = next(line for line in lines if line.startswith("video/cheap"))
    # the shares add up to BUDGET of the target: the rest is their bands' and the scatter's
    assert cheap.split()[:8] == ["video/cheap", "dear", "17%", "511.4ms", "1.00s", "1",
                                 "node2", "S"]
    dear = next(line for line in lines if line.startswith("video/dear"))
    assert dear.split()[1:3] == ["-", "51%"]
    broken = next(line for line in lines if line.startswith("broken "))
    assert "refused, unmanaged: no stage has dqoes.pipeline.target" in broken
    assert ClusterView.from_json(json.loads(json.dumps(view.to_json()))) == view


# --- what the nodes report ---------------------------------------------------------------

def test_a_report_carries_each_containers_rate_and_window_usage() -> None:
    doc = status_doc(1.0, [{"name": "cheap.1.x"}])
    fields = {"rate_hz": 2.5, "window_usage_cores": 0.25, "mean_s": 0.5, "p95_s": 0.75}
    doc["containers"][0].update(fields)
    report = build_report(1, Status.from_json(doc), {"cheap.1.x": CIDS["cheap"]}, None)
    (c,) = parse(encode(report.to_json())).containers  # type: ignore[union-attr]
    assert {f: getattr(c, f) for f in fields} == fields
    older = report.to_json()
    for field in fields:
        del older["containers"][0][field]
    (c,) = parse(encode(older)).containers  # type: ignore[union-attr]
    assert {f: getattr(c, f) for f in fields} == dict.fromkeys(fields)
    for field, bad in itertools.product(fields, (-1.0, float("inf"), "2", True, 1e12)):
        hostile = report.to_json()
        hostile["containers"][0][field] = bad
        with pytest.raises(ProtocolError, match=field):
            parse(encode(hostile))
