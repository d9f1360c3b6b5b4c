"""The demo's workers as Docker containers, set up the way a Docker user sets them up: the
static inference server (lab/guest/infer.c) in a one-file image, its ring given by the
`dqoes` volume driver, its target a label. A dqoesd of this checkout follows the engine's
API (its own run and state directories; Docker finds its volume driver through the spec
file written here for the demo's lifetime).

Targets are labels, and a container's labels are fixed when it is created: the workers
first run without one (the default platform), then each is replaced by the same container
with `--label dqoes.target=...`, which is what a user writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dqoes_cg.cgroup import find_cgroup2_mount, resolve
from dqoes_cg.control import request
from dqoes_cg.engines.client import Engine, EngineError
from dqoes_cg.engines.volume_driver import DRIVER, SOCKET_NAME, SPEC_FILE, VOLUMES_DIR, plugin_spec
from dqoes_cg.ring import RING_FILE
from dqoes_cg.status import Status
from lab.guest.e2e import Docker, artifacts
from lab.guest.routing import IN_GUEST_ENV
from lab.guest.systemd_guest import SYSTEMD_GUEST_TOOLS
from lab.images import DOCKER, import_image
from lab.shell import sh, wait_for
from lab.testbed import Observer, _stop, start_dqoesd

ENGINE_SOCKET = Path("/run/docker.sock")
DOCKERD = SYSTEMD_GUEST_TOOLS["docker.io"]
IMAGE = "dqoes-demo-infer:latest"
MOUNT = "type=volume,volume-driver=dqoes,dst=/run/dqoes"  # a ring of its own (README)
REQUEST_CPU_MS = 40  # CPU time of one request: 80 ms of latency at half a CPU
BIND_TIMEOUT_S = 300  # docker run and the daemon's binding, on an emulated CPU


class DockerUnavailable(Exception):
    """Docker cannot run the demo's workers here (the message says why)."""


def engine_answers(socket: Path = ENGINE_SOCKET) -> bool:
    try:
        Engine(socket, timeout=10).get("/version")
    except EngineError:
        return False
    return True


def docker_fleet(workdir: Path, daemon_args: Sequence[str]) -> DockerFleet:
    """The fleet, once Docker's engine answers: in the project's systemd guest it is
    started here, configured as the end-to-end tests configure it; elsewhere it must run
    already. Raises DockerUnavailable."""
    if not engine_answers() and os.environ.get(IN_GUEST_ENV) == "1" \
            and Path("/run/systemd/system").is_dir() and Path(DOCKERD).exists():
        Docker().start("cgroupfs")
    if not engine_answers():
        raise DockerUnavailable(f"no Docker engine answers on {ENGINE_SOCKET}")
    if SPEC_FILE.exists():
        raise DockerUnavailable(f"a dqoes volume driver is installed here ({SPEC_FILE}): "
                                "the demo runs a dqoesd of its own")
    try:
        infer = artifacts(workdir).infer
    except AssertionError as e:  # no static C toolchain here
        raise DockerUnavailable(f"cannot build the inference server: {e}") from None
    return DockerFleet(workdir, infer, daemon_args)


