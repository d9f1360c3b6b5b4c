"""Debian's Podman, rootful, for the real-kernel tests (tests/test_podman_kernel.py, and
tests/test_podman_systemd.py in the systemd guest): a private instance (its storage, run
directory and configuration under one directory, chosen by CONTAINERS_CONF and
CONTAINERS_STORAGE_CONF) whose Docker-compatible API (`podman system service`) dqoesd
follows, and which mounts the rings of dqoesd's volume driver, registered as a Podman
volume plugin; and `podman_bed`, dqoesd of this checkout following it.

Its cgroup manager is cgroupfs (containers under /libpod_parent, no systemd needed) or, where
systemd is PID 1, systemd (Podman's default there: each container a transient unit,
machine.slice/libpod-<id>.scope). Events go to a file, which the API service reads for its
event stream.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dqoes_cg.control import request
from dqoes_cg.ctl import format_status
from dqoes_cg.status import ContainerStatus, Listing, Status
from lab.images import image_tar
from lab.shell import sh
from lab.testbed import start_dqoesd

from .e2e import APPLETS, BUSYBOX, artifacts

PODMAN = "/usr/bin/podman"
IMAGE = "localhost/dqoes-infer:podman"
START_TIMEOUT_S = 120.0
REQUEST_MS = 50  # of CPU per request of the test server
# dqoesd's options in these tests: quick windows, so that a limit comes within seconds
DQOESD_OPTIONS = ("--sample-interval", "0.5", "--interval", "2", "--max-interval", "4",
                  "--beta", "0.5")


class Podman:
    """A rootful Podman of its own under `home`, with dqoesd's volume driver at `plugin`,
    and `cgroup_manager` "cgroupfs" or "systemd"."""

    def __init__(self, home: Path, plugin: Path, cgroup_manager: str = "cgroupfs") -> None:
        self.home = home
        self.socket = home / "podman.sock"
        self.log = home / "service.log"
        home.mkdir(parents=True, exist_ok=True)
        (home / "containers.conf").write_text(
            f'[engine]\ncgroup_manager = "{cgroup_manager}"\nevents_logger = "file"\n'
            f'tmp_dir = "{home}/tmp"\nruntime = "crun"\n'
            f'[engine.volume_plugins]\ndqoes = "{plugin}"\n')
        # overlay on the test's own directory: Podman's graph root cannot be the guest's
        # overlay root (no overlayfs as an upper layer), a tmpfs under /tmp can
        (home / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{home}/storage"\n'
            f'runroot = "{home}/run"\n')
        self.env = {**os.environ, "CONTAINERS_CONF": str(home / "containers.conf"),
                    "CONTAINERS_STORAGE_CONF": str(home / "storage.conf")}
        self._service: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """The API service on `socket` (no idle timeout), once it listens."""
        with open(self.log, "ab") as log:
            self._service = subprocess.Popen(
                [PODMAN, "system", "service", "--time=0", f"unix://{self.socket}"],
                env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.socket.exists():
            if self._service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman system service did not start:\n{self.tail()}")
            time.sleep(0.2)

    def close(self) -> None:
        names = self("ps", "-aq").split()
        if names:
            self("rm", "-f", "-v", "-t", "0", *names)
        if self._service is not None:
            self._service.send_signal(signal.SIGTERM)
            try:
                self._service.wait(60)
            except subprocess.TimeoutExpired:
                self._service.kill()
                self._service.wait()

    def __call__(self, *args: str, timeout: float = 300) -> str:
        """What the Podman CLI of this instance prints; a failure raises with it."""
        return sh(*self.argv(*args), timeout=timeout)

    def argv(self, *args: str) -> list[str]:
        return ["env", f"CONTAINERS_CONF={self.env['CONTAINERS_CONF']}",
                f"CONTAINERS_STORAGE_CONF={self.env['CONTAINERS_STORAGE_CONF']}",
                PODMAN, *args]

    def import_image(self, infer: Path) -> None:
        """The static server and a static busybox, as `podman import` of a tar."""
        tar = image_tar({"infer": infer, "bin/busybox": BUSYBOX},
                        {f"bin/{applet}": "busybox" for applet in APPLETS})
        subprocess.run([PODMAN, "import", "-", IMAGE], input=tar, env=self.env, check=True,
                       capture_output=True, timeout=300)

    def ring_volume(self, name: str) -> str:
        """The volume of the dqoes driver for container `name`'s ring (Podman makes a
        plugin's volume with `podman volume create`, not at `run`)."""
        return self("volume", "create", "--driver", "dqoes", f"{name}-ring").strip()

    def run_labelled(self, name: str, units: int, *labels: str) -> str:
        """A container as a Podman user writes it: labels, and its ring_volume mounted;
        its ID."""
        return self("run", "-d", "--name", name, "--network", "none",
                    *(a for label in labels for a in ("--label", label)),
                    "-v", f"{name}-ring:/run/dqoes", IMAGE, "/infer", str(units)).strip()

    def started(self, name: str) -> float:
        """When the container started (seconds since the epoch)."""
        return float(self("inspect", "--format", "{{.State.StartedAt.Unix}}", name))

    def remove(self, name: str) -> None:
        """The container, then its ring's volume."""
        self("rm", "-f", "-t", "0", name)
        self("volume", "rm", f"{name}-ring")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


