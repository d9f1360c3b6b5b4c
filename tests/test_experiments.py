"""The experiments' simulator and analysis on the host: the paper's invariants hold, the
oracle and the default platform count what they should, and `--sim-only --quick` writes
the whole report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.experiments.__main__ import main, simulated
from bench.experiments.analysis import default_satisfied, oracle, outcome
from bench.experiments.scenarios import NOMINAL_CURVES, PAPER_PARAMS, paper_scenarios
from bench.experiments.sim import Container, Curve, Node, water_fill
from bench.experiments.trace import Run
from dqoes_cg.policy import Cls

CURVES = NOMINAL_CURVES
SCENARIOS = {sc.key: sc for sc in paper_scenarios(quick=True)}


def _runs(key: str, duration: float = 600.0) -> tuple[Run, Run]:
    sc = SCENARIOS[key]
    nodes = sc.build(CURVES)
    return (simulated(sc, nodes, CURVES, PAPER_PARAMS, duration, 5.0),
            simulated(sc, nodes, CURVES, None, duration, 5.0))


def test_water_fill_is_work_conserving_and_fair() -> None:
    assert water_fill(2.0, np.array([1.0, 1.0, 1.0, 1.0])).tolist() == [0.5] * 4
    alloc = water_fill(2.0, np.array([0.1, 1.0, 1.0, 0.0]))
    assert alloc == pytest.approx([0.1, 0.95, 0.95, 0.0])
    assert water_fill(2.0, np.array([0.3, 0.3])).tolist() == [0.3, 0.3]  # caps bind


def test_identical_unachievable_targets_stay_in_b_at_an_even_share() -> None:
    dqoes, default = _runs("s1-identical-unachievable")
    classes = dqoes.classes()[-1]
    assert (classes == Cls.B).all()
    assert dqoes.usage_cores[-1] == pytest.approx(np.full(10, 0.2), abs=0.01)
    assert outcome(dqoes).final_s == outcome(default).final_s == 0


def test_identical_achievable_targets_all_end_in_s() -> None:
    dqoes, default = _runs("s2-identical-achievable")
    assert outcome(dqoes).final_s == 10
    assert outcome(default).final_s == 0
    node = dqoes.nodes[0]
    assert oracle(node, CURVES) == 10
    assert default_satisfied(node, CURVES) == 0


def test_default_count_matches_the_even_share_prediction() -> None:
    for key in ("s3-varied-burst", "s5-cluster"):
        _, default = _runs(key, 400.0)
        predicted = sum(default_satisfied(nd, CURVES) for nd in default.nodes)
        assert outcome(default).final_s == predicted


def test_oracle_counts_the_floor_and_the_budget() -> None:
    solo = CURVES["tiny"].solo_s
    curves = {"tiny": Curve(solo)}

    def node(*targets: float) -> Node:
        return Node(2.0, tuple(Container(f"c{i}", "tiny", t * solo)
                               for i, t in enumerate(targets)))

    assert oracle(node(4.0, 4.0, 4.0, 4.0), curves) == 4  # 0.25 CPU each fits
    assert oracle(node(0.5, 1.5), curves) == 1  # below the solo latency: never
    assert oracle(node(20.0, 4.0, 4.0, 4.0), curves) == 3  # 0.05 CPU < the floor 0.25
    assert oracle(node(1.3, 1.3, 1.3, 1.3), curves) == 2  # 0.7 CPU each: two fit


def test_run_round_trips_through_json(tmp_path: Path) -> None:
    dqoes, _ = _runs("s2-identical-achievable", 60.0)
    dqoes.save(tmp_path / "run.json")
    back = Run.load(tmp_path / "run.json")
    assert back.nodes == dqoes.nodes
    np.testing.assert_allclose(back.latency_s, dqoes.latency_s)
    assert (back.satisfied() == dqoes.satisfied()).all()


def test_sim_only_quick_writes_the_report(tmp_path: Path) -> None:
    assert main(["--sim-only", "--quick", "--out", str(tmp_path)]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "s5-cluster" in summary and "oracle" in summary
    assert (tmp_path / "summary.json").exists()
    assert (tmp_path / "s2-identical-achievable.png").stat().st_size > 0
    assert (tmp_path / "calibration.png").exists()
