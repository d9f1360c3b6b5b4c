"""python -m bench.cluster.pipeline_testbed: a five-stage pipeline for real on the swarm
guest's three-node Docker Swarm (lab/pipeline_swarm.py: stage services over an overlay
network, requests answered end to end), under an open-loop load that steps up and down and
a CPU hog on every node at a level changed at random (lab/injector.py), three ways:

- `dqoes`: one replica a stage, the pipeline's end-to-end target on its labels; each node's
  dqoesd holds its stages to their shares of it and the manager's model-based scaler scales
  and moves them;
- `fixed`: an over-provisioned fixed deployment, FIXED_REPLICAS a stage, no dqoes-cg;
- `default`: Swarm's default, one replica a stage, no dqoes-cg.

The target is set from the pipeline itself, as a user would from what it does: TARGET_FACTOR
times its mean end-to-end latency under a light load (CALIBRATION) with no hog, measured
first on Swarm's default deployment. Each way is judged alike, by the load generator's
requests timed end to end: a window holds when the mean latency of the requests that
arrived in it is within the target (a failed request counts as endless); replicas are
counted from Swarm's running tasks every SAMPLE_S. The windows of the first SETTLE_S are not judged.

    python -m bench.cluster.pipeline_testbed [--quick] [--out DIR]   # boots the guest
    python -m bench.cluster.pipeline_testbed --report [--out DIR]    # again from DIR/RAW
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.experiments.real import daemon_args

from .testbed import PARAMS, chosen_ways, in_swarm_guest, testbed_parser

if TYPE_CHECKING:
    from lab.pipeline_swarm import PipelineFlow
    from lab.swarm import Swarm
    from lab.swarm_cluster import ClusterDaemons

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "pipeline-testbed"
COMMAND = "python -m bench.cluster.pipeline_testbed"
RAW = "pipeline-testbed.json"
GUEST_TIMEOUT_S = 100 * 60
# Each stage's work: lab.workload's "tiny" network, about 80 ms of the emulated CPU a
# request (the stages' "micro", 15 ms, left the nodes idle at any rate the load generator
# keeps up with: the experiment would not be about CPU).
MODEL = "tiny"
CALIBRATION = "60:0.5"  # the light load the target is set from (SECONDS:RATE)
TARGET_FACTOR = 4.0  # the end-to-end target (mean): this times the calibration's mean
FIXED_REPLICAS = 2  # 10 stage tasks (15 took the three engines past 10 minutes to start)
SAMPLE_S = 5.0  # how often the running replicas are counted
WINDOW_S = 20.0
SETTLE_S = 120.0
MEAN_HOLD_S = 90.0  # a hog level's mean time before the next
WAYS = ("dqoes", "fixed", "default")


@dataclass(frozen=True)
class Size:
    phases: tuple[str, ...]  # the load's, SECONDS:RATE each (lab.pipeline_load --phase)

    @property
    def duration_s(self) -> float:
        return sum(float(phase.split(":")[0]) for phase in self.phases)


FULL = Size(("150:0.5", "300:1.2", "150:0.5"))
QUICK = Size(("60:0.5", "60:1.2"))


def nodes() -> tuple[Any, ...]:
    """The testbed's nodes: CPU budgets of their own (heterogeneity, as Darly measured)."""
    from lab.swarm import NodeSpec

    return (NodeSpec("node1", 0.5, manager=True), NodeSpec("node2", 0.75),
            NodeSpec("node3", 0.5))


# -- in the guest: the Swarm, the daemons and the three ways -------------------------------


class ReplicaSampler:
    """Counts each stage's running replicas by node every SAMPLE_S, and keeps the manager's
    view of the pipelines (its split, each stage's work and rate) every WINDOW_S, in a
    thread."""

    def __init__(self, swarm: Swarm, stages: tuple[str, ...],
                 view: Callable[[], dict[str, Any] | None]) -> None:
        self.samples: list[tuple[float, dict[str, dict[str, int]]]] = []
        self.views: list[tuple[float, list[dict[str, Any]]]] = []
        self._swarm, self._stages, self._view = swarm, stages, view
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(SAMPLE_S):
            try:
                counts = {stage: {node: len(tasks) for node, tasks in
                                  self._swarm.running_tasks(stage).items() if tasks}
                          for stage in self._stages}
            except (OSError, RuntimeError) as e:  # a busy engine: the next sample will do
                print(f"pipeline testbed: replicas not counted: {e}"[:200], flush=True)
                continue
            self.samples.append((time.time(), counts))
            if len(self.samples) % round(WINDOW_S / SAMPLE_S) == 0:
                doc = self._view()
                if doc is not None:
                    self.views.append((time.time(), doc.get("pipelines", [])))

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=120)


