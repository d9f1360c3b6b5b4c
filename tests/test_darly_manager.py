"""dqoes-manager with a learned scheduler (`--scheduler custom|swarm|fullmap|profile`), built
from its command line and run by its own loop against the stub Swarm API of
tests/fakeswarm.py, its agent's weights loaded from --weights: the agent's action on a
pipeline's stage reaches Swarm as the scaler's would, within the limits (the actions a
minute and the hold, never below one replica, a node an operator paused untouched), and
with --recommend nothing is written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dqoes_cg.cluster import managerd
from dqoes_cg.cluster.darly import ActionSpace, Agent, AgentParams, feature_count
from dqoes_cg.cluster.darly_scaling import DarlyScaling
from dqoes_cg.cluster.manager import Manager
from dqoes_cg.cluster.protocol import ContainerReport, Report
from dqoes_cg.control import ControlServer
from dqoes_cg.sdnotify import Notifier
from tests.fakeswarm import StubEngine, node_doc, service_doc, task_doc
from tests.swarmca import swarm_id
from tests.test_cluster import wait_for

WORKERS = ("node2", "node3", "node4")  # in the agent's node order (by hostname)
STAGES = ("front", "back")
CID = {"front": "a", "back": "b"}  # a stage's containers: CID * 63 + their replica's number
TICKS = 20  # the loop's ticks watched after the first action for a second one
# Actions of every scheduler's space (ActionSpace: 0 nothing, then per stage out, in, moves)
OUT_FRONT, IN_FRONT, MOVE_FRONT = 1, 2, 3
FRONT_ON_NODE4 = 6  # the state's feature: front's replicas on node4 (over the most, 32)


class CountingEngine(StubEngine):
    """The stub engine, counting the manager's reads of Swarm (one a tick)."""

    reads = 0

    def get(self, path: str, query: dict[str, str] | None = None,
            missing_ok: tuple[int, ...] = ()) -> Any:
        if path == "/nodes":
            self.reads += 1
        return super().get(path, query, missing_ok)


class Swarm:
    """node1 the manager; pipeline `video` (target 3 s, mean) of stages front (one replica
    on node2) -> back (node3); node4 idle; `paused` an operator's paused node."""

    def __init__(self, paused: str = "") -> None:
        self.ids = {name: swarm_id() for name in (*STAGES, "node1", *WORKERS)}
        self.engine = CountingEngine({
            "/nodes": [node_doc(self.ids["node1"], "node1", role="manager")] + [
                node_doc(self.ids[n], n, availability="pause" if n == paused else "active")
                for n in WORKERS],
            "/services": [
                service_doc(self.ids["front"], "front", {
                    "dqoes.pipeline": "video", "dqoes.next": "back",
                    "dqoes.pipeline.target": "3s", "dqoes.pipeline.metric": "mean"}),
                service_doc(self.ids["back"], "back", {"dqoes.pipeline": "video"})],
            "/tasks": []})
        self.placed: list[tuple[str, str, str]] = []  # (stage, node, container ID)
        for stage, node in zip(STAGES, WORKERS, strict=False):
            self.run(stage, node)
        self.seq = 0

    def run(self, stage: str, node: str) -> None:
        """A task of `stage` running on `node`, and the service asking for one more."""
        cid = CID[stage] * 63 + str(sum(1 for s, _, _ in self.placed if s == stage) + 1)
        self.placed.append((stage, node, cid))
        self.engine.docs["/tasks"].append(
            task_doc(swarm_id(), self.ids[stage], self.ids[node], cid,
                     slot=len(self.engine.docs["/tasks"]) + 1))
        for doc in self.engine.docs["/services"]:
            if doc["ID"] == self.ids[stage]:
                doc["Spec"]["Mode"]["Replicated"]["Replicas"] = \
                    sum(1 for s, _, _ in self.placed if s == stage)

    def report(self, manager: Manager, now: float | None = None) -> None:
        """Each worker reports its stages' tasks: 2 requests a second answered in 0.5 s
        (mean)."""
        self.seq += 1
        now = time.monotonic() if now is None else now
        for node in WORKERS:
            mine = tuple(ContainerReport(cid, "S", 1.5, "mean", 0.5, 0.5, 0.2, 20, 2.0,
                                         0.2, 0.5, 0.8)
                         for _, on, cid in self.placed if on == node)
            manager.receive(self.ids[node], Report(self.seq, 2.0, 0.2, True, True, None, mine,
                                                   {"cpu": {"some_ratio": 0.1}}), now)

    def updates(self) -> list[tuple[str, dict[str, Any]]]:
        """The services updated: (name, the spec posted)."""
        names = {sid: name for name, sid in self.ids.items()}
        return [(names[path.split("/")[2]], body) for path, _, body in self.engine.posts
                if path.startswith("/services/")]


