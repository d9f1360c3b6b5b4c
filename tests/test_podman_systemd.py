"""Podman as it runs on a systemd host: rootful, its default systemd cgroup manager, so that
each container is a transient unit of systemd's, machine.slice/libpod-<id>.scope. dqoesd
(tests/test_podman_kernel.py's bed, in the systemd guest) binds, measures and limits a
labelled container as it does Docker's; it tells systemd the limit, which a daemon-reload
would otherwise replace by systemd's own "no limit"; stopped, it gives the limit back to
cpu.max and to systemd alike.

The tests run in order, as one story, on one container.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dqoes_cg.status import ContainerStatus
from lab.guest.e2e import CGROUP, Service, cpu_max
from lab.guest.podman import PODMAN, PodmanBed, podman_bed
from lab.shell import sh, wait_for

pytestmark = [pytest.mark.guest_systemd,
              pytest.mark.skipif(shutil.which(PODMAN) is None,
                                 reason="no Podman (`make deps` installs it)")]

NAME = "pod-s"
LOOSE = "dqoes.target=400ms"  # 8x a request: the daemon takes CPU away, so it is limited
MEAN = "dqoes.metric=mean"
PERIOD_USEC = 100_000
# systemd keeps a quota to a percent of a CPU (its drop-in reads CPUQuota=N%)
SYSTEMD_ROUNDING_USEC = PERIOD_USEC // 100
binding: dict[str, float] = {}  # seconds from `podman run` (record_property, from the guest)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanBed]:
    with podman_bed(tmp_path_factory.mktemp("podman-systemd"), "systemd") as bed:
        yield bed


@pytest.fixture(scope="module")
def row(bed: PodmanBed) -> ContainerStatus:
    """The container, bound, measured and limited: its status row then."""
    bed.podman.ring_volume(NAME)
    run = time.time()
    cid = bed.podman.run_labelled(NAME, bed.units, LOOSE, MEAN)
    wait_for(lambda: bed.bound(NAME), 120, f"{NAME} bound", bed.explain, every=0.5)
    bound = time.time()
    row = wait_for(lambda: bed.measured_and_limited(NAME), 240, f"{NAME} measured and limited",
                   bed.explain, every=0.5)
    binding.update(bound_s=bound - run, limited_s=time.time() - run)
    assert row.cgroup == str(CGROUP / "machine.slice" / f"libpod-{cid}.scope"), row.cgroup
    return row


def told_systemd(cgroup: Path) -> tuple[int, int] | None:
    """(cpu.max's quota, the unit's CPUQuotaPerSecUSec) once systemd holds the limit in
    force (both read with no decision between)."""
    quota = cpu_max(cgroup)[0]
    per_sec = Service().quota_per_sec_usec(cgroup.name)
    if quota > 0 and per_sec == quota * 10 and cpu_max(cgroup)[0] == quota:
        return quota, per_sec
    return None


def test_a_libpod_scope_is_limited_and_systemd_told(
        bed: PodmanBed, row: ContainerStatus, record_property: pytest.RecordProperty) -> None:
    assert row.source == "label" and row.target_s == pytest.approx(0.4)
    assert row.ring == str(bed.run_dir / "volumes" / f"{NAME}-ring" / "ring")
    cgroup = Path(row.cgroup)
    quota, _ = wait_for(lambda: told_systemd(cgroup), 120,
                        "systemd told the limit in force", bed.explain)
    for key, value in {**binding, "samples": row.samples, "measured_s": row.measured_s,
                       "limit_cores": row.cpu_limit_cores, "told_quota_usec": quota}.items():
        record_property(key, value)


def test_the_limit_survives_a_daemon_reload(
        bed: PodmanBed, row: ContainerStatus, record_property: pytest.RecordProperty) -> None:
    cgroup = Path(row.cgroup)
    assert bed.daemon is not None
    # dqoesd frozen: whatever cpu.max holds after the reload is systemd's doing.
    os.kill(bed.daemon.pid, signal.SIGSTOP)
    try:
        before = cpu_max(cgroup)
        started = time.monotonic()
        sh("systemctl", "daemon-reload", timeout=300)
        after = cpu_max(cgroup)
        record_property("reload_s", time.monotonic() - started)
        record_property("cpu_max_before_after", f"{before} {after}")
    finally:
        os.kill(bed.daemon.pid, signal.SIGCONT)
    assert after[1] == before[1] and abs(after[0] - before[0]) <= SYSTEMD_ROUNDING_USEC, \
        (before, after)


def test_stopped_dqoesd_gives_the_limit_back_for_good(bed: PodmanBed, row: ContainerStatus
                                                      ) -> None:
    cgroup = Path(row.cgroup)
    bed.stop_daemon()
    assert cpu_max(cgroup) == (-1, PERIOD_USEC)
    assert Service().quota_per_sec_usec(cgroup.name) is None, "systemd told: no limit"
    sh("systemctl", "daemon-reload", timeout=300)
    assert cpu_max(cgroup) == (-1, PERIOD_USEC)
    bed.start_daemon()  # Podman unmounts the ring's volume through it at the end
