"""python -m bench.flowcon: FlowCon's single-worker runs (the paper's section 6) in the
simulator (bench/flowcon/sim.py), FlowCon against the default platform (no limits).

    python -m bench.flowcon [--quick] [--out DIR] [--real]

1. The 3-job run: a VAE at 0 s, MNIST (PyTorch) at 40 s, MNIST (TensorFlow) at 80 s; each
   job's CPU share over time, with FlowCon and without (the paper's Figs. 3 and 4).
2. The 10-job run: models drawn from the pool, arrivals at random in [0, 200 s], over
   several seeds; per-job completion times (the paper's Fig. 5) and the makespan.

3. With --real, on a real cgroup v2 kernel (real.py: real training jobs and inference
   services on a one-CPU node; this host if it has the cpu controller on cgroup v2, else a
   qemu guest), into DIR/real.json, about 40 minutes: the 3-job and the 10-job runs
   scaled to it, FlowCon against the default; and the mixed run, two inference services
   with targets beside two training jobs, on the default platform, with dqoesd managing
   the services only, and with dqoesd managing both (the jobs by FlowCon). The summary
   includes DIR/real.json whenever it is there.

Writes summary.md, summary.json, three_jobs.png and ten_jobs.png (and real_three_jobs.png)
to DIR (default bench/flowcon/results). --quick: one seed, short real runs, no plots (the
smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from lab.guest import here_or_in_guest

from .sim import Job, Model, simulate

RESULTS = Path(__file__).resolve().parent / "results"
RUN_TIMEOUT_S = 1200.0  # one real run (a platform of one of the three)
GUEST_TIMEOUT_S = 7 * RUN_TIMEOUT_S
REAL_TEN_SEED = 0
WORKER_CPUS = 1.0
ARRIVALS_S = 200.0  # the 10-job run's arrivals: uniform in [0, ARRIVALS_S]
SEEDS = 10

# The paper's model pool, as loss curves: work alone on the whole worker (s), the work over
# which the loss falls by e, and the share of the worker a job uses alone (its 65-75%).
MODELS: dict[str, Model] = {
    "vae-pytorch": Model(work_s=160.0, tau_s=60.0, demand=0.75),
    "mnist-pytorch": Model(work_s=90.0, tau_s=15.0, demand=0.65),
    "mnist-tensorflow": Model(work_s=110.0, tau_s=25.0, demand=0.9),
    "cifar10-pytorch": Model(work_s=220.0, tau_s=90.0, demand=1.0),
    "lstm-tensorflow": Model(work_s=140.0, tau_s=40.0, demand=0.8),
}
THREE_JOBS = [Job("Job-1", "vae-pytorch", 0.0), Job("Job-2", "mnist-pytorch", 40.0),
              Job("Job-3", "mnist-tensorflow", 80.0)]


def ten_jobs(seed: int) -> list[Job]:
    """Ten jobs of models drawn from the pool, arriving at random in [0, ARRIVALS_S]."""
    rng = np.random.default_rng(seed)
    names = sorted(MODELS)
    arrivals = np.sort(rng.uniform(0.0, ARRIVALS_S, 10))
    return [Job(f"Job-{i + 1}", names[int(rng.integers(len(names)))], float(a))
            for i, a in enumerate(arrivals)]


def compare(jobs: list[Job]) -> dict[str, Any]:
    """Both platforms on `jobs`: completion times, makespans and their changes."""
    default, flowcon = (simulate(jobs, MODELS, WORKER_CPUS, flowcon=f) for f in (False, True))
    change = (flowcon.completion_s - default.completion_s) / default.completion_s
    return {
        "jobs": [{"name": j.name, "model": j.model, "arrival_s": j.arrival_s,
                  "default_s": float(d), "flowcon_s": float(f), "change": float(c)}
                 for j, d, f, c in zip(jobs, default.completion_s, flowcon.completion_s,
                                       change, strict=True)],
        "faster": int(np.count_nonzero(change < 0)),
        "best_change": float(change.min()),
        "mean_completion_default_s": float(default.completion_s.mean()),
        "mean_completion_flowcon_s": float(flowcon.completion_s.mean()),
        "makespan_default_s": default.makespan_s,
        "makespan_flowcon_s": flowcon.makespan_s,
        "_runs": (default, flowcon),
    }


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _ratio(new: float, old: float) -> str:
    return _pct(new / old - 1.0)


def summary(three: dict[str, Any], ten: list[dict[str, Any]],
            real: dict[str, Any] | None) -> str:
    lines = ["# FlowCon on one worker, simulated (python -m bench.flowcon)", "",
             f"One worker of {WORKER_CPUS:g} CPU; FlowCon is dqoes_cg.policy.FlowCon with the "
             "daemon's defaults; the default platform sets no limits. Completion time: "
             "finish - arrival. Change: FlowCon against the default (negative: faster).", "",
             "## The 3-job run", "",
             "| job | model | arrival | default | FlowCon | change |", "|---|---|---|---|---|---|"]
    lines += [f"| {j['name']} | {j['model']} | {j['arrival_s']:.0f} s | {j['default_s']:.1f} s "
              f"| {j['flowcon_s']:.1f} s | {_pct(j['change'])} |" for j in three["jobs"]]
    lines += ["", f"Makespan {three['makespan_default_s']:.1f} s (default), "
              f"{three['makespan_flowcon_s']:.1f} s (FlowCon).", "",
              f"## The 10-job run, arrivals in [0, {ARRIVALS_S:.0f} s], {len(ten)} seed(s)", "",
              "| seed | jobs faster | best change | mean completion (default -> FlowCon) "
              "| makespan (default -> FlowCon) |", "|---|---|---|---|---|"]
    for seed, r in enumerate(ten):
        lines.append(
            f"| {seed} | {r['faster']}/10 | {_pct(r['best_change'])} | "
            f"{r['mean_completion_default_s']:.0f} -> {r['mean_completion_flowcon_s']:.0f} s "
            f"({_ratio(r['mean_completion_flowcon_s'], r['mean_completion_default_s'])}) | "
            f"{r['makespan_default_s']:.0f} -> {r['makespan_flowcon_s']:.0f} s "
            f"({_ratio(r['makespan_flowcon_s'], r['makespan_default_s'])}) |")
    mean = [r["mean_completion_flowcon_s"] / r["mean_completion_default_s"] - 1 for r in ten]
    span = [r["makespan_flowcon_s"] / r["makespan_default_s"] - 1 for r in ten]
    lines += ["", f"Median over the seeds: mean completion time {_pct(float(np.median(mean)))}, "
              f"makespan {_pct(float(np.median(span)))}; jobs faster: "
              f"{int(np.median([r['faster'] for r in ten]))}/10.", "",
              "Seed 0, job by job:", "",
              "| job | model | arrival | default | FlowCon | change |", "|---|---|---|---|---|---|"]
    lines += [f"| {j['name']} | {j['model']} | {j['arrival_s']:.0f} s | {j['default_s']:.1f} s "
              f"| {j['flowcon_s']:.1f} s | {_pct(j['change'])} |" for j in ten[0]["jobs"]]
    if real is not None:
        lines += real_jobs_summary("The 3-job run", real, real)
    if real is not None and "ten" in real:
        lines += real_jobs_summary(f"The 10-job run (seed {REAL_TEN_SEED})", real, real["ten"])
    if real is not None and "mixed" in real:
        lines += mixed_summary(real["mixed"])
    return "\n".join(lines) + "\n"


def real_jobs_summary(title: str, real: dict[str, Any], runs: dict[str, Any]) -> list[str]:
    """A real run of jobs only: each job's completion time, default against FlowCon."""
    default, flowcon = runs["default"], runs["flowcon"]
    lines = ["", f"## {title} on a real kernel (python -m bench.flowcon --real)", "",
             f"{real['where']}; a node of {real['node_cpus']:g} CPU, lab.training jobs "
             "(epochs each below), released at their arrival times.", "",
             "| job | model | epochs | arrival | default | FlowCon | change |",
             "|---|---|---|---|---|---|---|"]
    changes = []
    for d, f in zip(default["jobs"], flowcon["jobs"], strict=True):
        changes.append(f["completion_s"] / d["completion_s"] - 1.0)
        lines.append(f"| {d['name']} | {d['model']} | {d['epochs']} | "
                     f"{d['arrival_s']:.0f} s | {d['completion_s']:.1f} s | "
                     f"{f['completion_s']:.1f} s | {_pct(changes[-1])} |")
    mean_d, mean_f = (float(np.mean([j["completion_s"] for j in r["jobs"]]))
                      for r in (default, flowcon))
    lines += ["", f"Jobs faster with FlowCon: {sum(c < 0 for c in changes)} of {len(changes)} "
              f"(best {_pct(min(changes))}); mean completion {mean_d:.1f} s (default), "
              f"{mean_f:.1f} s (FlowCon, {_ratio(mean_f, mean_d)}); makespan "
              f"{default['makespan_s']:.1f} s (default), {flowcon['makespan_s']:.1f} s "
              f"(FlowCon, {_ratio(flowcon['makespan_s'], default['makespan_s'])})."]
    return lines


