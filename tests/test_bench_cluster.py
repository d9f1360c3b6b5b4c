"""The cluster experiment's smoke test (python -m bench.cluster --quick): the three ways
simulated, judged against the cluster oracle, and reported."""

from __future__ import annotations

import json
from pathlib import Path

from bench.cluster.__main__ import main


def test_the_cluster_experiment_runs_three_ways_and_reports(tmp_path: Path) -> None:
    assert main(["--quick", "--policies", "dqoes", "--out", str(tmp_path)]) == 0
    (result,) = json.loads((tmp_path / "summary.json").read_text()).values()
    runs = {run["way"]: run for run in result["runs"]}
    assert list(runs) == ["default", "per-node", "placement"]
    assert all(run["best_s"] <= result["oracle"] <= result["containers"]
               for run in runs.values()), "no way beats the oracle"
    assert runs["default"]["moves"] == runs["per-node"]["moves"] == 0
    assert (tmp_path / "c1-paper-scale.png").stat().st_size > 0
    assert "Cluster oracle (free placement)" in (tmp_path / "summary.md").read_text()