class DockerFleet:
    """Workers as Docker containers managed through their labels; see the module's
    docstring."""

    description = "Docker containers (the engine's API, labels, the dqoes volume driver)"

    def __init__(self, workdir: Path, infer: Path, daemon_args: Sequence[str]) -> None:
        self.workdir = workdir
        self.infer = infer
        self.daemon_args = tuple(daemon_args)
        self.run_dir = workdir / "run"
        self.socket = self.run_dir / "dqoes.sock"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.names: list[str] = []
        self.rates: dict[str, tuple[str, ...]] = {}  # infer's RATE argument, if open loop
        self.ids: dict[str, str] = {}

    def start(self, names: Sequence[str], loads: Sequence[float | None]) -> None:
        """dqoesd, then one container per name serving without a target: back to back, or
        (a load) receiving requests at a rate that needs that many CPUs."""
        import_image([DOCKER], IMAGE, {"infer": self.infer})
        self.units = int(sh(self.infer, "--calibrate", str(REQUEST_CPU_MS)))
        SPEC_FILE.parent.mkdir(parents=True, exist_ok=True)
        SPEC_FILE.write_text(plugin_spec(self.run_dir / SOCKET_NAME))
        self.daemon = start_dqoesd(self.run_dir, self.workdir / "state",
                                   self.workdir / "dqoesd.log", *self.daemon_args)
        self.names = list(names)
        self.rates = {name: () if load is None else (f"{load * 1e3 / REQUEST_CPU_MS:g}",)
                      for name, load in zip(names, loads, strict=True)}
        print(f"each worker: {IMAGE} serving requests of {REQUEST_CPU_MS} ms of CPU back to "
              "back, on one thread", flush=True)
        self._run({name: () for name in self.names})

    def observer(self, start: float | None = None) -> Observer:
        cgroups, rings = [], []
        mount = find_cgroup2_mount()
        for name in self.names:
            pid = sh(DOCKER, "inspect", "--format", "{{.State.Pid}}", self.ids[name]).strip()
            cgroups.append(resolve(pid, mount).path)
            rings.append(self._ring(name))
        return Observer(cgroups, rings, start)

    def set_targets(self, targets: Sequence[float]) -> None:
        """Each container replaced by the same one labelled with its target; returns once
        dqoesd has bound every one."""
        sh(DOCKER, "rm", "--force", "--volumes", *self.ids.values(), timeout=BIND_TIMEOUT_S)
        self.ids.clear()
        self._run({name: (f"dqoes.target={target * 1e3:.1f}ms", "dqoes.metric=mean")
                   for name, target in zip(self.names, targets, strict=True)})

        def bound() -> bool:
            return {c.name for c in self.status().containers} >= set(self.names)

        wait_for(bound, BIND_TIMEOUT_S, "dqoesd to bind every labelled container",
                 lambda: self.log()[-3000:], every=0.5)

    def status(self) -> Status:
        return Status.from_json(request(self.socket, "status", timeout=60))

    def log(self) -> str:
        return (self.workdir / "dqoesd.log").read_text(errors="replace")

    def close(self) -> None:
        if self.ids:
            subprocess.run([DOCKER, "rm", "--force", "--volumes", *self.ids.values()],
                           capture_output=True, timeout=600)
            self.ids.clear()
        if self.daemon is not None:  # it gives back every limit it set
            _stop(self.daemon, signal.SIGTERM)
            self.daemon = None
        SPEC_FILE.unlink(missing_ok=True)
        # A ring volume outlives the daemon by design; one whose container's removal did not
        # reach the driver in time (a loaded guest) is still mounted here, under the demo's
        # own directory, which must go: "Device or resource busy" once in a make test.
        volumes = self.run_dir / VOLUMES_DIR
        for volume in volumes.iterdir() if volumes.is_dir() else ():
            if os.path.ismount(volume):
                subprocess.run(["umount", "--lazy", str(volume)], capture_output=True,
                               timeout=60)

    def _run(self, labels: dict[str, Sequence[str]]) -> None:
        """`docker run` of a container per name with its labels, all at once."""
        argvs = {name: ["run", "-d", "--name", name, "--network", "none",
                        *(a for label in these for a in ("--label", label)),
                        "--mount", MOUNT, IMAGE, "/infer", str(self.units),
                        *self.rates[name]]
                 for name, these in labels.items()}
        for argv in argvs.values():
            print(f"  $ docker {' '.join(argv)}", flush=True)
        with ThreadPoolExecutor(len(argvs)) as pool:
            ids = pool.map(lambda argv: sh(DOCKER, *argv, timeout=BIND_TIMEOUT_S).strip(),
                           argvs.values())
            self.ids.update(zip(argvs, ids, strict=True))

    def _ring(self, name: str) -> Path:
        """The ring in the container's dqoes volume, where the daemon mounted it."""
        mounts = json.loads(sh(DOCKER, "inspect", "--format", "{{json .Mounts}}",
                               self.ids[name]))
        volume = next(m["Name"] for m in mounts if m.get("Driver") == DRIVER)
        return self.run_dir / VOLUMES_DIR / volume / RING_FILE
