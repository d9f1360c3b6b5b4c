"""python -m bench.cluster.node_observer: what every Swarm task on one node did, window by
window, measured by its own readers of the task's ring and cgroup (lab.testbed's Observer),
whether dqoesd controls the task or not, so that every way of the cluster experiment is
measured alike. It runs as a process of the node (lab.swarm's Node.spawn): a task's ring
is in its dqoes volume, a tmpfs that the node's dqoesd mounted in the node's mount
namespace under RUN_DIR/volumes.

One JSON line per window on stdout:
    {"t": MONOTONIC_S, "tasks": [{"service", "container", "created", "latency_s" (null: no
    request completed), "requests", "usage_cores"}, ...]}
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dqoes_cg.engines.client import EngineError
from dqoes_cg.engines.volume_driver import DRIVER
from dqoes_cg.ring import RING_FILE
from lab.swarm import SERVICE_LABEL, Engine
from lab.testbed import Observer


class Task:
    """One running task's container, measured from when it was first seen."""

    def __init__(self, engine: Engine, entry: dict[str, Any], volumes: Path) -> None:
        self.id = entry["Id"]
        self.service = entry["Labels"][SERVICE_LABEL]
        self.created = entry["Created"]
        inspect = engine.get(f"/containers/{self.id}/json")
        (volume,) = [m["Name"] for m in inspect["Mounts"] if m.get("Driver") == DRIVER]
        ring = volumes / volume / RING_FILE
        if not ring.exists():  # the Observer would make one that nobody writes
            raise FileNotFoundError(f"no ring at {ring}")
        pid = inspect["State"]["Pid"]
        cgroup = Path("/sys/fs/cgroup", Path(f"/proc/{pid}/cgroup").read_text().strip()
                      .removeprefix("0::/"))
        self.observer = Observer([cgroup], [ring])

    def window(self) -> dict[str, Any]:
        w = self.observer.window()
        latency = float(w.latency_s[0])
        return {"service": self.service, "container": self.id, "created": self.created,
                "latency_s": None if math.isnan(latency) else latency,
                "requests": int(w.requests[0]), "usage_cores": float(w.usage_cores[0])}


def observe(engine: Engine, volumes: Path, window_s: float) -> None:
    query = f"/containers/json?filters={quote(json.dumps({'label': [SERVICE_LABEL]}))}"
    tasks: dict[str, Task] = {}
    while True:
        started = time.monotonic()
        try:
            running = {entry["Id"]: entry for entry in engine.get(query)}
        except (OSError, EngineError) as e:  # the engine restarts: the tasks live on
            print(f"node_observer: {e}", file=sys.stderr)
            running = {cid: {} for cid in tasks}
        for cid in set(tasks) - set(running):
            tasks.pop(cid).observer.close()
        for cid in set(running) - set(tasks):
            try:
                tasks[cid] = Task(engine, running[cid], volumes)
            except (OSError, EngineError, KeyError, ValueError) as e:
                print(f"node_observer: {cid[:12]} not measured yet: {e}", file=sys.stderr)
        time.sleep(max(0.0, window_s - (time.monotonic() - started)))
        print(json.dumps({"t": time.monotonic(),
                          "tasks": [task.window() for task in tasks.values()]}), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster.node_observer",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine-socket", type=Path, required=True)
    p.add_argument("--volumes", type=Path, required=True,
                   help="the node's dqoesd's volumes directory (RUN_DIR/volumes)")
    p.add_argument("--window", type=float, default=5.0, help="seconds (default %(default)s)")
    args = p.parse_args(argv)
    observe(Engine(args.engine_socket), args.volumes, args.window)
    return 0


if __name__ == "__main__":
    sys.exit(main())
