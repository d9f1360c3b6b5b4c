"""An interference injector: a CPU or memory-bandwidth hog on one node, at a level (a share
of the node's CPU budget: 0, 25, 50, 75%, as in Darly's section II) changed at random times
(seeded), so the containers beside it slow down.

    hog = DockerHog(node.docker, node.cpus, kind="cpu")     # or kind="membw"
    injector = Injector(hog, hog_schedule(600, mean_hold_s=60, seed=1)).start()
    ...; injector.stop()                                     # the hog removed
    injector.changes                                         # [(seconds, level), ...]

The hog is a container of the static busybox image on that node's engine (so it is in the
node's containers' cgroup, under its budget), capped by --cpus at level x the node's CPUs: a
busy shell loop (cpu), or dd copying 8 MiB buffers from /dev/zero to /dev/null (membw: the
kernel's memset and copy stream through memory, thrashing the caches its neighbours use).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from lab.swarm import BUSYBOX_IMAGE

LEVELS = (0.0, 0.25, 0.5, 0.75)
HOG_NAME = "dqoes-lab-hog"
HOG_COMMANDS = {
    "cpu": ["/busybox", "sh", "-c", "while :; do :; done"],
    "membw": ["/busybox", "sh", "-c",
              "while :; do /busybox dd if=/dev/zero of=/dev/null bs=8M count=64 2>/dev/null; "
              "done"],
}


def hog_schedule(duration_s: float, mean_hold_s: float, seed: int,
                 levels: Sequence[float] = LEVELS) -> list[tuple[float, float]]:
    """(seconds from the start, level) changes: each level held an exponential time of mean
    `mean_hold_s`, then another level drawn at random (never the same twice in a row); the
    first at 0."""
    rng = np.random.default_rng(seed)
    changes: list[tuple[float, float]] = []
    at, level = 0.0, float(rng.choice(levels))
    while at < duration_s:
        changes.append((at, level))
        at += float(rng.exponential(mean_hold_s))
        level = float(rng.choice([x for x in levels if x != level]))
    return changes


class Hog(Protocol):
    def set(self, level: float) -> None:
        """Take `level` of the node's CPU from now on (0: none)."""

    def remove(self) -> None:
        """No hog left."""


class DockerHog:
    """A hog container on the engine that `docker` (the CLI, an argv prefix) talks to."""

    def __init__(self, docker: Sequence[str], node_cpus: float, kind: str = "cpu",
                 image: str = BUSYBOX_IMAGE, name: str = HOG_NAME) -> None:
        if kind not in HOG_COMMANDS:
            raise ValueError(f"kind {kind!r}: one of {', '.join(HOG_COMMANDS)}")
        self.docker = list(docker)
        self.node_cpus = node_cpus
        self.kind = kind
        self.image = image
        self.name = name

    def start_argv(self, level: float) -> list[str]:
        return [*self.docker, "run", "--detach", "--rm", "--name", self.name,
                "--cpus", f"{level * self.node_cpus:.3f}", "--stop-timeout", "0",
                "--label", "dqoes.lab=hog", self.image, *HOG_COMMANDS[self.kind]]

    def set(self, level: float) -> None:
        self.remove()
        if level > 0:
            subprocess.run(self.start_argv(level), check=True, capture_output=True,
                           timeout=300)

    def remove(self) -> None:
        subprocess.run([*self.docker, "rm", "--force", self.name], capture_output=True,
                       timeout=300)


class Injector:
    """Applies a schedule of levels to a hog in a thread of its own; stop() removes it."""

    def __init__(self, hog: Hog, schedule: Sequence[tuple[float, float]]) -> None:
        self.hog = hog
        self.schedule = list(schedule)
        self.changes: list[tuple[float, float]] = []  # (seconds from start, level) applied
        self.errors: list[str] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Injector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self.hog.remove()

    def done(self) -> bool:
        """Every change of the schedule applied."""
        return not self._thread.is_alive()

    def _run(self) -> None:
        start = time.monotonic()
        for at, level in self.schedule:
            if self._stopping.wait(max(0.0, start + at - time.monotonic())):
                return
            try:
                self.hog.set(level)
            except (OSError, subprocess.SubprocessError) as e:
                why = getattr(e, "stderr", None) or str(e).encode()  # docker's reason, if any
                self.errors.append(f"level {level}: {why.decode(errors='replace')}"[:300])
                continue
            self.changes.append((time.monotonic() - start, level))