def run_way(swarm: Swarm, flow: PipelineFlow, daemons: ClusterDaemons, way: str,
            target_s: float, size: Size, out_dir: Path, seed: int) -> dict[str, Any]:
    """One way under the load and the hogs (each node's schedule seeded alike for every
    way); what was measured, raw."""
    from lab.injector import DockerHog, Injector, hog_schedule

    print(f"pipeline testbed: {way}", flush=True)
    manager_log = daemons.log("manager")
    logged = manager_log.stat().st_size
    flow.create_stages(f"{target_s:g}s" if way == "dqoes" else None,
                       replicas=FIXED_REPLICAS if way == "fixed" else 1)
    sampler = ReplicaSampler(swarm, flow.stages, daemons.status)
    injectors = {node.name: Injector(DockerHog(node.docker, node.cpus),
                                     hog_schedule(size.duration_s + 300, MEAN_HOLD_S,
                                                  seed * 10 + i))
                 for i, node in enumerate(swarm.nodes)}
    started = time.time()
    for injector in injectors.values():
        injector.start()
    try:
        load = flow.run_load(out_dir, *size.phases, seed=seed)
    finally:
        for injector in injectors.values():
            injector.stop()
        sampler.stop()
        table = daemons.table() if way == "dqoes" else ""
        flow.remove_stages()
    with manager_log.open(errors="replace") as log:
        log.seek(logged)
        actions = [line.rstrip() for line in log if "scaling" in line or "moving" in line]
    print(f"pipeline testbed: {way}: " + json.dumps(
        {k: v for k, v in load.items() if k != "outcomes"}), flush=True)
    if table:
        print(table, flush=True)
    return {"way": way, "target_s": target_s, "phases": list(size.phases), "load": load,
            "replicas": sampler.samples, "views": sampler.views, "actions": actions,
            "manager_table": table,
            "hogs": {name: {"start_unix": started, "changes": injector.changes,
                            "errors": injector.errors}
                     for name, injector in injectors.items()}}


def calibrate(flow: PipelineFlow, out_dir: Path, seed: int) -> dict[str, Any]:
    """The light load on Swarm's default deployment, no hog: its summary."""
    flow.create_stages(None)
    try:
        load = flow.run_load(out_dir, CALIBRATION, seed=seed)
    finally:
        flow.remove_stages()
    summary = {k: v for k, v in load.items() if k != "outcomes"}
    print("pipeline testbed: calibration: " + json.dumps(summary), flush=True)
    return summary


def run_testbed(swarm: Swarm, size: Size, ways: list[str], raw: Path, seed: int) -> None:
    """The calibration, then every way on the Swarm, one after the other; the runs into
    `raw` after each."""
    from lab.pipeline_swarm import PipelineFlow
    from lab.swarm_cluster import ClusterDaemons, wait_volume_driver

    daemons = ClusterDaemons(swarm, daemon_args(PARAMS))  # as the cluster testbed's
    runs: list[dict[str, Any]] = []
    try:
        wait_volume_driver(swarm)
        flow = PipelineFlow(swarm, model=MODEL)
        try:
            calibration = calibrate(flow, raw.parent, seed)
            target_s = round(TARGET_FACTOR * calibration["e2e_mean_s"], 1)
            for way in ways:
                runs.append(run_way(swarm, flow, daemons, way, target_s, size, raw.parent, seed))
                raw.write_text(json.dumps({"nodes": {n.name: n.cpus for n in swarm.nodes},
                                           "calibration": calibration, "runs": runs}) + "\n")
        finally:
            flow.remove()
    finally:
        daemons.close()


# -- on the host: the guest, the figures, the report ---------------------------------------


