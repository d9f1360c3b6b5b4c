"""The real cluster experiment's host side (bench/cluster/testbed.py): the nodes'
observations assembled window by window, the runs kept as JSON, and the report from them.
The run itself is the swarm guest's (tests/test_cluster_swarm.py runs it, quick)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.cluster.run import ClusterRun
from bench.cluster.testbed import RAW, WINDOW_S, assemble, main, scaled_scenario

START = 1000.0  # the monotonic clock at the first arrival


def _line(t: float, *tasks: tuple[str, float, float | None, float]) -> dict[str, Any]:
    """One node_observer line at START + t: (service, created, latency, usage) per task."""
    return {"t": START + t, "tasks": [
        {"service": s, "container": f"{s}-{created}", "created": created, "latency_s": lat,
         "requests": 10, "usage_cores": use} for s, created, lat, use in tasks]}


def test_observations_become_windows_with_the_newest_task_and_its_moves() -> None:
    sc = scaled_scenario(quick=True)
    first, second, _ = (c.name for c in sc.containers)
    node1 = [_line(WINDOW_S * k - 0.5, (first, 1, 0.2, 0.25)) for k in range(1, 5)]
    node2 = [_line(WINDOW_S * 3 - 0.5, (second, 2, 0.4, 0.1)),
             _line(WINDOW_S * 4 - 0.5, (second, 2, None, 0.1), (first, 5, 0.3, 0.2))]
    run = assemble(sc, "placement", START, [node1, node2, []], [(0.0, [False, True, False])])
    assert run.latency_s.shape == run.node.shape == (int(sc.duration_s // WINDOW_S), 3)
    assert run.node[:5, 0].tolist() == [0, 0, 0, 1, 1], "the newest task wins, then stays"
    assert run.latency_s[3, 0] == 0.3 and np.isnan(run.latency_s[4, 0])
    assert run.node[:4, 1].tolist() == [-1, -1, 1, 1] and np.isnan(run.latency_s[3, 1])
    assert [(m.service, m.source, m.destination, m.at_s) for m in run.moves] == [
        (first, "node1", "node2", 4 * WINDOW_S)]
    assert run.paused[-1].tolist() == [False, True, False]
    assert run.notes["work_s"][0] == [0.2 * 0.25] * 4 + [0.3 * 0.2]

    again = ClusterRun.from_json(json.loads(json.dumps(run.to_json())))
    assert np.array_equal(again.latency_s, run.latency_s, equal_nan=True)
    assert np.array_equal(again.node, run.node) and again.moves == run.moves
    assert again.containers == run.containers


def test_the_report_judges_the_real_runs_and_the_simulated_ones(tmp_path: Path) -> None:
    sc = scaled_scenario(quick=True)
    targets = [c.target_s for c in sc.containers]
    steps = range(1, int(sc.duration_s // WINDOW_S) + 1)
    runs = []
    for way, factor in (("default", 2.0), ("per-node", 1.0), ("placement", 1.0)):
        lines = [_line(WINDOW_S * k - 0.5, *((c.name, 1, target * factor, 0.2)
                                             for c, target in zip(sc.containers, targets,
                                                                  strict=True)))
                 for k in steps]
        runs.append(assemble(sc, way, START, [lines, [], []], []).to_json())
    (tmp_path / RAW).write_text(json.dumps({"units_per_ms": 1.0, "runs": runs}))
    assert main(["--quick", "--report", "--out", str(tmp_path)]) == 0
    real, simulated = json.loads((tmp_path / "summary.json").read_text()).values()
    assert [r["final_s"] for r in real["runs"]] == [0, 3, 3]
    assert [r["way"] for r in simulated["runs"]] == ["default", "per-node", "placement"]
    assert (tmp_path / "c2-testbed.png").stat().st_size > 0