PLATFORM_TITLES = {"default": "default (no daemon)", "targets": "dqoesd, services only",
                   "flowcon": "dqoesd, services and jobs (FlowCon)"}


def mixed_summary(runs: dict[str, Any]) -> list[str]:
    """The mixed run's tables: the services' |S| and the jobs' completion per platform."""
    services = runs["default"]["services"]
    judged_from = runs["default"]["satisfied"]["from_s"]
    lines = ["", "## Services and training jobs on one node, real kernel", "",
             "Two inference services (lab.workload) with targets and two training jobs "
             "(lab.training), all from the start, on a node of 1 CPU. Each service's target is "
             "a ratio of its latency on the default platform beside the running jobs, measured "
             "first in the same session: " + ", ".join(
                 f"{s['name']} {s['target_s'] * 1e3:.0f} ms" for s in services) + ". The "
             f"services are judged from {judged_from:.0f} s until the first job ends: |S| is "
             "the median over those windows (the least in brackets).", "",
             "| platform | services in S | latency / target, each service | " + " | ".join(
                 j["name"] for j in runs["default"]["jobs"]) + " | makespan |",
             "|---|---|---|" + "---|" * len(runs["default"]["jobs"]) + "---|"]
    for platform, title in PLATFORM_TITLES.items():
        r = runs[platform]
        sat = r["satisfied"]
        ratios = ", ".join(f"{x:.2f}" for x in sat["latency_over_target"])
        jobs = " | ".join(
            f"{j['completion_s']:.1f} s ({_ratio(j['completion_s'], d['completion_s'])})"
            for j, d in zip(r["jobs"], runs["default"]["jobs"], strict=True))
        lines.append(f"| {title} | {sat['median']} of {len(services)} ({sat['least']}) | "
                     f"{ratios} | {jobs} | {r['makespan_s']:.1f} s |")
    return lines