@dataclass(frozen=True)
class Judged:
    """One way's figures."""

    way: str
    windows: list[float]  # each window's start, seconds from the load's start
    latency_s: list[float]  # its requests' mean end-to-end latency (inf: one failed)
    replicas: list[float]  # its mean running replicas, all stages
    nodes: list[float]  # its mean nodes running a stage
    held: float  # share of the judged windows within the target
    violations: int  # judged windows past it
    judged: int
    replica_s: float  # replica-seconds over the load
    reactions: list[dict[str, Any]]  # a hog raised: windows until the pipeline held again

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def judge(run: dict[str, Any]) -> Judged:
    """A way's raw measures in windows of WINDOW_S from the load's start."""
    load, target = run["load"], run["target_s"]
    start = load["start_unix"]
    duration = sum(float(phase.split(":")[0]) for phase in run["phases"])
    edges = np.arange(0.0, duration, WINDOW_S)
    latency = []
    for lo in edges:
        inside = [o for o in load["outcomes"] if lo <= o[0] < lo + WINDOW_S]
        if not inside:
            latency.append(math.nan)
        else:
            latency.append(math.inf if any(o[3] for o in inside)
                           else float(np.mean([o[1] for o in inside])))
    times = np.array([t - start for t, _ in run["replicas"]])
    total = np.array([sum(sum(by.values()) for by in counts.values())
                      for _, counts in run["replicas"]], dtype=float)
    used = np.array([len({n for by in counts.values() for n in by})
                     for _, counts in run["replicas"]], dtype=float)
    in_load = (times >= 0) & (times < duration)
    replicas, nodes_used = [], []
    for lo in edges:
        mask = (times >= lo) & (times < lo + WINDOW_S)
        replicas.append(float(total[mask].mean()) if mask.any() else math.nan)
        nodes_used.append(float(used[mask].mean()) if mask.any() else math.nan)
    judged = [(lo, x) for lo, x in zip(edges, latency, strict=True)
              if lo >= SETTLE_S and not math.isnan(x)]
    violations = sum(1 for _, x in judged if x > target)
    return Judged(run["way"], edges.tolist(), latency, replicas, nodes_used,
                  1.0 - violations / len(judged) if judged else math.nan, violations,
                  len(judged), float(total[in_load].mean() * duration) if in_load.any()
                  else math.nan, reactions(run, edges, latency))