def weights(directory: Path, scheduler: str, action: int, then: int | None = None
            ) -> np.ndarray:
    """Weights of an agent for `video` (2 stages, 3 nodes) whose best action is `action`,
    or `then` once front runs on node4, saved where the manager loads them: its Q-values
    while front does not."""
    space = ActionSpace(scheduler, len(STAGES), len(WORKERS))
    agent = Agent(feature_count(len(STAGES), len(WORKERS)), space.size, AgentParams(),
                  seed=3)
    for p in agent.online.params:
        p[...] = 0.0
    agent.online.params[-1][...] = np.linspace(0.0, 0.5, space.size)
    agent.online.params[-1][action] = 1.0
    if then is not None:  # a unit of the first hidden layer carries the feature to `then`
        agent.online.params[0][FRONT_ON_NODE4, 0] = 32.0
        agent.online.params[2][0, 0] = 1.0
        agent.online.params[4][0, then] = 2.0
    directory.mkdir(exist_ok=True)
    agent.save(directory / "darly-video.npz")
    return agent.online.params[-1].copy()


@contextmanager
def manager_running(swarm: Swarm, argv: list[str], tmp_path: Path) -> Iterator[Manager]:
    """dqoes-manager as `argv` asks, its loop ticking every 50 ms in a thread."""
    args = managerd.parse([*argv, "--tick", "0.05"])
    manager = managerd.manager_of(args, swarm.engine, swarm.ids["node1"])  # type: ignore[arg-type]
    control = ControlServer(tmp_path / "manager.sock", managerd.handler(manager),
                            managerd.OPERATIONS)
    stopping = threading.Event()
    loop = threading.Thread(target=managerd.serve,
                            args=(manager, control, Notifier(), args.tick, stopping))
    loop.start()
    try:
        yield manager
    finally:
        stopping.set()
        loop.join()
        control.close()


def evaluated(swarm: Swarm, manager: Manager) -> bool:
    """The agent judged the pipeline (its first window), the workers reporting meanwhile."""
    swarm.report(manager)
    darly = manager.scaling
    assert isinstance(darly, DarlyScaling)
    mine = darly.pipelines.get("video")
    return mine is not None and mine.evaluated > -np.inf


def ticks_later(swarm: Swarm, manager: Manager) -> None:
    """Waits for TICKS more of the loop's ticks, the workers reporting meanwhile."""
    until = swarm.engine.reads + TICKS

    def ticked() -> bool:
        swarm.report(manager)
        return swarm.engine.reads >= until

    wait_for(f"{TICKS} more ticks", ticked)


def loaded(manager: Manager, saved: np.ndarray) -> bool:
    darly = manager.scaling
    assert isinstance(darly, DarlyScaling)
    agent = darly.pipelines["video"].agent
    return bool(np.array_equal(agent.q_values(np.zeros(agent.inputs)), saved))


