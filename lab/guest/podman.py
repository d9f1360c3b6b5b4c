"""Debian's Podman, rootful, for the real-kernel tests (tests/test_podman_kernel.py): a
private instance (its storage, run directory and configuration under one directory,
chosen by CONTAINERS_CONF and CONTAINERS_STORAGE_CONF) whose Docker-compatible API
(`podman system service`) dqoesd follows, and which mounts the rings of dqoesd's volume
driver, registered as a Podman volume plugin.

No systemd is needed: the cgroupfs cgroup manager (containers under /libpod_parent), and
events in a file, which the API service reads for its event stream.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from lab.images import image_tar
from lab.shell import sh

from .e2e import APPLETS, BUSYBOX

PODMAN = "/usr/bin/podman"
IMAGE = "localhost/dqoes-infer:podman"
START_TIMEOUT_S = 120.0


class Podman:
    """A rootful Podman of its own under `home`, with dqoesd's volume driver at `plugin`."""

    def __init__(self, home: Path, plugin: Path) -> None:
        self.home = home
        self.socket = home / "podman.sock"
        self.log = home / "service.log"
        home.mkdir(parents=True, exist_ok=True)
        (home / "containers.conf").write_text(
            '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
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
        tar = image_tar({"infer": infer, "bin/busybox": Path(BUSYBOX)},
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
