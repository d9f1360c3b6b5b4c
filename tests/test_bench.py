"""Smoke tests of the benchmarks (bench/): every part runs at tiny N and the report is
written, so the bench cannot rot. No timing is asserted: only that figures exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import (
    applying,
    dead_band,
    docker,
    hierarchy,
    policy_loop,
    report,
    ring_bench,
    sampling,
    tick,
)
from bench.__main__ import main
from bench.report import Results
from bench.timing import FAKE, HOST, NotMeasured, Row, Stats

KERNEL_PARTS = {sampling.PART, applying.PART, tick.PART, hierarchy.PART}


def _cases(res: Results, where: str) -> set[tuple[str, str]]:
    return {(r.part, r.case) for r in res.rows if r.where == where}


def test_quick_run_on_the_host_writes_the_report(tmp_path: Path) -> None:
    assert main(["--quick", "--part", "host", "--out", str(tmp_path)]) == 0

    res = Results.from_json(json.loads((tmp_path / "results.json").read_text()))
    assert {r.part for r in res.rows if r.where == HOST} == {ring_bench.PART, policy_loop.PART}
    idle = next(r for r in res.rows if r.part == ring_bench.PART
                and r.versus == ring_bench.SYSCALL)
    assert "read system calls per drain" in idle.note
    fake = _cases(res, FAKE)
    for part, case in [(sampling.PART, sampling.OURS), (sampling.PART, sampling.PER_FILE),
                       (sampling.PART, sampling.PSUTIL), (applying.PART, applying.OURS),
                       (applying.PART, applying.PER_FILE), (tick.PART, tick.SENSE),
                       (tick.PART, tick.WRITE_ALL),
                       *((tick.PART, tick.part_case(case, label)) for case in tick.PROFILED
                         for label in (*tick.PARTS, tick.REST))]:
        assert (part, case) in fake
    assert all(r.median_s >= 0 and r.p10_s <= r.median_s <= r.p90_s for r in res.rows)
    assert all(r.median_s > 0 for r in res.rows if r.role != "part")
    assert [d.where for d in res.daemon] == [FAKE]
    assert res.daemon[0].ticks >= 1 and res.daemon[0].rss_mb > 0
    assert set(res.places) == {HOST, FAKE}

    text = (tmp_path / "REPORT.md").read_text()
    for heading in ("## Targets", "## 1. Sampling", "## 2. Applying", "## 3. The latency ring",
                    "## 4. The policy", "## 5. A whole tick", "## 6. Docker's tools",
                    "## Not measured"):
        assert heading in text
    assert f"{FAKE}: {tick.WRITE_ALL}" in text  # the profile of the tick
    for plot in ("tick_cost.png", "tick_per_container.png"):
        assert (tmp_path / plot).read_bytes().startswith(b"\x89PNG")


def _row(part: str, case: str, median: float, n: int, role: str = "ours",
         versus: str | None = None, where: str = FAKE) -> Row:
    return Row.of(part, case, Stats(median, median, median, 3), where=where, n=n, role=role,
                  versus=versus)


def test_targets_are_checked_against_the_figures_of_their_place() -> None:
    res = Results(rows=[
        _row(sampling.PART, sampling.OURS, 1e-3, 1000),
        _row(sampling.PART, sampling.PER_FILE, 10e-3, 1000, "baseline", sampling.OURS),
        _row(tick.PART, tick.WRITE_ALL, 1e-3, 1000), _row(tick.PART, tick.SENSE, 5e-4, 1000),
        _row(policy_loop.PART, policy_loop.OURS, 1e-4, 100, where=HOST),
    ], not_measured=[NotMeasured(docker.PART, docker.STATS, "no engine", "2 s", 2.0)])
    checks = report.check_targets(res)

    def check(prefix: str) -> report.Check:
        return next(c for c in checks if c.target.startswith(prefix))

    assert check("whole tick").met is True  # 1 ms
    python = check("sampling >= 20x")
    assert (python.figure, python.met) == ("10.0x", False)
    stats = check("sampling >= 10,000x")  # 2 s against 1 µs per cgroup, a reference figure
    assert (stats.figure, stats.met) == ("2,000,000x", True)
    assert "NOT measured" in stats.note
    assert check("sense-only tick").met is True  # 0.5 ms
    assert check("vectorized policy").met is None  # not run at N=1000


def test_docker_figures_measured_replace_the_reference() -> None:
    where = docker.place("systemd")
    res = Results(rows=[
        _row(docker.PART, docker.SAMPLE, 1e-4, 100, where=where),
        _row(docker.PART, docker.STATS, 3.0, 100, "baseline", docker.SAMPLE, where=where),
        _row(docker.PART, docker.APPLY, 1e-3, 100, where=where),
        _row(docker.PART, docker.UPDATE_EACH, 50.0, 100, "baseline", docker.APPLY, where),
    ], not_measured=[NotMeasured(docker.PART, docker.STATS, "no engine", "2 s", 2.0)])
    [check] = [c for c in report.check_targets(res) if "docker stats" in c.target]
    assert (check.where, check.figure, check.met) == (where, "30,000x", True)
    text = report.markdown(res, [])
    assert "| 100 | docker update --cpus (one call per container) | 50 s |" in text


@pytest.mark.guest_systemd
def test_quick_docker_part_against_a_real_engine(tmp_path: Path) -> None:
    out = tmp_path / "docker.json"
    assert main(["--quick", "--part", "docker", "--json", str(out)]) == 0

    res = Results.from_json(json.loads(out.read_text()))
    assert set(res.places) == {docker.place(driver) for driver in docker.DRIVERS}
    for where in res.places:
        assert {r.case for r in res.rows if r.where == where} == {
            docker.STATS, docker.SAMPLE, docker.UPDATE_EACH, docker.UPDATE_ALL, docker.APPLY}
    assert all(r.median_s > 0 for r in res.rows)


@pytest.mark.kernel
def test_quick_kernel_part_on_a_real_cgroup(cgroup2_mount: Path, tmp_path: Path) -> None:
    out = tmp_path / "kernel.json"
    assert main(["--quick", "--part", "kernel", "--json", str(out)]) == 0

    res = Results.from_json(json.loads(out.read_text()))
    assert {r.part for r in res.rows} == KERNEL_PARTS
    assert all(r.where != FAKE for r in res.rows)
    assert all(r.median_s > 0 for r in res.rows if r.role != "part")
    assert len(res.daemon) == 1 and res.daemon[0].ticks >= 1
    assert not list(cgroup2_mount.glob("dqoes-bench-*"))  # the benchmark cgroups are gone


def test_the_dead_band_writes_fewer_limits_for_the_same_s() -> None:
    # A steady node of 200 containers: the band cuts the writes of every decision by more
    # than half, and |S| by less than 3% (bench/results/dead_band.md has the full run).
    every = dead_band.run(200, 0.0, 24, drift=0.0)
    banded = dead_band.run(200, dead_band.DEAD_BAND, 24, drift=0.0)
    assert banded["writes_per_decision"] < 0.5 * every["writes_per_decision"]
    assert banded["satisfied"] >= 0.97 * every["satisfied"]