@pytest.mark.parametrize("scheduler", ["custom", "swarm", "fullmap", "profile"])
def test_a_stage_is_scaled_out_once_through_swarms_api(
        scheduler: str, tmp_path: Path) -> None:
    swarm = Swarm()
    saved = weights(tmp_path / "weights", scheduler, OUT_FRONT)
    argv = ["--scheduler", scheduler, "--weights", str(tmp_path / "weights"),
            "--max-scales-per-minute", "1"]
    with manager_running(swarm, argv, tmp_path) as manager:
        def scaled() -> list[tuple[str, dict[str, Any]]]:
            swarm.report(manager)
            return swarm.updates()

        ((name, spec),) = wait_for("the agent's scale out reaching Swarm", scaled)
        assert loaded(manager, saved), "the agent acts with the weights of --weights"
        assert (name, spec["Mode"]["Replicated"]["Replicas"]) == ("front", 2)
        assert manager.scaling.params.max_actions_per_minute == 1  # type: ignore[union-attr]
        assert spec["TaskTemplate"]["Placement"]["Constraints"] == []
        ticks_later(swarm, manager)
    assert len(swarm.updates()) == 1, "one action a window, the stage held"


@pytest.mark.parametrize("cap", [1, 2])
def test_the_actions_a_minute_are_capped_by_the_managers_flag(cap: int,
                                                               tmp_path: Path) -> None:
    """The manager's own tick on a clock of the test's (a minute in milliseconds): front
    scaled out, Swarm carrying it out on node4, then the agent wants back scaled out once
    the hold on front is over (30 s): a second action within the minute, refused at
    --max-scales-per-minute 1."""
    swarm = Swarm()
    out_back = 1 + (2 + ActionSpace("custom", 1, 1).moves)
    weights(tmp_path / "weights", "custom", OUT_FRONT, then=out_back)
    args = managerd.parse(["--scheduler", "custom", "--weights", str(tmp_path / "weights"),
                           "--max-scales-per-minute", str(cap)])
    manager = managerd.manager_of(args, swarm.engine, swarm.ids["node1"])  # type: ignore[arg-type]
    start = time.monotonic()
    manager.tick(start - 1.0)  # Swarm's tasks read: the nodes' reports of them are taken
    for after in range(0, 60, 5):
        if after == 5:
            assert [(n, s["Mode"]["Replicated"]["Replicas"]) for n, s in swarm.updates()] \
                == [("front", 2)]
            swarm.run("front", "node4")  # Swarm started the new task
        swarm.report(manager, start + after)
        manager.tick(start + after)
    scaled = [(n, s["Mode"]["Replicated"]["Replicas"]) for n, s in swarm.updates()]
    assert scaled == [("front", 2)] + ([("back", 2)] if cap == 2 else [])


def test_a_move_off_a_stages_node_leaves_the_destination_to_swarm(tmp_path: Path) -> None:
    swarm = Swarm()
    weights(tmp_path / "weights", "swarm", MOVE_FRONT)
    argv = ["--scheduler", "swarm", "--weights", str(tmp_path / "weights")]
    with manager_running(swarm, argv, tmp_path) as manager:
        def moved() -> list[tuple[str, dict[str, Any]]]:
            swarm.report(manager)
            return swarm.updates()

        ((name, spec),) = wait_for("the agent's move reaching Swarm", moved)
    assert (name, spec["Mode"]["Replicated"]["Replicas"]) == ("front", 1)
    assert spec["TaskTemplate"]["Placement"]["Constraints"] == [
        f"node.id!={swarm.ids['node2']}"]


@pytest.mark.parametrize(("case", "action", "paused", "extra"), [
    ("a scale in at one replica", IN_FRONT, "", []),
    ("a move off a paused node", MOVE_FRONT, "node2", []),
    ("a move onto a paused node", MOVE_FRONT, "node3", []),
    ("a scale out, recommended only", OUT_FRONT, "", ["--recommend"]),
])
def test_custom_writes_nothing(case: str, action: int, paused: str, extra: list[str],
                               tmp_path: Path) -> None:
    swarm = Swarm(paused=paused)
    saved = weights(tmp_path / "weights", "custom", action)
    argv = ["--scheduler", "custom", "--weights", str(tmp_path / "weights"), *extra]
    with manager_running(swarm, argv, tmp_path) as manager:
        wait_for("the agent judging the pipeline", lambda: evaluated(swarm, manager))
        assert loaded(manager, saved)
        ticks_later(swarm, manager)
        view = manager.view()
    assert swarm.engine.posts == [], case
    assert view is not None
    if "--recommend" in extra:
        assert [r.what for r in view.recommended if "darly scaling out 1 -> 2" in r.what]
