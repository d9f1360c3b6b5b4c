"""Requests flow through a pipeline of five stage services on the swarm guest's three nodes
(lab/pipeline_swarm.py): over an overlay network, each stage forwarding to the next by its
service's name; the manager shows the pipeline with its split; then a CPU hog beside one
stage (lab/injector.py) and the same load again, each stage's latency printed both ways."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lab.injector import DockerHog
from lab.pipeline_swarm import PIPELINE, STAGES, PipelineFlow
from lab.swarm import Swarm
from lab.swarm_cluster import ClusterDaemons, wait_volume_driver

pytestmark = pytest.mark.guest_swarm

TARGET = "20s"  # end to end, mean: loose on the emulated CPU (a stage's request ~0.1-0.5 s)
LOAD = "60:0.5"  # 60 s of Poisson arrivals at 0.5 a second
# The first load lasts until the stages are measured: a stage is measured only in windows
# with requests, and the manager shows no measure of an idle stage.
CALM = "150:0.5"


@pytest.fixture
def flow(swarm: Swarm, tmp_path: Path) -> Iterator[tuple[PipelineFlow, ClusterDaemons]]:
    daemons = ClusterDaemons(swarm, dqoesd_args=["--interval", "2"])
    try:
        wait_volume_driver(swarm)
        flow = PipelineFlow(swarm)
        try:
            yield flow, daemons
        finally:
            flow.remove()
    finally:
        daemons.close()


def _pipeline(doc: dict[str, Any]) -> dict[str, Any] | None:
    return next((p for p in doc.get("pipelines", []) if p["name"] == PIPELINE), None)


def _print(what: str, load: dict[str, Any]) -> None:
    print(what, json.dumps({k: v for k, v in load.items() if k != "outcomes"}))


def test_requests_flow_through_five_stage_services_and_the_manager_splits_the_target(
        swarm: Swarm, flow: tuple[PipelineFlow, ClusterDaemons], tmp_path: Path) -> None:
    pipeline, daemons = flow
    pipeline.create_stages(TARGET)
    placed = {name: next(node for node, tasks in swarm.running_tasks(name).items() if tasks)
              for name in STAGES}
    print("stages placed:", placed)

    with ThreadPoolExecutor(1) as load:
        calm_load = load.submit(pipeline.run_load, tmp_path, CALM, seed=1)

        def split_and_measured(doc: dict[str, Any]) -> bool:
            p = _pipeline(doc)
            shown = p is not None and p["error"] is None and len(p["stages"]) == len(
                STAGES) and all(s["target_s"] and s["replicas"] >= 1 and s["nodes"]
                                and s["measured_s"] is not None for s in p["stages"])
            if not shown and calm_load.done():
                calm_load.result()  # its own failure first
                raise AssertionError(f"the load ended before the stages were measured: {p}")
            return shown

        doc = daemons.wait("the pipeline shown while requests flow, its five stages with a "
                           "share of the target and measured", split_and_measured)
        calm = calm_load.result()
    _print("calm:", calm)
    answered = [o for o in calm["outcomes"] if not o[3]]
    assert answered, calm["errors"]
    for _, latency, hops, _ in answered:
        assert [stage for stage, _ in hops] == list(STAGES)
        assert sum(seconds for _, seconds in hops) <= latency
    p = _pipeline(doc)
    assert p is not None and p["target_s"] == 20.0
    assert sum(s["target_s"] for s in p["stages"]) <= p["target_s"] * 1.001
    print(daemons.table())

    # A CPU hog at 75% of the node of the second stage, and the same load again.
    hogged = placed[STAGES[1]]
    node = swarm.node(hogged)
    hog = DockerHog(node.docker, node.cpus)
    hog.set(0.75)
    try:
        hogged_load = pipeline.run_load(tmp_path, LOAD, seed=1)
    finally:
        hog.remove()
    _print(f"hog at 75% of {hogged}:", hogged_load)
    print("stage: mean latency calm -> hogged (node)")
    for stage in STAGES:
        print(f"  {stage}: {calm['stage_mean_s'].get(stage, float('nan')):.3f} s -> "
              f"{hogged_load['stage_mean_s'].get(stage, float('nan')):.3f} s ({placed[stage]})")
    assert [o for o in hogged_load["outcomes"] if not o[3]], hogged_load["errors"]
    print(daemons.table())
