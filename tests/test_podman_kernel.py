"""Podman containers as a Podman user has them, on the real kernel: dqoesd follows rootful
Podman's Docker-compatible API (`podman system service`), serves it the dqoes volume driver
as a Podman volume plugin, and binds, measures and limits a container described by its
labels alone, as it does Docker's (tests/test_e2e_docker.py). Podman's systemd cgroup
manager: tests/test_podman_systemd.py."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.guest.e2e import cpu_max
from lab.guest.podman import PODMAN, PodmanBed, podman_bed
from lab.shell import wait_for

pytestmark = [pytest.mark.kernel,
              pytest.mark.skipif(shutil.which(PODMAN) is None,
                                 reason="no Podman (`make deps` installs it)")]

LOOSE = "dqoes.target=400ms"  # 8x a request: the daemon takes CPU away, so it is limited
MEAN = "dqoes.metric=mean"


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanBed]:
    with podman_bed(tmp_path_factory.mktemp("podman"), "cgroupfs") as bed:
        yield bed


def test_a_labelled_podman_container_is_bound_measured_limited(bed: PodmanBed) -> None:
    bed.podman.ring_volume("pod-a")
    run = time.time()
    bed.podman.run_labelled("pod-a", bed.units, LOOSE, MEAN)
    wait_for(lambda: bed.bound("pod-a"), 120, "pod-a bound", bed.explain, every=0.5)
    bound = time.time()
    row = wait_for(lambda: bed.measured_and_limited("pod-a"), 240,
                   "pod-a measured and limited", bed.explain, every=0.5)
    assert row.source == "label" and row.target_s == pytest.approx(0.4)
    assert row.ring == str(bed.run_dir / "volumes" / "pod-a-ring" / "ring")
    assert "/libpod-" in row.cgroup, row.cgroup
    # Its loose target lets the daemon take CPU away, down to at most the one CPU it can use.
    wait_for(lambda: 0 < cpu_max(Path(row.cgroup))[0] <= cpu_max(Path(row.cgroup))[1], 240,
             "pod-a limited to at most the one CPU it can use", bed.explain, every=0.5)
    limited = time.time()
    started = bed.podman.started("pod-a")
    print(f"podman run: started after {started - run:.1f} s, bound after {bound - run:.1f} s "
          f"(its start to bound, polled every 0.5 s: {bound - started:.1f} s), limited after "
          f"{limited - run:.1f} s")
    bed.podman.remove("pod-a")
    wait_for(lambda: "pod-a" not in bed.listed(), 120, "pod-a unmanaged", bed.explain)
    assert bed.mounted_volumes() == []
