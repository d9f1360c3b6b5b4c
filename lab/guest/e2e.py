"""Helpers of the end-to-end tests (tests/test_e2e_service.py), which run in the systemd
guest: dqoesd installed and run as the service, Docker's engine with either cgroup driver,
and the inference server (infer.c) in containers and in a `systemd-run --scope` unit.

Everything in the guest runs on an emulated CPU, tens of times slower than the host: the
timeouts are generous, and waits poll for a state instead of sleeping for a guess.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dqoes_cg.actuator import parse_cpu_max
from dqoes_cg.cgroup import resolve
from dqoes_cg.control import request
from dqoes_cg.paths import RUN_DIR
from dqoes_cg.status import ContainerStatus, Status
from lab.images import (
    BUSYBOX,
    BUSYBOX_FILES,
    DOCKER,
    PYTHON_IMAGE,
    PYTHON_LINKS,
    import_image,
)
from lab.shell import sh

from .systemd_guest import ARTIFACTS_ENV, REPO, build_infer

IMAGE = "dqoes-infer:e2e"
APPLETS = ("sh", "ls", "cat", "dd", "df", "tail", "sleep", "touch")
# What a container runs when only its membership matters: a process in its cgroup that
# takes no CPU (a burst of servers would hold an emulated CPU for minutes).
IDLE = ("/bin/sleep", "1000000")
VOLUME = "type=volume,volume-driver=dqoes,dst=/run/dqoes"  # a ring of its own (README)
SOCKET = RUN_DIR / "dqoes.sock"
CGROUP = Path("/sys/fs/cgroup")
DROP_IN = Path("/run/systemd/system/dqoesd.service.d/e2e.conf")
_USEC = {"us": 1, "ms": 1_000, "s": 1_000_000, "min": 60_000_000}


@dataclass(frozen=True)
class Artifacts:
    wheel: Path | None  # None: `make install` builds this checkout
    infer: Path


def artifacts(workdir: Path) -> Artifacts:
    """What the host built for us (systemd_guest.build_e2e_artifacts, or build_infer alone:
    no wheel), or, run by hand in a guest, the inference server built here (slowly)."""
    built = os.environ.get(ARTIFACTS_ENV)
    if built:
        return Artifacts(next(Path(built).glob("dqoes_cg-*.whl"), None), Path(built, "infer"))
    build_infer(workdir)
    return Artifacts(None, workdir / "infer")


class Service:
    """dqoesd.service as `make install` put it in place."""

    name = "dqoesd.service"

    def install(self, wheel: Path | None) -> None:
        # Offline: the build (if any) uses the installed setuptools, wheel and cffi.
        package = [f"PACKAGE={wheel}"] if wheel else []
        sh("make", "-s", "-C", REPO, "install", *package,
           "PIP_FLAGS=--no-build-isolation --no-index --no-deps", timeout=900)

    def uninstall(self) -> None:
        sh("make", "-s", "-C", REPO, "uninstall", timeout=600)

    def configure(self, options: str, watchdog_s: int) -> None:
        """Options in the file made for them; the watchdog shortened by a runtime drop-in."""
        Path("/etc/default/dqoesd").write_text(f'DQOESD_OPTS="{options}"\n')
        DROP_IN.parent.mkdir(parents=True, exist_ok=True)
        DROP_IN.write_text(f"[Service]\nWatchdogSec={watchdog_s}s\n")
        sh("systemctl", "daemon-reload")

    def show(self, *properties: str, unit: str | None = None) -> dict[str, str]:
        out = sh("systemctl", "show", unit or self.name, *(f"--property={p}" for p in properties))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def quota_per_sec_usec(self, unit: str) -> int | None:
        """The unit's CPUQuotaPerSecUSec as systemd holds it (None: infinity)."""
        text = self.show("CPUQuotaPerSecUSec", unit=unit)["CPUQuotaPerSecUSec"]
        if text == "infinity":
            return None
        parts = re.findall(r"([\d.]+)(us|ms|s|min)", text)  # e.g. "412.340ms", "1.5s"
        assert parts, text
        return round(sum(float(n) * _USEC[u] for n, u in parts))

    def main_pid(self) -> int:
        return int(self.show("MainPID")["MainPID"])

    def journal(self) -> str:
        return sh("journalctl", "--no-pager", "-o", "cat", "-u", self.name)

    def status(self) -> Status:
        return Status.from_json(request(SOCKET, "status", timeout=60))

    def containers(self) -> dict[str, ContainerStatus]:
        return {c.name: c for c in self.status().containers}


def dqoesctl(*args: str) -> str:
    """The CLI, as an operator runs it."""
    return sh("dqoesctl", *args, timeout=120)