def plot(three: dict[str, Any], ten: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5), sharey=True)
    for ax, run, title in zip(axes, three["_runs"], ("default (no limits)", "FlowCon"),
                              strict=True):
        for i, j in enumerate(three["jobs"]):
            ax.plot(run.t, run.cores[:, i] * 100 / WORKER_CPUS, label=j["name"])
        ax.set(title=title, xlabel="time (s)")
    axes[0].set_ylabel("CPU (% of the worker)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "three_jobs.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3.5))
    x = np.arange(len(ten["jobs"]))
    ax.bar(x - 0.2, [j["default_s"] for j in ten["jobs"]], 0.4, label="default")
    ax.bar(x + 0.2, [j["flowcon_s"] for j in ten["jobs"]], 0.4, label="FlowCon")
    ax.set(xticks=x, xticklabels=[j["name"] for j in ten["jobs"]], ylabel="completion time (s)",
           title="10 jobs arriving in [0, 200 s] (seed 0)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "ten_jobs.png", dpi=120)
    plt.close(fig)


def plot_real(real: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5), sharey=True)
    for ax, key, title in zip(axes, ("default", "flowcon"), ("default (no limits)", "FlowCon"),
                              strict=True):
        run = real[key]
        t = [w["t"] for w in run["windows"]]
        for i, j in enumerate(run["jobs"]):
            ax.plot(t, [w["usage_cores"][i] * 100 / real["node_cpus"] for w in run["windows"]],
                    label=j["name"])
        ax.set(title=f"{title}, real kernel", xlabel="time (s)")
    axes[0].set_ylabel("CPU (% of the node)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "real_three_jobs.png", dpi=120)
    plt.close(fig)


def real_part_somewhere(out: Path, quick: bool) -> int:
    """The real runs here if this kernel can, else in a guest that writes into `out`."""
    return here_or_in_guest(lambda: run_real(out, quick), "the real runs", "bench.flowcon",
                            ["--real-part", "--out", str(out)] + ["--quick"] * quick, out,
                            GUEST_TIMEOUT_S)


def run_real(out: Path, quick: bool) -> None:
    from . import real  # needs the compiled extension and a cgroup v2 kernel

    jobs = real.three_jobs(quick)
    doc: dict[str, Any] = {"where": "qemu guest (real cgroup v2, emulated CPUs)"
                           if "DQOES_GUEST" in os.environ else "this host",
                           "node_cpus": real.NODE_CPUS}
    with tempfile.TemporaryDirectory() as work:
        for key in ("default", "flowcon"):
            doc[key] = real.run(Path(work) / key, jobs, key, RUN_TIMEOUT_S)
            print(f"real run, {key}: makespan {doc[key]['makespan_s']:.1f} s", file=sys.stderr)
        ten = real.ten_jobs(REAL_TEN_SEED, quick)
        doc["ten"] = {key: real.run(Path(work) / f"ten-{key}", ten, key, RUN_TIMEOUT_S)
                      for key in ("default", "flowcon")}
        print("real 10-job run: makespan " + ", ".join(
            f"{k} {r['makespan_s']:.1f} s" for k, r in doc["ten"].items()), file=sys.stderr)
        doc["mixed"] = real.run_mixed(Path(work) / "mixed", quick, RUN_TIMEOUT_S)
        print("real mixed run: |S| " + ", ".join(
            f"{k} {r['satisfied']['median']}" for k, r in doc["mixed"].items()),
            file=sys.stderr)
    (out / "real.json").write_text(json.dumps(doc, indent=1) + "\n")


def _public(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if not k.startswith("_")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flowcon", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="one seed, short real runs, no plots")
    p.add_argument("--real", action="store_true",
                   help="the 3-job, 10-job and mixed runs on a real kernel too")
    p.add_argument("--real-part", action="store_true",
                   help="only the real runs, on this kernel (what the guest runs)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.real_part:
        run_real(args.out, args.quick)
        return 0
    if args.real and real_part_somewhere(args.out, args.quick) != 0:
        print("the real runs failed", file=sys.stderr)
        return 1
    real_path = args.out / "real.json"
    real = json.loads(real_path.read_text()) if real_path.exists() else None
    three = compare(THREE_JOBS)
    ten = [compare(ten_jobs(seed)) for seed in range(1 if args.quick else SEEDS)]
    (args.out / "summary.md").write_text(summary(three, ten, real))
    (args.out / "summary.json").write_text(json.dumps(
        {"three_jobs": _public(three), "ten_jobs": [_public(r) for r in ten]}, indent=1) + "\n")
    if not args.quick:
        plot(three, ten[0], args.out)
        if real is not None:
            plot_real(real, args.out)
    print(f"wrote {args.out}/summary.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

