"""The manager's scale benchmark (python -m bench.cluster.manager_scale) at 5 nodes of 10
containers: the real manager in its own process, agents over mutual TLS on loopback; every
figure is there and sane (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.cluster.manager_scale import main


def test_the_manager_scale_benchmark_measures_every_figure(tmp_path: Path) -> None:
    assert main(["--nodes", "5", "--containers", "10", "--steady", "2", "--statuses", "1",
                 "--decisions", "2", "--out", str(tmp_path)]) == 0
    (run,) = json.loads((tmp_path / "manager_scale.json").read_text())["runs"]
    assert (run["nodes"], run["containers"], run["agent_errors"]) == (5, 10, 0)
    assert "error" not in run
    # The process's CPU counts in 10 ms ticks: on a busy host a 2 s window of 5 nodes may
    # see none of them (cpu_ms_per_report 0.0 at a load of 12).
    assert run["reports"] > 0 and run["cpu_ms_per_report"] >= 0 and run["tick_cpu_per_s"] >= 0
    assert "reports_cpu_ms" in run
    assert run["rss_mb"] > 0 and run["peak_rss_mb"] >= run["rss_mb"]
    for figure in ("round_trip_ms", "view_tick_ms", "status_ms", "seen_ms"):
        assert run[figure] > 0, figure
    assert run["decided_ms"] >= run["seen_ms"], "placement decides on a view that shows it"
    table = (tmp_path / "manager_scale.md").read_text()
    assert "| manager CPU per report, ticks apart (ms) |" in table
