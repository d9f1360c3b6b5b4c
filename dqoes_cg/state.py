"""The daemon's persistent state: targets and the limits it must give back.

One JSON file under --state-dir, replaced atomically (write a temporary file, fsync, rename,
fsync the directory), so a crash leaves either the old or the new state, never a torn one.
It holds what a restarted daemon needs to re-adopt its containers: each target, the cgroup it
was bound to, and the `cpu.max` that cgroup had before the daemon first wrote it. Written on
every change of targets or bindings, never per tick.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

STATE_VERSION = 1
METRICS = ("mean", "p50", "p90", "p95", "p99")
MAX_TARGET_S = 3600.0


@dataclass
class Target:
    name: str  # the container as the user named it; the key
    target_s: float  # QoE objective o_i, seconds
    metric: str  # which window statistic is p_i
    cgroup: str | None = None  # bound cgroup directory, None while pending
    original_max: str | None = None  # cpu.max before our first write; None: never written


def check_target(target_s: float, metric: str) -> None:
    """Raise ValueError unless (target, metric) is something the controller can pursue."""
    if not isinstance(target_s, (int, float)) or isinstance(target_s, bool):
        raise ValueError("target must be a number of seconds")
    if not math.isfinite(target_s) or target_s <= 0:
        raise ValueError("target must be a positive duration")
    if target_s > MAX_TARGET_S:
        raise ValueError(f"target must be at most {MAX_TARGET_S:.0f} s")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})")


class StateStore:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "state.json"

    def load(self) -> dict[str, Target]:
        """Targets from the last run; a corrupt file is kept aside, never silently lost."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(raw)
            if doc.get("version") != STATE_VERSION:
                raise ValueError(f"state version {doc.get('version')!r}")
            targets = {}
            for item in doc["targets"]:
                t = Target(**item)
                check_target(t.target_s, t.metric)
                targets[t.name] = t
            return targets
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            aside = self.path.with_name(f"state.json.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            log.error("state file unreadable (%s); moved to %s, starting empty", e, aside)
            return {}

    def save(self, targets: dict[str, Target]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        doc = {"version": STATE_VERSION, "targets": [asdict(t) for t in targets.values()]}
        tmp = self.path.with_name(f".state.json.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.write(fd, json.dumps(doc, indent=1).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
