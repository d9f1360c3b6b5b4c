"""Smoke tests of the control-plane benchmarks (bench/scale.py, bench/soak.py): each runs
for seconds at tiny sizes and writes its report, so that neither can rot. No figure is
asserted, only that there are figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import scale, soak


def test_scale_bench_runs_and_reports(tmp_path: Path) -> None:
    assert scale.main(["--ns", "12", "--pending", "1", "--repeats", "3", "--window", "1",
                       "--fake", "--out", str(tmp_path)]) == 0
    (result,) = tmp_path.glob("scale-*.json")
    (run,) = scale.Report.from_json(json.loads(result.read_text())).runs
    assert (run.n, run.pending, run.failures) == (12, 1, {})
    assert run.set_first.repeats == 12 and run.set_first.median > 0
    assert set(run.requests) == set(scale.REQUEST_KINDS)
    assert all(s.repeats > 0 for s in run.requests.values())
    assert run.walk_on.repeats > 0 and run.walk_off.repeats > 0
    text = (tmp_path / "SCALE.md").read_text()
    assert "### Setting N targets one by one" in text and "| 12 |" in text
    assert (tmp_path / "scale.png").read_bytes().startswith(b"\x89PNG")


def _soak(tmp_path: Path, *extra: str) -> soak.Soak:
    assert soak.main(["--minutes", "0.1", "--traced-minutes", "0.1", "--stable", "3",
                      "--live", "4", "--min-cycles", "9", "--out", str(tmp_path), *extra]) == 0
    (result,) = tmp_path.glob("soak-*.json")
    s = soak.Soak.from_json(json.loads(result.read_text())["soak"])
    assert s.cycles > 8 and s.failures == {}  # targets came and went
    assert len(s.samples) >= 2 and all(x.rss_anon_mb > 0 for x in s.samples)
    assert s.growth is not None and s.growth.top
    assert "verdict" in (tmp_path / "SOAK.md").read_text()
    assert (tmp_path / "soak.png").read_bytes().startswith(b"\x89PNG")
    return s


def test_soak_bench_runs_and_reports(tmp_path: Path) -> None:
    _soak(tmp_path, "--fake")


@pytest.mark.kernel
def test_soak_bench_on_a_real_cgroup(cgroup2_mount: Path, tmp_path: Path) -> None:
    """On a real kernel the churn also removes cgroups under bound targets."""
    _soak(tmp_path)
    assert not list(cgroup2_mount.glob("dqoes-soak-*"))
    assert not list(cgroup2_mount.glob("dqoes-bench-*"))
