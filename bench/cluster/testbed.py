"""python -m bench.cluster.testbed: the paper's cluster experiment for real, three ways
(Swarm's default; dqoes-cg on each node; dqoes-cg with QoE-aware placement), on the
three-node Docker Swarm of the swarm guest (lab/swarm.py: three real dockerd on a real
cgroup v2 kernel, each node's containers capped at 0.5 CPU); judged against the cluster
oracle, and beside the simulator's run of the same scenario. Plots, summary.md and the raw
runs (testbed.json) in DIR (default bench/cluster/results/testbed).

    python -m bench.cluster.testbed [--quick] [--out DIR]     # boots the guest: ~40 min
    python -m bench.cluster.testbed --report [--out DIR]      # again from DIR/testbed.json

The scenario is the paper's cluster one scaled to the testbed: 12 single-replica services
of three models (15, 30 or 60 ms of CPU per request: the inference server of
lab/guest/infer.c), each with a target at a random ratio to its latency at the even share
Swarm's spread gives (the paper's ratios), arriving at random in the first 120 s; each way
then runs 420 s more. Every way is measured alike, by an observer on each node that reads
every task's ring and cgroup itself (node_observer.py), every 5 s. The oracle counts each
service's work per request as measured over the runs (the emulated CPU's speed is not the
host's), with the model of bench/cluster/oracle.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.experiments.real import daemon_args
from bench.experiments.scenarios import RANDOM_RATIOS, REAL_PARAMS
from bench.experiments.sim import Container, Curve
from dqoes_cg.cluster.placement import PlacementParams
from dqoes_cg.engines.volume_driver import VOLUMES_DIR
from dqoes_cg.policy import DEFAULT_POLICY

from .oracle import cluster_oracle
from .run import ClusterRun, Moved
from .scenarios import ClusterScenario
from .sim import WAYS

if TYPE_CHECKING:
    from lab.swarm import Node, Swarm
    from lab.swarm_cluster import ClusterDaemons

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "testbed"
COMMAND = "python -m bench.cluster.testbed"
RAW = "testbed.json"
WINDOW_S = 5.0
MODELS_MS = {"s": 15.0, "m": 30.0, "l": 60.0}  # CPU per request, by model
SETTLE_S = 30.0  # the manager's --settle: stuck this long before a move
MIN_REQUESTS = 3  # a window's work per request is counted from this many requests
PARAMS = replace(REAL_PARAMS, policy=DEFAULT_POLICY)  # each node's dqoesd
GUEST_TIMEOUT_S = 90 * 60


@dataclass(frozen=True)
class Size:
    services: int
    arrivals_s: float  # they arrive in [0, arrivals_s]
    after_s: float  # the run goes on this long after the last arrival


FULL = Size(12, 120.0, 420.0)
QUICK = Size(3, 10.0, 120.0)


def scaled_scenario(quick: bool = False, seed: int = 4) -> ClusterScenario:
    """The services, their models' nominal work and targets, and when they arrive."""
    from lab.swarm import THREE_NODES

    size = QUICK if quick else FULL
    cpus = tuple(spec.cpus for spec in THREE_NODES)
    even = sum(cpus) / size.services  # Swarm spreads them: an even share of a node each
    rng = np.random.default_rng(seed)
    models = rng.choice(list(MODELS_MS), size.services)
    ratios = rng.uniform(*RANDOM_RATIOS, size.services)
    times = np.sort(rng.uniform(0, size.arrivals_s, size.services)).round()
    times -= times.min()
    containers = tuple(
        Container(f"{m}{i:02d}", str(m), MODELS_MS[m] / 1e3 / even * r, float(t))
        for i, (m, r, t) in enumerate(zip(models, ratios, times, strict=True)))
    return ClusterScenario(
        "c2-testbed", f"3 Swarm nodes of 0.5 CPU, {size.services} services of 3 models, random "
        f"targets and arrivals in [0, {size.arrivals_s:.0f} s]", cpus, containers,
        float(times.max()) + size.after_s, PARAMS)


# -- in the guest: the Swarm, the daemons and the three ways -----------------------------