def reactions(run: dict[str, Any], edges: np.ndarray, latency: list[float]
              ) -> list[dict[str, Any]]:
    """For each hog raised during the load: the windows from the one it fell in until one
    held the target (0: that one held; None: none did before the load's end)."""
    out = []
    offset = run["load"]["start_unix"]
    for node, hog in run["hogs"].items():
        before = 0.0
        for at, level in hog["changes"]:
            at_s = hog["start_unix"] + at - offset
            raised, before = level > before, level
            if not raised or not 0 <= at_s < edges[-1] + WINDOW_S:
                continue
            first = int(at_s // WINDOW_S)
            held = next((i - first for i in range(first, len(edges))
                         if latency[i] <= run["target_s"]), None)
            out.append({"at_s": round(at_s, 1), "node": node, "level": level,
                        "windows_to_hold": held})
    return sorted(out, key=lambda r: r["at_s"])


def markdown(judged: list[Judged], raw: dict[str, Any], quick: bool) -> str:
    nodes_text = ", ".join(f"{n} {c:g}" for n, c in raw["nodes"].items())
    run = raw["runs"][0]
    lines = [
        "# A five-stage pipeline on the three-node testbed",
        "",
        f"`{COMMAND}{' --quick' if quick else ''}`: the swarm guest's Swarm (three dockerd "
        f"in one qemu guest, TCG; node CPU budgets {nodes_text}), the lab pipeline's five "
        f"stages as a chain, each doing lab.workload's `{MODEL}` network; open-loop Poisson "
        f"load {', '.join(run['phases'])} "
        f"(SECONDS:RATE per phase); a CPU hog on every node at 0/25/50/75% of its budget, "
        f"changed at random (mean hold {MEAN_HOLD_S:g} s, the same schedules for every way); "
        f"end-to-end target {run['target_s']:g} s (mean): {TARGET_FACTOR:g} times the "
        f"{raw['calibration']['e2e_mean_s']:.2f} s the default deployment answered in at "
        f"{CALIBRATION} with no hog. Windows of {WINDOW_S:g} s, judged after the first "
        f"{SETTLE_S:g} s. The scaler's actions: "
        + ", ".join(f"{r['way']} {sum('scaler:' in a for a in r.get('actions', []))}"
                    for r in raw["runs"]) + ".",
        "",
        "| way | windows held | violations (of judged) | replica-seconds | replicas, median "
        "(max) | nodes, median | e2e mean, median window | reactions to a hog raised: "
        "windows to hold, median (max; never) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for j in judged:
        finite = [x for x in j.latency_s if math.isfinite(x)]
        waits = [r["windows_to_hold"] for r in j.reactions if r["windows_to_hold"] is not None]
        never = sum(1 for r in j.reactions if r["windows_to_hold"] is None)
        lines.append(
            f"| {j.way} | {100 * j.held:.0f}% | {j.violations} of {j.judged} | "
            f"{j.replica_s:,.0f} | {np.nanmedian(j.replicas):.0f} ({np.nanmax(j.replicas):.0f})"
            f" | {np.nanmedian(j.nodes):.0f} | "
            f"{np.median(finite) if finite else math.nan:.2f} s | "
            f"{np.median(waits) if waits else math.nan:.0f} "
            f"({max(waits) if waits else math.nan}; {never}) of {len(j.reactions)} |")
    for r in raw["runs"]:
        if r["manager_table"]:
            lines += ["", f"The manager's view at the end of the `{r['way']}` way:", "",
                      "```", r["manager_table"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def plot(judged: list[Judged], raw: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, rep) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for j in judged:
        x = np.array(j.windows) + WINDOW_S / 2
        y = np.array([min(v, 1e3) for v in j.latency_s])
        lat.plot(x, y, marker=".", label=f"{j.way} ({100 * j.held:.0f}% held)")
        rep.plot(x, j.replicas, marker=".", label=j.way)
    target = raw["runs"][0]["target_s"]
    lat.axhline(target, color="black", ls=":", lw=1, label="target")
    lat.axvspan(0, SETTLE_S, color="0.92", zorder=0, label="settling, not judged")
    lat.set(yscale="log", ylabel="end-to-end mean latency (s)",
            title="five-stage pipeline on three Swarm nodes, hogs at random")
    lat.legend(fontsize=7)
    rep.set(xlabel="time since the load began (s)", ylabel="running replicas (all stages)")
    rep.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: Path, quick: bool) -> None:
    raw = json.loads((out / RAW).read_text())
    judged = [judge(run) for run in raw["runs"]]
    (out / "summary.md").write_text(markdown(judged, raw, quick))
    (out / "summary.json").write_text(json.dumps([j.to_json() for j in judged], indent=1))
    plot(judged, raw, out / "pipeline-testbed.png")
    print((out / "summary.md").read_text())


def in_guest(out: Path, quick: bool, ways: list[str], seed: int) -> None:
    """Boot the swarm guest and run every way in it."""
    in_swarm_guest(out, RAW, lambda shared: [
        sys.executable, "-m", "bench.cluster.pipeline_testbed", "--run-here", str(shared / RAW),
        "--ways", ",".join(ways), "--seed", str(seed), *(["--quick"] if quick else [])],
        GUEST_TIMEOUT_S, "pipeline testbed")


def main(argv: list[str] | None = None) -> int:
    p = testbed_parser(COMMAND, __doc__, RESULTS, RAW, WAYS, "two short phases (a smoke test)")
    p.add_argument("--seed", type=int, default=1, help="the load's and the hogs' schedules")
    args = p.parse_args(argv)
    ways = chosen_ways(p, args.ways, WAYS)
    size = QUICK if args.quick else FULL
    if args.run_here:
        from lab.images import BUSYBOX
        from lab.swarm import BUSYBOX_IMAGE, Swarm

        swarm = Swarm(nodes()).up(images={BUSYBOX_IMAGE: {"busybox": BUSYBOX}})  # the hogs'
        try:
            run_testbed(swarm, size, ways, args.run_here, args.seed)
        finally:
            swarm.down()
        return 0
    out = args.out.resolve()
    if not args.report:
        in_guest(out, args.quick, ways, args.seed)
    report(out, args.quick)
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
