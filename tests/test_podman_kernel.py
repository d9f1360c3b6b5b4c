"""Podman containers as a Podman user has them, on the real kernel: dqoesd follows rootful
Podman's Docker-compatible API (`podman system service`), serves it the dqoes volume driver
as a Podman volume plugin, and binds, measures and limits a container described by its
labels alone, as it does Docker's (tests/test_e2e_docker.py)."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dqoes_cg.control import request
from dqoes_cg.ctl import format_status
from dqoes_cg.status import ContainerStatus, Listing, Status
from lab.guest.e2e import artifacts, cpu_max
from lab.guest.podman import PODMAN, Podman
from lab.shell import sh, wait_for
from lab.testbed import start_dqoesd

pytestmark = [pytest.mark.kernel,
              pytest.mark.skipif(shutil.which(PODMAN) is None,
                                 reason="no Podman (`make deps` installs it)")]

REQUEST_MS = 50
LOOSE = "dqoes.target=400ms"  # 8x a request: the daemon takes CPU away, so it is limited
MEAN = "dqoes.metric=mean"


class Bed:
    def __init__(self, workdir: Path) -> None:
        self.run_dir = workdir / "run"
        self.socket = self.run_dir / "dqoes.sock"
        self.log = workdir / "dqoesd.log"
        self.podman = Podman(workdir / "podman", self.run_dir / "plugin.sock")
        self.units = 0  # of work per request: REQUEST_MS on this CPU

    def listed(self) -> dict[str, Listing]:
        return {d["name"]: Listing.from_json(d) for d in request(self.socket, "list", timeout=60)}

    def status(self) -> Status:
        return Status.from_json(request(self.socket, "status", timeout=60))

    def explain(self) -> str:
        return (f"--- status ---\n{format_status(self.status())}\n"
                f"--- dqoesd's log ---\n{self.log.read_text()[-4000:]}\n"
                f"--- podman system service ---\n{self.podman.tail()}")


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    workdir = tmp_path_factory.mktemp("podman")
    infer = artifacts(workdir).infer
    bed = Bed(workdir)
    bed.podman.start()
    daemon = start_dqoesd(bed.run_dir, workdir / "state", bed.log,
                          "--engine-socket", str(bed.podman.socket),
                          "--podman-socket", str(bed.podman.socket),
                          "--sample-interval", "0.5", "--interval", "2", "--max-interval", "4",
                          "--beta", "0.5")
    try:
        bed.podman.import_image(infer)
        bed.units = int(sh(infer, "--calibrate", str(REQUEST_MS)))
        yield bed
    finally:
        bed.podman.close()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(120)


def measured_and_limited(bed: Bed, name: str) -> ContainerStatus | None:
    row = next((c for c in bed.status().containers if c.name == name), None)
    if row is None or row.samples == 0 or row.cpu_limit_cores is None:
        return None
    return row


def mounted_volumes(bed: Bed) -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if f" {bed.run_dir}/volumes/" in line]


def test_a_labelled_podman_container_is_bound_measured_limited(bed: Bed) -> None:
    bed.podman.ring_volume("pod-a")
    run = time.time()
    bed.podman.run_labelled("pod-a", bed.units, LOOSE, MEAN)
    wait_for(lambda: (lambda ls: ls.get("pod-a") and ls["pod-a"].state == "bound")(
        bed.listed()), 120, "pod-a bound", bed.explain, every=0.5)
    bound = time.time()
    row = wait_for(lambda: measured_and_limited(bed, "pod-a"), 240,
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
    assert mounted_volumes(bed) == []
