"""bench/limit_modes.py: each mode writes what it says into a real cgroup, a short run
measures every mode beside its reference, and the summary pairs each with the reference
of the same interval. No latency is asserted."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from bench import limit_modes
from bench.limit_modes import MODES, REFERENCE, WEIGHT, Point, markdown, ratios


def _point(mode: str, worker: str, p95: float, rep: int = 0, phase: str = "cpu.max") -> Point:
    return Point("closed", phase, mode, worker, 0.3, rep, 100, p95 / 2, p95 / 2, p95,
                 p95 * 1.2, 0.3, 0.5)


def test_each_mode_is_judged_against_the_reference_of_the_same_interval() -> None:
    burst = MODES[3].name
    points = [_point(REFERENCE.name, "ref", 1.0, 0), _point(burst, "w3", 0.5, 0),
              _point(REFERENCE.name, "ref", 4.0, 1), _point(burst, "w3", 2.0, 1),
              _point(REFERENCE.name, "ref", 2.0, 2), _point(burst, "w3", 3.0, 2)]
    table = ratios(points)
    assert table[("closed", burst, 0.3)]["p95_s_ratio"] == 0.5  # median of 0.5, 0.5, 1.5
    assert table[("closed", REFERENCE.name, 0.3)]["p95_s_ratio"] == 1.0
    assert table[("closed", burst, 0.3)]["p95_s"] == 2.0
    text = markdown(points, "nowhere", 0.1)
    assert f"| {burst} | 0.50 / 0.50 / 0.50; 2000 ms; 0.30; 50% |" in text


@pytest.mark.kernel
def test_modes_write_their_files_and_a_short_run_measures_each(tmp_path: Path) -> None:
    from lab.cgroups import cgroup2_cpu_mount

    mount = cgroup2_cpu_mount()
    assert mount is not None
    cg = mount / f"dqoes-limit-modes-test-{os.getpid()}"
    cg.mkdir()
    try:
        MODES[2].apply(cg, 0.3, 2.0)  # period 5 ms
        assert (cg / "cpu.max").read_text().split() == ["1500", "5000"]
        assert (cg / "cpu.weight").read_text().strip() == "150"
        MODES[3].apply(cg, 0.3, 2.0)  # 100 ms + burst
        assert (cg / "cpu.max").read_text().split() == ["30000", "100000"]
        if (cg / "cpu.max.burst").exists():
            assert (cg / "cpu.max.burst").read_text().strip() == "30000"
        WEIGHT.apply(cg, 0.3, 2.0)
        assert (cg / "cpu.max").read_text().split()[0] == "max"
    finally:
        cg.rmdir()

    points = limit_modes.measure("closed", (0.3,), 3.0, 1, tmp_path, math.nan)
    assert {p.mode for p in points} == {m.name for m in MODES}
    assert len(points) == 8  # two phases of four workers
    assert all(p.requests > 0 and p.usage_cpus > 0 for p in points)
    assert all(p.throttled == 0 for p in points if p.mode == WEIGHT.name)
    assert markdown([replace(p) for p in points], "guest", 0.1).count("| cpu.") == len(MODES)
