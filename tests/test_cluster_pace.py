"""Back-pressure: the report interval the manager asks of the agents (pace.py), from the
CPU time it measured, carried by its acknowledgements, taken by the agents within bounds;
and a node's reports taken no faster than the interval allows. Fed measured windows, never
timed."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dqoes_cg.cluster import manager as manager_module
from dqoes_cg.cluster import pace as pace_module
from dqoes_cg.cluster.agent import Agent, ManagerLink
from dqoes_cg.cluster.manager import MIN_GAP, Manager
from dqoes_cg.cluster.pace import BASE_INTERVAL_S, MAX_INTERVAL_S, SHARE_CORES, Pace
from dqoes_cg.cluster.protocol import Ack, ProtocolError, parse
from dqoes_cg.jsonline import encode
from tests.fakeswarm import StubEngine
from tests.test_cluster_scale import node_id, report, swarm

if TYPE_CHECKING:
    from dqoes_cg.cluster.protocol import Message

NODES = 1000


def window(pace: Pace, report_ms: float, tick_cores: float = 0.1, nodes: int = NODES,
           late_s: float = 0.0) -> float:
    """One second in which every node reported once per interval asked, each report
    costing `report_ms` of CPU."""
    reports = round(nodes / pace.interval_s)
    cpu = tick_cores + reports * report_ms / 1e3
    return pace.update(1.0, cpu, tick_cores, reports, nodes, late_s)


def test_the_interval_stretches_until_the_reports_fit_and_comes_back_when_they_do() -> None:
    pace = Pace()
    for _ in range(5):
        window(pace, 1.5)  # 1.5 cores of reports at 1 s: more than one core
    fitting = NODES * 1.5e-3 / (SHARE_CORES - 0.1)
    assert pace.interval_s == pytest.approx(fitting, rel=0.2)
    assert pace.asked() == pace.interval_s

    for _ in range(5):
        window(pace, 20.0)  # reports that cost more than MAX_INTERVAL_S can hold
    assert pace.interval_s == MAX_INTERVAL_S

    # cheap again: back to the agents' own, by at most SHRINK a step
    steps = [window(pace, 0.05) for _ in range(40)]
    assert steps[-1] == BASE_INTERVAL_S and pace.asked() is None
    assert all(b >= pace_module.SHRINK * a for a, b in pairwise(steps))


def test_a_tick_that_starts_late_stretches_the_interval_whatever_the_model() -> None:
    pace = Pace()
    window(pace, 0.1)
    assert pace.interval_s == BASE_INTERVAL_S  # the model: 0.1 core of reports, room
    for _ in range(3):
        window(pace, 0.1, late_s=2 * pace_module.LATE_S)
    assert pace.interval_s == pytest.approx(pace_module.STRETCH_LATE ** 3)
    for _ in range(100):
        window(pace, 0.1, late_s=10.0)
    assert pace.interval_s == MAX_INTERVAL_S


def test_a_node_is_late_after_three_intervals_asked() -> None:
    pace = Pace()
    assert pace.node_timeout(5.0) == 5.0
    pace.interval_s = 4.0
    assert pace.node_timeout(5.0) == 12.0


def test_the_acknowledgement_asks_the_interval_and_the_next_report_is_due_after_a_gap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager_module, "PACE_WINDOW_S", math.inf)  # the interval as set
    manager = Manager(swarm(2), "m" * 25)
    manager.tick(100.0)
    assert manager.report_due(node_id(0)) == -float("inf")  # never reported: at once
    assert manager.receive(node_id(0), report(0), 100.0).interval_s is None
    assert manager.report_due(node_id(0)) == 100.0 + MIN_GAP * BASE_INTERVAL_S

    manager.pace.interval_s = 6.0
    ack = manager.receive(node_id(0), report(0, 2), 101.0)
    assert ack.interval_s == 6.0
    assert parse(encode(ack.to_json())) == ack
    assert manager.report_due(node_id(0)) == 101.0 + MIN_GAP * 6.0
    # reachable for three intervals asked, though past the node timeout
    view = manager.tick(101.0 + 2 * 6.0)
    assert next(n for n in view.nodes if n.id == node_id(0)).reachable


def test_an_older_manager_s_acknowledgement_asks_nothing() -> None:
    assert parse(b'{"v":1,"type":"ack","seq":3,"refused":[]}') == Ack(3, ())


@pytest.mark.parametrize("asked", [-1.0, float("inf"), "2", True])
def test_a_bad_interval_is_a_protocol_error(asked: object) -> None:
    line = encode({"v": 1, "type": "ack", "seq": 3, "refused": [], "interval_s": asked})
    with pytest.raises(ProtocolError):
        parse(line)


def test_the_agent_reports_at_the_longest_interval_asked_within_its_bounds(tmp_path: Path
                                                                            ) -> None:
    agent = Agent(StubEngine({}), tmp_path / "dqoesd.sock")
    links = {m: ManagerLink(m, "127.0.0.1", 1, None)  # type: ignore[arg-type]
             for m in ("a" * 25, "b" * 25)}
    agent.links = links
    assert agent.interval(1.0) == 1.0  # nothing asked: its own
    links["a" * 25].interval_s = 3.0
    links["b" * 25].interval_s = 2.0
    assert agent.interval(1.0) == 3.0
    assert agent.interval(5.0) == 5.0  # never shorter than its own
    links["b" * 25].interval_s = 1e6
    assert agent.interval(1.0) == MAX_INTERVAL_S  # a manager cannot silence it
    links["b" * 25].interval_s = 0.01
    assert agent.interval(1.0) == 3.0


class ScriptedChannel:
    """A channel whose receive() plays `script` (a message, or None: nothing came), then
    stops the link."""

    def __init__(self, link: ManagerLink, script: list[Message | None]) -> None:
        self.link, self.script = link, script
        self.sent: list[int] = []

    def send(self, message: Message, timeout: float) -> None:
        self.sent.append(message.seq)  # type: ignore[union-attr]

    def receive(self, timeout: float) -> Message | None:
        if len(self.script) == 1:
            self.link._stopping.set()
        self.link.offer(report(0, len(self.sent) + 10 * len(self.script)))
        return self.script.pop(0)


def test_a_manager_has_one_report_of_the_agent_unanswered_at_most() -> None:
    link = ManagerLink("a" * 25, "127.0.0.1", 1, None)  # type: ignore[arg-type]
    link.offer(report(0, 1))
    # newer reports are offered at every turn; two turns without an answer, then one
    channel = ScriptedChannel(link, [None, None, Ack(1, (), 4.0), None, Ack(99, ())])
    link._converse(channel)  # type: ignore[arg-type]
    assert len(channel.sent) == 2  # the first, and after its answer the latest
    assert channel.sent[1] > 1
    assert link.interval_s is None  # the latest answer asks for the agent's own
