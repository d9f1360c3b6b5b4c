"""The real pipeline experiment's host side (bench/cluster/pipeline_testbed.py): each way's
requests and replica counts judged window by window, the reactions to a hog raised, and
the report. The run itself is the swarm guest's (`python -m bench.cluster.pipeline_testbed`);
tests/test_pipeline_swarm.py runs the same pipeline there."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench.cluster.pipeline_testbed import RAW, SETTLE_S, WINDOW_S, judge, main

START = 5000.0  # the load's start, unix seconds
PHASES = ["100:1", "100:2"]  # 200 s: ten windows, four judged


def _run(way: str, latency: list[float], replicas: list[int]) -> dict[str, Any]:
    """A way's raw record: one request a second, each window's at `latency[window]` (inf:
    a failed one among them), `replicas[window]` running on node1 and node2."""
    outcomes = []
    for t in range(200):
        x = latency[int(t // WINDOW_S)]
        outcomes.append([t + 0.5, x if math.isfinite(x) else math.nan, [],
                         "" if math.isfinite(x) else "timed out"])
    samples = [(START + t, {"a": {"node1": replicas[int(t // WINDOW_S)] - 1, "node2": 1}})
               for t in range(0, 200, 5)]
    return {"way": way, "target_s": 2.0, "phases": PHASES, "manager_table": "",
            "load": {"start_unix": START, "outcomes": outcomes}, "replicas": samples,
            "hogs": {"node1": {"start_unix": START - 10.0, "changes": [
                [0.0, 0.25], [150.0, 0.75], [170.0, 0.25], [185.0, 0.5]], "errors": []}}}


def test_windows_are_judged_after_settling_and_each_raised_hog_is_followed() -> None:
    assert SETTLE_S == 6 * WINDOW_S, "the windows below assume it"
    latency = [9.0] * 6 + [1.0, 3.0, math.inf, 1.5]
    j = judge(_run("dqoes", latency, [2] * 5 + [3] * 5))
    assert (j.judged, j.violations, j.held) == (4, 2, 0.5)
    assert j.latency_s[8] == math.inf and j.latency_s[:2] == [9.0, 9.0]
    assert j.replicas == [2.0] * 5 + [3.0] * 5 and j.nodes == [2.0] * 10
    assert j.replica_s == 200 * 2.5
    # raised before the load (not counted), at 140 s (window 7: held again in window 9) and
    # at 175 s (window 8); lowered at 160 s (not counted)
    assert [(r["at_s"], r["level"], r["windows_to_hold"]) for r in j.reactions] == [
        (140.0, 0.75, 2), (175.0, 0.5, 1)]


def test_the_report_is_written_from_the_raw_runs(tmp_path: Path) -> None:
    runs = [_run("dqoes", [1.0] * 10, [5] * 10), _run("fixed", [1.0] * 10, [15] * 10),
            _run("default", [1.0] * 6 + [9.0] * 4, [5] * 10)]
    (tmp_path / RAW).write_text(json.dumps({"nodes": {"node1": 0.5, "node2": 0.75},
                                            "calibration": {"e2e_mean_s": 0.7}, "runs": runs}))
    assert main(["--report", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "| dqoes | 100% | 0 of 4 | 1,000 |" in text
    assert "| default | 0% | 4 of 4 |" in text
    assert (tmp_path / "pipeline-testbed.png").stat().st_size > 0
