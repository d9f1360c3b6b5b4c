"""bench/packing.py: a short run caps and weights each busy loop as it says and measures the
CPU each got; the summary reads per set and weighting. No delivery is asserted."""

from __future__ import annotations

import time

import pytest

from bench import packing
from bench.packing import CAP_SETS, WEIGHTINGS, markdown


def test_the_summary_gives_the_largest_cap_and_the_least_and_mean_of_each_round() -> None:
    name, caps = next(iter(CAP_SETS.items()))
    points = [{"set": name, "caps": caps, "weighting": w, "round": 0,
               "got": [c * share for c in caps]} for w, share in zip(WEIGHTINGS, (0.9, 1.0),
                                                                     strict=True)]
    row = next(line for line in markdown(points, "nowhere", 1.0).splitlines()
               if line.startswith(f"| {name}:"))
    assert row.endswith("| 0.90; 0.90, 0.90 | 1.00; 1.00, 1.00 |")


@pytest.mark.kernel
def test_a_short_run_caps_and_weights_each_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from lab.cgroups import cgroup2_cpu_mount, make_test_cgroup, remove_cgroup_tree

    mount = cgroup2_cpu_mount()
    assert mount is not None
    parent = make_test_cgroup(mount)
    seen: list[tuple[str, str]] = []

    class Watching:  # packing's clock: while the loops run, notes what each cgroup was given
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            seen.extend(((cg / "cpu.max").read_text().strip(),
                         (cg / "cpu.weight").read_text().strip())
                        for cg in sorted(parent.iterdir()) if cg.is_dir())
            time.sleep(seconds)

    monkeypatch.setattr(packing, "time", Watching)
    try:
        got = packing.delivered(parent, (0.3, 0.1), WEIGHTINGS[1], 1.0)
        left = [cg for cg in parent.iterdir() if cg.is_dir()]
    finally:
        remove_cgroup_tree(parent)
    assert seen[:2] == [("30000 100000", "150"), ("10000 100000", "50")]
    assert len(got) == 2 and all(g > 0 for g in got), got  # each loop ran (its share: the kernel's)
    assert left == []