class PodmanBed:
    """dqoesd of this checkout (its own run directory) following a private Podman."""

    def __init__(self, workdir: Path, cgroup_manager: str) -> None:
        self.run_dir = workdir / "run"
        self.socket = self.run_dir / "dqoes.sock"
        self.log = workdir / "dqoesd.log"
        self.state_dir = workdir / "state"
        self.podman = Podman(workdir / "podman", self.run_dir / "plugin.sock", cgroup_manager)
        self.units = 0  # of work per request: REQUEST_MS on this CPU
        self.daemon: subprocess.Popen[bytes] | None = None

    def start_daemon(self) -> None:
        self.daemon = start_dqoesd(self.run_dir, self.state_dir, self.log,
                                   "--engine-socket", str(self.podman.socket),
                                   "--podman-socket", str(self.podman.socket), *DQOESD_OPTIONS)

    def stop_daemon(self) -> None:
        """SIGTERM, as systemd stops it: it gives every limit back first."""
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(120)

    def listed(self) -> dict[str, Listing]:
        return {d["name"]: Listing.from_json(d) for d in request(self.socket, "list", timeout=60)}

    def status(self) -> Status:
        return Status.from_json(request(self.socket, "status", timeout=60))

    def bound(self, name: str) -> bool:
        listing = self.listed().get(name)
        return listing is not None and listing.state == "bound"

    def measured_and_limited(self, name: str) -> ContainerStatus | None:
        """Its row once it has samples and a limit."""
        row = next((c for c in self.status().containers if c.name == name), None)
        if row is None or row.samples == 0 or row.cpu_limit_cores is None:
            return None
        return row

    def mounted_volumes(self) -> list[str]:
        return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if f" {self.run_dir}/volumes/" in line]

    def explain(self) -> str:
        status = ""
        if self.daemon is not None and self.daemon.poll() is None:
            status = f"--- status ---\n{format_status(self.status())}\n"
        return (f"{status}--- dqoesd's log ---\n{self.log.read_text()[-4000:]}\n"
                f"--- podman system service ---\n{self.podman.tail()}")


@contextmanager
def podman_bed(workdir: Path, cgroup_manager: str) -> Iterator[PodmanBed]:
    """Podman's API service, dqoesd following it, the test image imported and the work of a
    request calibrated; everything stopped and removed at the end."""
    infer = artifacts(workdir).infer
    bed = PodmanBed(workdir, cgroup_manager)
    bed.podman.start()
    try:
        bed.start_daemon()
        bed.podman.import_image(infer)
        bed.units = int(sh(infer, "--calibrate", str(REQUEST_MS)))
        yield bed
    finally:
        bed.podman.close()
        bed.stop_daemon()