class NodeObserver:
    """node_observer.py as a process of `node`; its lines, collected as they come."""

    def __init__(self, node: Node, volumes: Path) -> None:
        self.lines: list[dict[str, Any]] = []
        self.process = node.spawn(
            [sys.executable, "-m", "bench.cluster.node_observer", "--engine-socket",
             str(node.socket), "--volumes", str(volumes), "--window", str(WINDOW_S)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def stop(self) -> list[dict[str, Any]]:
        self.process.kill()
        self.process.wait()
        self._reader.join(timeout=60)
        return self.lines


def run_testbed(swarm: Swarm, sc: ClusterScenario, infer: Path, ways: list[str],
                raw: Path | None = None) -> list[ClusterRun]:
    """Every way on the Swarm, one after the other, under daemons of their own; the runs
    into `raw` after each."""
    from lab.swarm_cluster import ClusterDaemons, import_infer, reopen_nodes, wait_volume_driver

    units_per_ms = import_infer(swarm, infer)
    daemons = ClusterDaemons(swarm, daemon_args(sc.params))
    runs: list[ClusterRun] = []
    try:
        wait_volume_driver(swarm)
        daemons.wait("every node reachable", lambda doc: len(doc["nodes"]) == len(
            swarm.nodes) and all(n["reachable"] for n in doc["nodes"]))
        for way in ways:
            runs.append(run_way(swarm, daemons, sc, way, units_per_ms))
            if raw is not None:
                raw.write_text(json.dumps({"units_per_ms": units_per_ms,
                                           "runs": [run.to_json() for run in runs]}) + "\n")
    finally:
        daemons.close()
        reopen_nodes(swarm)  # placement's last pause outlives its manager
    return runs


def run_way(swarm: Swarm, daemons: ClusterDaemons, sc: ClusterScenario, way: str,
            units_per_ms: float) -> ClusterRun:
    """The services arriving on the Swarm, targets set unless `way` is Swarm's default,
    the manager placing them in the placement way; measured on every node."""
    from lab.guest.e2e import VOLUME
    from lab.swarm_cluster import INFER_IMAGE, reopen_nodes

    print(f"testbed: {way}: {len(sc.containers)} services over {sc.duration_s:.0f} s",
          flush=True)
    daemons.stop("manager")
    reopen_nodes(swarm)
    daemons.start_manager(*(["--placement", "qoe", "--settle", str(SETTLE_S)]
                            if way == "placement" else []))
    observers = [NodeObserver(node, daemons.run_dir(node) / VOLUMES_DIR)
                 for node in swarm.nodes]
    pending = sorted(sc.containers, key=lambda c: c.arrival_s)
    created: list[str] = []
    paused: list[tuple[float, list[bool]]] = []
    start = time.monotonic()
    try:
        while (now := time.monotonic() - start) < sc.duration_s:
            while pending and pending[0].arrival_s <= now:
                c = pending.pop(0)
                units = round(units_per_ms * MODELS_MS[c.model])
                labels = [] if way == "default" else [
                    "--label", f"dqoes.target={c.target_s * 1e3:.0f}ms",
                    "--label", "dqoes.metric=mean"]
                swarm.create_service(c.name, INFER_IMAGE, ["/infer", str(units)], options=[
                    *labels, "--mount", VOLUME, "--update-order", "start-first",
                    "--stop-grace-period", "0s"])
                created.append(c.name)
            statuses = swarm.node_status()
            paused.append((time.monotonic() - start, [
                statuses[n.name].availability == "pause" if n.name in statuses else False
                for n in swarm.nodes]))
            wait = WINDOW_S if not pending else pending[0].arrival_s - now
            time.sleep(max(0.0, min(WINDOW_S, wait)))
    finally:
        observed = [observer.stop() for observer in observers]
        if created:
            swarm.remove_service(*created)
    run = assemble(sc, way, start, observed, paused)
    print(f"testbed: {way}: {int(run.satisfied()[-1])} in S at the end, "
          f"{len(run.moves)} moves", flush=True)
    return run


def assemble(sc: ClusterScenario, way: str, start: float,
             observed: list[list[dict[str, Any]]],
             paused: list[tuple[float, list[bool]]]) -> ClusterRun:
    """The nodes' observations (by node, as node_observer.py prints them; times on the
    monotonic clock, `start` the first arrival) window by window: each service's latency
    where its newest task runs, the node that task is on, the moves between nodes."""
    names = [c.name for c in sc.containers]
    index = {name: i for i, name in enumerate(names)}
    n, windows = len(names), int(sc.duration_s // WINDOW_S)
    t = WINDOW_S * np.arange(1, windows + 1)
    latency = np.full((windows, n), np.nan)
    node = np.full((windows, n), -1)
    newest = np.full((windows, n), -np.inf)
    works: list[list[float]] = [[] for _ in names]
    for j, lines in enumerate(observed):
        for line in lines:
            k = math.ceil((line["t"] - start) / WINDOW_S) - 1
            for task in line["tasks"]:
                i = index.get(task["service"])
                if i is None or not 0 <= k < windows or task["created"] < newest[k, i]:
                    continue
                newest[k, i], node[k, i] = task["created"], j
                if task["latency_s"] is not None:
                    latency[k, i] = task["latency_s"]
                    if task["requests"] >= MIN_REQUESTS and task["usage_cores"] > 0:
                        works[i].append(task["latency_s"] * task["usage_cores"])
    moves = []
    for i in range(n):  # a window without a report keeps the node it was on
        for k in range(1, windows):
            if node[k, i] < 0:
                node[k, i] = node[k - 1, i]
            elif 0 <= node[k - 1, i] != node[k, i]:
                moves.append(Moved(float(t[k]), names[i], f"node{node[k - 1, i] + 1}",
                                   f"node{node[k, i] + 1}"))
    at = np.array([when for when, _ in paused] or [0.0])
    rows = np.array([row for _, row in paused] or [[False] * len(sc.cpus)])
    paused_at = rows[np.clip(np.searchsorted(at, t, side="right") - 1, 0, len(rows) - 1)]
    return ClusterRun(way, None if way == "default" else PARAMS.policy, "testbed",
                      list(sc.cpus), list(sc.containers), t, latency, node, paused_at,
                      sorted(moves, key=lambda m: m.at_s), {"work_s": works})


# -- on the host: the guest, the oracle, the simulator beside it, the report --------------


def measured_curves(sc: ClusterScenario, runs: list[ClusterRun],
                    ) -> tuple[list[Container], dict[str, Curve]]:
    """The services as their own models, each with its work per request as measured over
    every run (the median; the nominal work where none was measured)."""
    containers, curves = [], {}
    for i, c in enumerate(sc.containers):
        works = [w for run in runs for w in run.notes["work_s"][i]]
        work = float(np.median(works)) if works else MODELS_MS[c.model] / 1e3
        containers.append(replace(c, model=c.name))
        curves[c.name] = Curve(work)
    return containers, curves


def report(out: Path, quick: bool) -> None:
    from . import report as plots
    from .__main__ import simulate_ways, spread_oracle

    sc = scaled_scenario(quick)
    runs = [ClusterRun.from_json(doc)
            for doc in json.loads((out / RAW).read_text())["runs"]]
    containers, curves = measured_curves(sc, runs)
    measured = replace(sc, containers=tuple(containers))
    runs = [replace(run, containers=containers) for run in runs]
    oracle = cluster_oracle(containers, sc.cpus, curves).satisfied
    default = next((run for run in runs if run.way == "default"), None)
    spread = spread_oracle(default, curves) if default else oracle
    placement = PlacementParams(settle_s=SETTLE_S)
    simulated = simulate_ways(measured, curves, [PARAMS.policy], placement, WINDOW_S)
    plots.write(out, [
        plots.Judged(sc.key, sc.title, "real: three dockerd in one qemu guest (TCG)", runs,
                     oracle, spread, None, COMMAND),
        plots.Judged(f"{sc.key}-sim", sc.title, "the same services simulated "
                     "(bench/cluster/sim.py) with their measured work", simulated, oracle,
                     spread_oracle(simulated[0], curves), None, COMMAND)])


def in_guest(out: Path, quick: bool, ways: list[str]) -> None:
    """Boot the swarm guest and run every way in it, the inference server built here."""
    from lab.guest.systemd_guest import build_infer

    def args(shared: Path) -> list[str]:
        env = build_infer(shared)
        return ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m",
                "bench.cluster.testbed", "--run-here", str(shared / RAW), "--ways",
                ",".join(ways), *(["--quick"] if quick else [])]

    in_swarm_guest(out, RAW, args, GUEST_TIMEOUT_S, "testbed")


def in_swarm_guest(out: Path, raw_name: str, command: Callable[[Path], list[str]],
                   timeout_s: float, what: str) -> None:
    """Boot the swarm guest and run `command(shared)` in it, which writes its runs into
    shared/raw_name (shared: a directory the guest may write); those copied into `out`,
    also after a failure that left some."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dqoes-testbed-") as name:
        shared = Path(name)
        raw = shared / raw_name
        status = subprocess.run([sys.executable, "-m", "lab.guest", "--swarm", "--timeout",
                                 str(timeout_s), "--writable", str(shared), "--",
                                 *command(shared)], cwd=ROOT, check=False).returncode
        if not raw.exists():
            raise RuntimeError(f"the {what} run in the guest failed (status {status})")
        (out / raw_name).write_text(raw.read_text())
        if status != 0:
            print(f"{what}: the guest ended with status {status}; its runs so far are in "
                  f"{out / raw_name}", file=sys.stderr)


def testbed_parser(command: str, doc: str | None, results: Path, raw_name: str,
                   ways: Sequence[str], quick: str) -> argparse.ArgumentParser:
    """The options a testbed run in the swarm guest takes (`quick`: what --quick does)."""
    p = argparse.ArgumentParser(prog=command, description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=results)
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--ways", default=",".join(ways), help="default: %(default)s")
    p.add_argument("--report", action="store_true", help="only the report, from DIR/" + raw_name)
    p.add_argument("--run-here", type=Path, metavar="RAW",
                   help="run the ways here (in the swarm guest), the runs into RAW")
    return p


def chosen_ways(p: argparse.ArgumentParser, text: str, ways: Sequence[str]) -> list[str]:
    """The ways named in `text` (comma-separated), each one of `ways`."""
    chosen = [way for way in text.split(",") if way]
    if not chosen or set(chosen) - set(ways):
        p.error(f"ways: some of {', '.join(ways)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    p = testbed_parser(COMMAND, __doc__, RESULTS, RAW, WAYS, "3 services, short (a smoke test)")
    args = p.parse_args(argv)
    ways = chosen_ways(p, args.ways, WAYS)
    if args.run_here:
        from lab.guest.e2e import artifacts
        from lab.swarm import THREE_NODES, Swarm

        swarm = Swarm(THREE_NODES).up()
        try:
            run_testbed(swarm, scaled_scenario(args.quick),
                        artifacts(args.run_here.parent).infer, ways, args.run_here)
        finally:
            swarm.down()
        return 0
    out = args.out.resolve()
    if not args.report:
        in_guest(out, args.quick, ways)
    report(out, args.quick)
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
