"""The FlowCon simulator and its bench on the host, at a small size (no timing asserted):
the model's rules, FlowCon's lists and caps in it, and python -m bench.flowcon --quick."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.flowcon.__main__ import MODELS, THREE_JOBS, compare, main, summary
from bench.flowcon.real import satisfied
from bench.flowcon.sim import Job, Model, simulate
from dqoes_cg.policy import Cls


def test_a_job_alone_runs_at_its_demand_and_finishes_its_work() -> None:
    model = Model(work_s=30.0, tau_s=10.0, demand=0.6)
    for flowcon in (False, True):
        r = simulate([Job("a", "m", 5.0)], {"m": model}, flowcon=flowcon)
        assert abs(r.completion_s[0] - 30.0 / 0.6) < 1.0
        assert np.allclose(r.cores[(r.t > 7) & (r.t < 50), 0], 0.6)


def test_flowcon_caps_a_flattened_job_for_a_new_one_and_conserves_work() -> None:
    default, flowcon = (simulate(THREE_JOBS, MODELS, flowcon=f) for f in (False, True))
    assert not np.isnan(flowcon.finish_s).any()
    assert np.isnan(default.limit).all() and (default.lists == 0).all()
    # The paper's 3-job figure: once Job-2 has joined, Job-1 (flattened) goes to CL with a
    # cap at its floor or more, while Job-2 (new, in NL) has none below the worker.
    after = (flowcon.t > 60) & (flowcon.t < 80)
    assert (flowcon.lists[after, 0] == Cls.CL).all()
    assert (flowcon.limit[after, 0] < 0.5).all() and (flowcon.limit[after, 0] >= 0.25).all()
    assert (flowcon.lists[after, 1] == Cls.NL).all()
    shared = default.cores[(default.t > 60) & (default.t < 80), 1]
    assert flowcon.cores[after, 1].min() > shared.max()
    # CFS stays work-conserving under caps: the worker is as busy, the makespan close.
    assert abs(flowcon.makespan_s - default.makespan_s) < 0.05 * default.makespan_s


def test_the_bench_writes_its_tables(tmp_path: Path) -> None:
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "## The 3-job run" in text and "## The 10-job run" in text
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert len(doc["three_jobs"]["jobs"]) == 3 and len(doc["ten_jobs"][0]["jobs"]) == 10
    assert all(j["flowcon_s"] > 0 and j["default_s"] > 0 for j in doc["ten_jobs"][0]["jobs"])


def _mixed_run(platform: str, latency: list[float], completion: list[float]) -> dict:
    """A real run's record as bench.flowcon.real.run writes it: two services, two jobs."""
    windows = [{"t": t, "usage_cores": [0.2] * 4, "limit_cores": [None] * 4,
                "latency_s": [None if t < 10 else latency[0], latency[1]]}
               for t in range(2, 200, 2)]
    return {"platform": platform,
            "services": [{"name": "a", "model": "tiny", "target_s": 0.1},
                         {"name": "b", "model": "tiny", "target_s": 0.2}],
            "jobs": [{"name": f"Job-{k}", "model": "fast", "epochs": 10, "arrival_s": 0.0,
                      "completion_s": c} for k, c in enumerate(completion)],
            "makespan_s": max(completion), "windows": windows}


def test_the_mixed_run_is_judged_until_the_first_job_ends_and_tabled() -> None:
    runs = {"default": _mixed_run("default", [0.06, 0.3], [100.0, 150.0]),
            "targets": _mixed_run("targets", [0.1, 0.21], [100.0, 150.0]),
            "flowcon": _mixed_run("flowcon", [0.105, 0.19], [80.0, 120.0])}
    runs["flowcon"]["windows"][-1]["latency_s"] = [5.0, 5.0]  # after both jobs: not judged
    for r in runs.values():
        r["satisfied"] = satisfied(r)
    assert [runs[k]["satisfied"]["median"] for k in ("default", "targets", "flowcon")] \
        == [0, 2, 2]
    assert runs["flowcon"]["satisfied"]["latency_over_target"] == pytest.approx([1.05, 0.95])
    assert runs["default"]["satisfied"]["windows"] == len(range(30, 101, 2))
    text = summary(compare(THREE_JOBS), [compare(THREE_JOBS)], {
        "where": "here", "node_cpus": 1.0, "mixed": runs,
        **{k: _mixed_run(k, [0.1, 0.2], [10.0, 20.0]) for k in ("default", "flowcon")}})
    table = text.split("## Services and training jobs on one node")[1]
    assert "| dqoesd, services and jobs (FlowCon) | 2 of 2 (2) | 1.05, 0.95 | 80.0 s (-20.0%)" \
        in table
    assert "a 100 ms, b 200 ms" in table