class Docker:
    """Docker's engine (docker.service), with no network and a one-file image."""

    def start(self, cgroup_driver: str) -> None:
        config = {"exec-opts": [f"native.cgroupdriver={cgroup_driver}"], "bridge": "none",
                  "iptables": False}
        Path("/etc/docker").mkdir(exist_ok=True)
        Path("/etc/docker/daemon.json").write_text(json.dumps(config))
        sh("systemctl", "restart", "docker.service", timeout=300)
        driver = sh(DOCKER, "info", "--format", "{{.CgroupDriver}}").strip()
        assert driver == cgroup_driver, driver

    def import_image(self, infer: Path) -> None:
        """An image holding the static server and a static busybox (no registry is
        reachable)."""
        import_image([DOCKER], IMAGE, {"infer": infer, "bin/busybox": BUSYBOX},
                     {f"bin/{applet}": "busybox" for applet in APPLETS})

    def import_python_image(self) -> None:
        """PYTHON_IMAGE, in which python_run runs this host's Python."""
        import_image([DOCKER], PYTHON_IMAGE, BUSYBOX_FILES, PYTHON_LINKS)

    def run(self, name: str, units: int) -> str:
        """An inference container with its ring directory mounted as the README says."""
        return sh(DOCKER, "run", "-d", "--name", name, "--network", "none",
                  "-v", f"{RUN_DIR}/rings/{name}:/run/dqoes", IMAGE, "/infer", str(units),
                  timeout=300).strip()

    def run_labelled(self, name: str, units: int | None, *labels: str, volume: bool = True,
                     options: tuple[str, ...] = ()) -> str:
        """A container as a Docker user writes it: labels, and a dqoes volume for its
        ring; its ID. It serves requests of `units`, or sleeps (IDLE) if None."""
        argv = [DOCKER, "run", "-d", "--name", name, "--network", "none", *options]
        argv += [a for label in labels for a in ("--label", label)]
        argv += ["--mount", VOLUME] if volume else []
        command = IDLE if units is None else ("/infer", str(units))
        return sh(*argv, IMAGE, *command, timeout=300).strip()

    def inspect(self, name: str, template: str) -> str:
        return sh(DOCKER, "inspect", "--format", template, name).strip()

    def exec(self, name: str, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DOCKER, "exec", name, "sh", "-c", script],
                              capture_output=True, text=True, timeout=120)

    def remove(self, *names: str) -> None:
        sh(DOCKER, "rm", "-f", "-v", *names, timeout=300)

    def cgroup(self, name: str) -> Path:
        pid = sh(DOCKER, "inspect", "--format", "{{.State.Pid}}", name).strip()
        return cgroup_of(int(pid))


def swarm_init() -> None:
    """A single-node Swarm on a dummy interface of its own (Swarm needs an address that is
    not a loopback one; nothing leaves the guest)."""
    if subprocess.run(["ip", "link", "show", "dqoes-swarm"], capture_output=True).returncode:
        sh("modprobe", "dummy")
        sh("ip", "link", "add", "dqoes-swarm", "type", "dummy")
        sh("ip", "addr", "add", "10.251.0.1/24", "dev", "dqoes-swarm")
        sh("ip", "link", "set", "dqoes-swarm", "up")
    sh(DOCKER, "swarm", "init", "--advertise-addr", "10.251.0.1", timeout=300)


def journal_times(unit: str, prefix: str) -> list[float]:
    """When the unit logged lines starting with `prefix` (seconds since the epoch)."""
    out = sh("journalctl", "--no-pager", "-o", "json", "-u", unit, timeout=120)
    times = []
    for line in out.splitlines():
        entry = json.loads(line)
        message = entry.get("MESSAGE")
        if isinstance(message, str) and message.startswith(prefix):
            times.append(int(entry["__REALTIME_TIMESTAMP"]) / 1e6)
    return times


def docker_time(text: str) -> float:
    """Seconds since the epoch of Docker's RFC 3339 time with nanoseconds."""
    from datetime import datetime

    main, _, rest = text.rstrip("Z").partition(".")
    fraction = float("0." + rest) if rest else 0.0
    return datetime.fromisoformat(main + "+00:00").timestamp() + fraction


def cgroup_of(pid: int) -> Path:
    return resolve(str(pid), CGROUP).path


def start_scope(unit: str, infer: Path, units: int) -> subprocess.Popen[bytes]:
    """The server in a transient scope unit of its own, recording into the ring of the
    target named after the unit."""
    env = {**os.environ, "DQOES_RING": f"{RUN_DIR}/rings/{unit}/ring"}
    return subprocess.Popen(["systemd-run", "--quiet", "--scope", f"--unit={unit}",
                             "--property=CPUAccounting=yes", str(infer), str(units)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def cpu_max(cgroup: Path) -> tuple[int, int]:
    """(quota, period) of a cgroup's cpu.max; quota -1 for "max"."""
    return parse_cpu_max((cgroup / "cpu.max").read_text())
